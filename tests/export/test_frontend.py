"""The exported graph's feature front end is the training pipeline's: `FeatureFrontEnd` against
`FeatureExtractor` followed by `model_input` (CMVN, or none for the fedkws style), on speech-like
signals, for every feature kind and style."""

from __future__ import annotations

import pytest
import torch

from fedac.config import Config, FeatureConfig
from fedac.data.features import FeatureExtractor, resolve_features
from fedac.export.frontend import FeatureFrontEnd
from fedac.training.types import model_input


def signal(rate: int, rows: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    t = torch.arange(rate) / rate
    chirp = torch.sin(2 * torch.pi * (200 + 1500 * t) * t) * torch.hann_window(rate)
    return (0.3 * chirp + 0.02 * torch.randn(rows, rate, generator=g)).float()


@pytest.mark.parametrize(
    "settings",
    [{}, {"kind": "logmel"}, {"style": "fedkws"}, {"win_ms": 25.0, "n_mels": 64, "n_mfcc": 20}],
    ids=["mfcc", "logmel", "fedkws", "other-sizes"],
)
def test_the_front_end_is_the_training_features(settings):
    cfg = Config()
    cfg.features = FeatureConfig(**settings)
    rate = resolve_features(cfg.features).sample_rate
    waves = signal(rate)
    want = model_input(FeatureExtractor(cfg.features)(waves), cfg)
    got = FeatureFrontEnd(cfg.features)(waves)
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    # the front end's constants are buffers: they travel with the module (and into the graph)
    assert {"window", "mel"} <= {name for name, _ in FeatureFrontEnd(cfg.features).named_buffers()}
