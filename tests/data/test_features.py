"""Mel filterbank, log-Mel / MFCC shapes and values, and the on-disk feature cache."""

from __future__ import annotations

import math

import numpy as np
import pytest
import soundfile as sf
import torch

from fedac.config import FeatureConfig
from fedac.data import features as features_mod
from fedac.data.features import FeatureExtractor, compute_features, load_features, mel_filterbank
from fedac.data.manifest import Clip, Manifest

RATE = 16000


def mel(hz: float) -> float:
    return 2595.0 * math.log10(1.0 + hz / 700.0)


def inv_mel(m: float) -> float:
    return 700.0 * (10.0 ** (m / 2595.0) - 1.0)


def hand_edges(n_mels: int, f_min: float, f_max: float) -> list[float]:
    lo, hi = mel(f_min), mel(f_max)
    return [inv_mel(lo + (hi - lo) * i / (n_mels + 1)) for i in range(n_mels + 2)]


def tone(freq: float, seconds: float = 1.0, amp: float = 0.5) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


# --- filterbank -------------------------------------------------------------------------------


def test_htk_mel_scale_reference_point():
    # 1000 Hz is ~1000 mel on the HTK scale
    assert features_mod.hz_to_mel(1000.0) == pytest.approx(1000.0, abs=0.1)
    assert features_mod.mel_to_hz(features_mod.hz_to_mel(3210.0)) == pytest.approx(3210.0)


def test_filterbank_triangles_at_fine_resolution():
    n_fft = 16384  # ~1 Hz bins, so the triangle shape can be checked precisely
    fb = mel_filterbank(40, n_fft, RATE, f_min=20.0)
    freqs = np.linspace(0, RATE / 2, n_fft // 2 + 1)
    edges = hand_edges(40, 20.0, RATE / 2)
    assert fb.shape == (40, n_fft // 2 + 1)
    assert fb.min() >= 0.0 and fb.max() <= 1.0 + 1e-6
    peaks = []
    for m in range(40):
        lower, centre, upper = edges[m], edges[m + 1], edges[m + 2]
        row = fb[m]
        peak = int(row.argmax())
        peaks.append(freqs[peak])
        assert row[peak] == pytest.approx(1.0, abs=0.02), f"filter {m} peak {row[peak]}"
        assert abs(freqs[peak] - centre) <= freqs[1]
        # zero outside its edges
        assert np.all(row[freqs <= lower] == 0.0)
        assert np.all(row[freqs >= upper] == 0.0)
        # linear in Hz: half-way up the rising edge the weight is ~0.5
        mid = int(np.argmin(np.abs(freqs - (lower + centre) / 2)))
        assert row[mid] == pytest.approx((freqs[mid] - lower) / (centre - lower), abs=1e-4)
    assert np.all(np.diff(peaks) > 0)


def test_filterbank_at_model_resolution():
    fb = mel_filterbank(40, 512, RATE)
    edges = hand_edges(40, 20.0, RATE / 2)
    freqs = np.linspace(0, RATE / 2, 257)
    centres_bins = fb.argmax(axis=1)
    assert np.all(np.diff(centres_bins) >= 0)
    # every filter has some weight and peaks on the bin closest to its centre
    for m in range(40):
        assert fb[m].max() > 0.3
        assert abs(freqs[centres_bins[m]] - edges[m + 1]) <= freqs[1]


# --- extractor --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["mfcc", "logmel"])
def test_one_second_gives_40_by_101(kind):
    extractor = FeatureExtractor(FeatureConfig(kind=kind))
    assert extractor.win_length == 480 and extractor.hop_length == 160 and extractor.n_fft == 512
    out = extractor(
        torch.from_numpy(np.stack([tone(440.0), tone(1000.0), np.zeros(RATE, np.float32)]))
    )
    assert out.shape == (3, 40, 101)
    assert extractor.num_features == 40
    assert torch.isfinite(out).all()


def test_feature_count_follows_config():
    out = FeatureExtractor(FeatureConfig(kind="mfcc", n_mels=40, n_mfcc=13))(torch.zeros(1, 8000))
    assert out.shape == (1, 13, 51)
    out = FeatureExtractor(FeatureConfig(kind="logmel", n_mels=64, hop_ms=20.0))(
        torch.zeros(1, RATE)
    )
    assert out.shape == (1, 64, 51)
    with pytest.raises(ValueError, match="n_mfcc"):
        FeatureExtractor(FeatureConfig(kind="mfcc", n_mels=20, n_mfcc=40))
    with pytest.raises(ValueError, match="features.kind"):
        FeatureExtractor(FeatureConfig(kind="spectrogram"))


@pytest.mark.parametrize("freq", [300.0, 1000.0, 2500.0, 6000.0])
def test_tone_peaks_in_its_mel_band(freq):
    logmel = FeatureExtractor(FeatureConfig(kind="logmel"))(torch.from_numpy(tone(freq))[None])[0]
    band = int(logmel[:, 10:-10].mean(dim=1).argmax())
    centres = hand_edges(40, 20.0, RATE / 2)[1:-1]
    nearest = int(np.argmin([abs(c - freq) for c in centres]))
    assert abs(band - nearest) <= 1
    # the band containing the tone lies between its neighbours' centres
    assert centres[max(band - 1, 0)] <= freq * 1.02 and freq <= centres[min(band + 1, 39)] * 1.02


def test_mfcc_is_orthonormal_dct_of_logmel():
    waves = torch.from_numpy(np.stack([tone(700.0), tone(3100.0, amp=0.1)]))
    logmel = FeatureExtractor(FeatureConfig(kind="logmel"))(waves).double()
    mfcc = FeatureExtractor(FeatureConfig(kind="mfcc", n_mfcc=20))(waves).double()
    n = 40
    k = np.arange(20)[:, None]
    j = np.arange(n)[None, :]
    basis = np.sqrt(2.0 / n) * np.cos(np.pi * k * (2 * j + 1) / (2 * n))
    basis[0] /= np.sqrt(2.0)
    expected = torch.einsum("kn,bnt->bkt", torch.from_numpy(basis), logmel)
    assert torch.allclose(mfcc, expected, atol=1e-3)


def test_silence_log_floor():
    out = FeatureExtractor(FeatureConfig(kind="logmel"))(torch.zeros(1, RATE))
    assert torch.allclose(out, torch.full_like(out, math.log(1e-6)))


# --- compute / cache --------------------------------------------------------------------------


def write(path, audio, rate=RATE):
    sf.write(path, audio, rate, subtype="PCM_16")
    return str(path)


def small_manifest(root) -> Manifest:
    clips = [
        Clip(write(root / "a.wav", tone(500.0)), 0, "s1", "train"),
        Clip(write(root / "b.wav", tone(900.0, seconds=0.5)), 1, "s1", "train"),
        Clip(write(root / "c.wav", tone(1500.0, seconds=2.5)), 1, "s2", "val"),
    ]
    return Manifest("tiny", str(root), ["x", "y"], clips)


def test_compute_features_windows_and_padding(tmp_path):
    feats = compute_features(small_manifest(tmp_path), FeatureConfig(), progress=False)
    # 1 s -> 1 window, 0.5 s -> 1 zero-padded window, 2.5 s -> ceil(2.5) = 3 windows
    assert feats.clip_index.tolist() == [0, 1, 2, 2, 2]
    assert feats.features.shape == (5, 40, 101)
    assert len(feats) == 5


def test_cache_hit_on_second_call(tmp_path, monkeypatch):
    manifest = small_manifest(tmp_path)
    cache = tmp_path / "cache"
    first = load_features(manifest, FeatureConfig(), str(cache), progress=False)
    files = list((cache / "features").glob("*.pt"))
    assert len(files) == 1

    def boom(*args, **kwargs):
        raise AssertionError("features recomputed although cached")

    monkeypatch.setattr(features_mod, "compute_features", boom)
    second = load_features(manifest, FeatureConfig(), str(cache), progress=False)
    assert torch.equal(first.features, second.features)
    assert torch.equal(first.clip_index, second.clip_index)


def test_cache_uses_fedac_home_by_default(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDAC_HOME", str(tmp_path / "home"))
    load_features(small_manifest(tmp_path), FeatureConfig(), None, progress=False)
    assert len(list((tmp_path / "home" / "features").glob("tiny-mfcc-*.pt"))) == 1


def test_cache_key_changes_with_file_noise_and_settings(tmp_path, monkeypatch):
    manifest = small_manifest(tmp_path)
    cache = str(tmp_path / "cache")
    calls = []
    real = features_mod.compute_features

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(features_mod, "compute_features", counting)
    cfg = FeatureConfig()
    base = load_features(manifest, cfg, cache, progress=False)
    load_features(manifest, cfg, cache, progress=False)
    assert len(calls) == 1

    # noise setting: a new cache entry, and different features
    noisy = load_features(manifest, cfg, cache, snr_db=10.0, noise_seed=1, progress=False)
    assert len(calls) == 2
    assert not torch.equal(base.features, noisy.features)
    load_features(manifest, cfg, cache, snr_db=10.0, noise_seed=1, progress=False)
    assert len(calls) == 2
    load_features(manifest, cfg, cache, snr_db=10.0, noise_seed=2, progress=False)
    assert len(calls) == 3

    # feature settings
    load_features(manifest, FeatureConfig(kind="logmel"), cache, progress=False)
    assert len(calls) == 4

    # a changed file is recomputed and its new content is used
    write(tmp_path / "a.wav", tone(3000.0, seconds=1.2))
    changed = load_features(manifest, cfg, cache, progress=False)
    assert len(calls) == 5
    # 1.2 s now gives two windows for clip 0; the other clips are unchanged
    assert changed.clip_index.tolist() == [0, 0, 1, 2, 2, 2]
    assert not torch.equal(changed.features[0], base.features[0])
    assert torch.equal(changed.features[2:], base.features[1:])
