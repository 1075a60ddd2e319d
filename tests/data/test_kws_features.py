"""features.style=fedkws: FedKWS-UI's 8 kHz MFCC pipeline against a hand-written numpy reference,
its own cache entry, and its effect on what the models read (no CMVN)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import soundfile as sf
import torch

from fedac.config import FeatureConfig, load_config
from fedac.data.features import FeatureExtractor, load_features
from fedac.data.manifest import Clip, Manifest
from fedac.engine.data import build_federated_data
from fedac.errors import ConfigError

FEDKWS = FeatureConfig(style="fedkws")


def reference_fedkws_mfcc(wave: np.ndarray) -> np.ndarray:
    """torchaudio.transforms.MFCC(8000, 40, melkwargs n_fft=240, hop 80, n_mels 40, htk, f 0-4000)
    with AmplitudeToDB(top_db=80), / 500, written out with numpy loops from the definitions."""
    n_fft, hop, n_mels = 240, 80, 40  # at 8 kHz
    padded = np.pad(wave.astype(np.float64), n_fft // 2, mode="reflect")
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)  # periodic Hann
    frames = [padded[i : i + n_fft] * window for i in range(0, len(padded) - n_fft + 1, hop)]
    power = np.abs(np.fft.rfft(np.array(frames), axis=1)) ** 2  # (frames, 121)
    mel = lambda hz: 2595 * math.log10(1 + hz / 700)  # noqa: E731
    edges = [700 * (10 ** (m / 2595) - 1) for m in np.linspace(mel(0), mel(4000), n_mels + 2)]
    freqs = np.linspace(0, 4000, n_fft // 2 + 1)
    bank = np.zeros((n_mels, len(freqs)))
    for m in range(n_mels):
        lo, mid, hi = edges[m : m + 3]
        for j, f in enumerate(freqs):
            bank[m, j] = max(0.0, min((f - lo) / (mid - lo), (hi - f) / (hi - mid)))
    db = 10 * np.log10(np.maximum(power @ bank.T, 1e-10))  # (frames, mels)
    db = np.maximum(db, db.max() - 80)
    n = np.arange(n_mels)
    dct = np.array(
        [
            [
                math.sqrt((1 if k == 0 else 2) / n_mels)
                * math.cos(math.pi * k * (2 * i + 1) / (2 * n_mels))
                for i in n
            ]
            for k in range(40)
        ]
    )
    return (dct @ db.T) / 500  # (coefficients, frames)


def test_fedkws_mfcc_equals_the_hand_written_reference():
    t = np.arange(8000) / 8000
    wave = 0.4 * np.sin(2 * np.pi * 440 * t) + 0.05 * np.random.default_rng(0).standard_normal(8000)
    ours = (
        FeatureExtractor(FEDKWS)(torch.from_numpy(wave.astype(np.float32))[None])[0]
        .double()
        .numpy()
    )
    assert ours.shape == (40, 101)  # 8000 samples at hop 80, centred frames
    np.testing.assert_allclose(ours, reference_fedkws_mfcc(wave.astype(np.float32)), atol=2e-5)


def test_top_db_floors_each_clip_under_its_own_peak():
    extractor = FeatureExtractor(FEDKWS)
    click = torch.zeros(2, 8000)
    click[:, 4000] = torch.tensor([1.0, 0.1])  # mostly silent frames: they sit on the floor
    db = extractor.dct.T @ (extractor(click) * 500)  # the DCT is orthonormal and square: back to dB
    for clip in db:
        assert clip.min() == pytest.approx(float(clip.max()) - 80, abs=1e-3)
    # the floor follows each clip's own peak: a 20 dB quieter click is 20 dB lower everywhere
    assert torch.allclose(db[0] - db[1], torch.full_like(db[0], 20.0), atol=1e-2)
    noise = torch.randn(1, 8000, generator=torch.Generator().manual_seed(0))
    a, b = extractor(0.1 * noise)[0], extractor(1e-3 * noise)[0]
    assert torch.allclose(a[1:], b[1:], atol=1e-4)
    assert torch.allclose(a[0] - b[0], torch.full_like(a[0], 40 * math.sqrt(40) / 500), atol=1e-3)


def test_style_replaces_the_rate_and_is_validated():
    assert (
        FeatureExtractor(
            FeatureConfig(style="fedkws", sample_rate=16000, n_mfcc=13)
        ).cfg.sample_rate
        == 8000
    )
    with pytest.raises(ConfigError, match="features.style must be fedac or fedkws, got 'paper'"):
        FeatureExtractor(FeatureConfig(style="paper"))
    # the fedkws style is torchaudio's MFCC whatever features.kind says (the paper's features)
    assert FeatureExtractor(FeatureConfig(style="fedkws", kind="logmel")).cfg.kind == "mfcc"


def test_style_has_its_own_cache_entry_and_decodes_at_8k(tmp_path):
    t = np.arange(16000) / 16000
    path = tmp_path / "a.wav"
    sf.write(path, (0.3 * np.sin(2 * np.pi * 3000 * t)).astype(np.float32), 16000)
    manifest = Manifest("tone", str(tmp_path), ["x"], [Clip(str(path), 0, "s1", "train")])
    cache = str(tmp_path / "cache")
    fedac = load_features(manifest, FeatureConfig(), cache, progress=False)
    ours = load_features(manifest, FEDKWS, cache, progress=False)
    assert len(list((tmp_path / "cache" / "features").glob("*.pt"))) == 2
    assert fedac.features.shape == ours.features.shape == (1, 40, 101)
    # a 3 kHz tone resampled to 8 kHz: the reference on the resampled audio (fp16 cache)
    from fedac.data.audio import load_audio

    expected = reference_fedkws_mfcc(load_audio(path, 8000))
    np.testing.assert_allclose(ours.features[0].float().numpy(), expected, atol=2e-3)


def test_models_read_fedkws_features_without_cmvn(gsc_root, tmp_path):
    cfg = lambda style: load_config(
        overrides=[
            f"data.root={gsc_root}",
            f"data.cache_dir={tmp_path}",  # noqa: E731
            f"features.style={style}",
        ]
    )
    plain, fedkws = (
        build_federated_data(cfg("fedac"), progress=False),
        build_federated_data(cfg("fedkws"), progress=False),
    )
    assert fedkws.test.x.shape == plain.test.x.shape
    # CMVN makes every coefficient zero-mean over time; FedKWS-UI's raw c0 / 500 is not, and is
    # small
    assert plain.test.x.mean(dim=2).abs().max() < 1e-3
    assert fedkws.test.x[:, 0].mean(dim=1).abs().min() > 0.05
    assert fedkws.test.x.abs().max() < 5
