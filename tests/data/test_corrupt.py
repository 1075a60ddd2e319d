"""SNR noise (fedmlac.md 5.6) and per-client label-error transition matrices (5.7)."""

from __future__ import annotations

import numpy as np
import pytest

from fedac.config import DataConfig
from fedac.data.corrupt import (
    add_white_noise,
    client_matrix,
    corrupt_labels,
    corrupt_training_labels,
    transition_matrix,
)
from fedac.data.manifest import Clip, Manifest
from fedac.data.partition import partition
from fedac.errors import ConfigError


def speechlike(n: int = 32000, seed: int = 0) -> np.ndarray:
    """A tone burst with silences: the power is averaged over the whole clip, silences included."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / 16000
    x = 0.3 * np.sin(2 * np.pi * 220 * t) * (
        np.sin(2 * np.pi * 1.5 * t) > 0
    ) + 0.01 * rng.standard_normal(n)
    return x.astype(np.float32)


@pytest.mark.parametrize("snr_db", [10.0, 20.0, 30.0])
def test_measured_snr_matches_target(snr_db):
    x = speechlike()
    y = add_white_noise(x, snr_db, seed=1, key="clip.wav")
    assert y.dtype == np.float32 and y.shape == x.shape
    noise = y.astype(np.float64) - x
    measured = 10 * np.log10(np.mean(x.astype(np.float64) ** 2) / np.mean(noise**2))
    assert abs(measured - snr_db) < 0.5
    # White: flat spectrum, zero mean, no correlation with the signal.
    assert abs(noise.mean()) < 0.05 * noise.std()
    assert abs(np.corrcoef(noise, x)[0, 1]) < 0.05


def test_noise_is_reproducible_per_key_and_seed():
    x = speechlike()
    a = add_white_noise(x, 20, seed=0, key="a.wav")
    assert np.array_equal(a, add_white_noise(x, 20, seed=0, key="a.wav"))
    assert not np.array_equal(a, add_white_noise(x, 20, seed=0, key="b.wav"))
    assert not np.array_equal(a, add_white_noise(x, 20, seed=1, key="a.wav"))


def test_clean_and_silent_inputs():
    x = speechlike()
    assert add_white_noise(x, 100.0, seed=0, key="k") is x
    assert add_white_noise(x, 120.0, seed=0, key="k") is x
    silent = np.zeros(100, dtype=np.float32)
    # P_s = 0 -> no noise
    assert np.array_equal(add_white_noise(silent, 10, seed=0, key="k"), silent)
    with pytest.raises(ConfigError, match="data.snr_db must be a finite number"):
        add_white_noise(x, float("nan"), seed=0, key="k")


def test_transition_matrix_hand_computed():
    expected = np.array([[0.7, 0.15, 0.15], [0.15, 0.7, 0.15], [0.15, 0.15, 0.7]])
    assert np.allclose(transition_matrix(3, 0.3), expected)
    assert np.allclose(transition_matrix(2, 1.0), [[0, 1], [1, 0]])
    assert np.allclose(transition_matrix(4, 0.0), np.eye(4))
    with pytest.raises(ConfigError, match=r"data.label_error must lie in \[0, 1\], got 1.5"):
        transition_matrix(4, 1.5)
    with pytest.raises(ConfigError, match="data.label_error"):
        corrupt_labels(np.array([0, 1]), 4, -0.1, seed=0, client="c")


@pytest.mark.parametrize("num_classes", [2, 4, 10, 35])
def test_random_spread_is_per_client_and_row_stochastic(num_classes):
    a = client_matrix(num_classes, 0.3, seed=0, client="alice", spread="random")
    b = client_matrix(num_classes, 0.3, seed=0, client="bob", spread="random")
    for m in (a, b):
        assert np.allclose(m.sum(axis=1), 1.0) and (m >= 0).all()
        assert np.allclose(np.diag(m), 0.7)
    assert np.array_equal(
        a, client_matrix(num_classes, 0.3, seed=0, client="alice", spread="random")
    )
    if num_classes > 2:
        assert not np.allclose(a, b)
    with pytest.raises(ConfigError, match="spread must be one of uniform, random"):
        client_matrix(num_classes, 0.3, seed=0, client="alice", spread="skewed")


@pytest.mark.parametrize("num_classes", [4, 10, 35])
@pytest.mark.parametrize("error_rate", [0.1, 0.3, 0.5])
@pytest.mark.parametrize("spread", ["uniform", "random"])
def test_empirical_flip_rate(num_classes, error_rate, spread):
    rng = np.random.default_rng(7)
    labels = rng.integers(0, num_classes, size=40000)
    noisy = corrupt_labels(
        labels, num_classes, error_rate, seed=0, client=f"c{num_classes}", spread=spread
    )
    assert noisy.dtype == labels.dtype and noisy.min() >= 0 and noisy.max() < num_classes
    # Overall and per-class flip rates are e (binomial std <= 0.0025 overall).
    assert abs(np.mean(noisy != labels) - error_rate) < 0.015
    per_class = [np.mean(noisy[labels == c] != c) for c in range(num_classes)]
    assert max(abs(r - error_rate) for r in per_class) < 0.07
    if spread == "uniform":
        # Flipped labels are spread evenly: each wrong class gets about e / (C - 1) of a class's
        # clips.
        confusion = np.zeros((num_classes, num_classes))
        np.add.at(confusion, (labels, noisy), 1)
        off = (confusion / confusion.sum(axis=1, keepdims=True))[~np.eye(num_classes, dtype=bool)]
        assert abs(off.mean() - error_rate / (num_classes - 1)) < 0.005


def test_label_draws_are_per_client_and_reproducible():
    labels = np.arange(1000) % 10
    a = corrupt_labels(labels, 10, 0.3, seed=0, client="alice")
    assert np.array_equal(a, corrupt_labels(labels, 10, 0.3, seed=0, client="alice"))
    assert not np.array_equal(a, corrupt_labels(labels, 10, 0.3, seed=0, client="bob"))
    assert not np.array_equal(a, corrupt_labels(labels, 10, 0.3, seed=1, client="alice"))
    assert np.array_equal(corrupt_labels(labels, 10, 0.0, seed=0, client="alice"), labels)
    with pytest.raises(ValueError, match="labels of client alice must lie in"):
        corrupt_labels(np.array([0, 10]), 10, 0.3, seed=0, client="alice")


def test_only_training_labels_change():
    splits = ("train", "train", "train", "val", "test")
    clips = [Clip(f"/x/{i}.wav", i % 4, f"spk{i % 7}", splits[i % 5]) for i in range(700)]
    manifest = Manifest("toy", "/x", ["a", "b", "c", "d"], clips)
    clients = partition(manifest, DataConfig(local_holdout=0.25), seed=0)
    noisy = corrupt_training_labels(manifest, clients, error_rate=0.5, seed=0)
    truth = np.array([c.label for c in clips])
    train = sorted(i for c in clients for i in c.train)
    untouched = np.setdiff1d(np.arange(len(clips)), train)
    assert {clips[i].split for i in untouched} >= {"val", "test"}
    assert any(i in c.holdout for c in clients for i in untouched)  # local hold-outs stay clean
    assert np.array_equal(noisy[untouched], truth[untouched])
    assert 0.4 < np.mean(noisy[train] != truth[train]) < 0.6
    # Each client's flips are its own per-client draw.
    first = clients[0]
    assert np.array_equal(
        noisy[first.train], corrupt_labels(truth[first.train], 4, 0.5, seed=0, client=first.name)
    )
