"""FedKWS-UI's augmentation (data/augment.py): time shift, background noise and SpecAugment by their
definitions, `features.augment` deterministic per seed and resume-exact, `features.test_augment`
fixed per clip with the clean test set reported beside it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedac.config import load_config
from fedac.data.augment import AugmentedWindows, noise_bank, shift_and_noise, spec_augment
from fedac.engine.data import build_federated_data
from fedac.engine.simulator import Simulator
from fedac.errors import ConfigError, DatasetError
from helpers import tiny_run

pytestmark = pytest.mark.usefixtures("one_thread")
RATE = 8000


def test_shift_is_a_crop_of_the_zero_padded_clip_within_100_ms():
    ramp = torch.arange(1, RATE + 1, dtype=torch.float32).repeat(300, 1)
    silent = (np.zeros(2 * RATE, np.float32),)
    out = shift_and_noise(ramp, silent, RATE, torch.Generator().manual_seed(0))
    padded = torch.nn.functional.pad(ramp[0], (800, 800))
    offsets = []
    for row in out:  # every row is padded[s : s + 8000] for one s in [0, 1600]
        first = int(row[row > 0][0]) if (row > 0).any() else None
        s = 800 - int(torch.nonzero(row)[0]) if first == 1 else 800 + first - 1
        assert torch.equal(row, padded[s : s + RATE])
        offsets.append(s)
    assert min(offsets) >= 0 and max(offsets) <= 1600 and len(set(offsets)) > 100


def test_noise_is_mixed_with_probability_0_8_and_volume_at_most_0_1():
    ones = (np.ones(3 * RATE, np.float32),)
    out = shift_and_noise(torch.zeros(2000, RATE), ones, RATE, torch.Generator().manual_seed(1))
    added = out[:, 900:7100]  # away from the shifted-in padding: the volume alone
    volume = added[:, 0]
    assert torch.allclose(added, volume[:, None].expand_as(added))
    mixed = volume > 0
    assert 0.77 < float(mixed.float().mean()) < 0.83  # p = 0.8 over 2,000 clips
    assert float(volume.max()) <= 0.1 and float(volume[mixed].mean()) == pytest.approx(
        0.05, abs=0.003
    )  # U(0, 0.1)


def test_spec_augment_masks_one_band_and_one_span():
    x = torch.ones(500, 40, 101)
    out = spec_augment(x, torch.Generator().manual_seed(0))
    freq_widths, time_widths = [], []
    for item in out:
        rows = torch.nonzero((item == 0).all(dim=1)).flatten()  # fully masked coefficients
        cols = torch.nonzero((item == 0).all(dim=0)).flatten()  # fully masked frames
        for idx in (rows, cols):  # one contiguous mask each
            assert len(idx) == 0 or int(idx[-1] - idx[0]) + 1 == len(idx)
        freq_widths.append(len(rows))
        time_widths.append(len(cols))
        assert int((item == 0).sum()) == len(rows) * 101 + len(cols) * 40 - len(rows) * len(cols)
    # torchaudio's FrequencyMasking(5) / TimeMasking(10): [int(a), int(a + w)) with w = U * 5 (10):
    # 0 to 5 (10) wide
    assert sorted(set(freq_widths)) == list(range(6)) and sorted(set(time_widths)) == list(
        range(11)
    )


def test_missing_noise_folder_is_a_typed_error(tmp_path):
    with pytest.raises(
        DatasetError,
        match=(
            r"_background_noise_ holds no .wav files; add the dataset's noise files or set "
            r"features.augment=false"
        ),
    ):
        noise_bank(str(tmp_path), RATE)


@pytest.fixture(scope="module")
def settings(gsc_root):
    return {
        **tiny_run(gsc_root, None),
        "algorithm": "fedavg",
        "train.rounds": 2,
        "train.local_epochs": 1,
        "data.task": 12,
        "data.gsc12": "fedkws",
        "features.style": "fedkws",
        "features.augment": True,
    }


def config(settings, **extra):
    return load_config(overrides=[f"{k}={v}" for k, v in {**settings, **extra}.items()])


def test_training_windows_are_augmented_afresh_and_reproducibly(settings):
    data = build_federated_data(config(settings), progress=False)
    client = next(c for c in data.clients if c.num_samples)
    assert isinstance(client.x, AugmentedWindows) and client.x.shape[1:] == data.test.x.shape[1:]
    idx = torch.arange(min(4, client.num_samples))
    torch.manual_seed(3)
    a, b = client.x[idx], client.x[idx]
    torch.manual_seed(3)
    # new draws per batch, fixed by the RNG state
    assert not torch.equal(a, b) and torch.equal(a, client.x[idx])
    plain = build_federated_data(config(settings, **{"features.augment": False}), progress=False)
    assert isinstance(plain.clients[0].x, torch.Tensor)


@pytest.mark.slow
def test_augmented_run_is_resume_exact_and_differs_from_a_clean_one(settings, tmp_path):
    cfg = config(settings)
    full = Simulator(cfg, tmp_path / "full", progress=False)
    full.run()
    # each client's augmentation drawn on the stacked path
    assert full.plan.path == "stacked"
    part = Simulator(cfg, tmp_path / "part", full.data, progress=False)
    assert part.run(stop_after=1) is None
    resumed = Simulator(cfg, tmp_path / "part", full.data, progress=False)
    resumed.run(resume=True)
    for key, value in full.state.server["params"].items():
        assert torch.equal(value, resumed.state.server["params"][key]), key
    # one client's update from the same model and RNG state, on augmented and on clean windows
    algo, client = full.algorithm, next(c for c in full.data.clients if c.num_samples)
    clean = build_federated_data(
        config(settings, **{"features.augment": False}), progress=False
    ).client(client.name)
    updates = []
    for data in (client, clean):
        torch.manual_seed(0)
        updates.append(
            algo.client_update(
                full.state.server["params"], None, data, 3, torch.Generator().manual_seed(0)
            ).upload
        )
    assert any(
        not torch.equal(v, updates[1][k]) for k, v in updates[0].items() if v.is_floating_point()
    )


def test_test_time_augmentation_is_fixed_and_the_clean_test_is_reported(settings, tmp_path):
    cfg = config(
        settings, **{"features.augment": False, "features.test_augment": True, "train.rounds": 1}
    )
    noisy, again = (build_federated_data(cfg, progress=False) for _ in range(2))
    clean = build_federated_data(config(settings, **{"features.augment": False}), progress=False)
    assert torch.equal(noisy.test.x, again.test.x)  # fixed per (seed, clip)
    assert not torch.equal(noisy.test.x, clean.test.x) and not torch.equal(noisy.val.x, clean.val.x)
    assert torch.equal(noisy.extra_test["clean"].x, clean.test.x)
    assert torch.equal(noisy.clients[0].x, clean.clients[0].x)  # training clips untouched
    other = build_federated_data(
        config(settings, **{"features.augment": False, "features.test_augment": True, "seed": 1}),
        progress=False,
    )
    assert not torch.equal(other.test.x, noisy.test.x)  # a new seed, a new fixed draw
    results = Simulator(cfg, tmp_path / "run", noisy, progress=False).run()
    assert 0 <= results["final"]["clean_accuracy"] <= 1 and 0 <= results["final"]["accuracy"] <= 1


def test_an_algorithm_without_batches_refuses_augmentation(settings):
    with pytest.raises(
        ConfigError, match="algorithm fedkad does not train on; set features.augment=false"
    ):
        build_federated_data(config(settings, algorithm="fedkad"), progress=False)
