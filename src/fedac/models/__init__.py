"""Model families, one file each; `build_model` is the single way algorithms create models."""

from __future__ import annotations

from torch import nn

from fedac.errors import ConfigError
from fedac.models.crnn import CRNN, CRNN_SPECS

MODEL_NAMES = tuple(CRNN_SPECS)


def build_model(name: str, num_features: int, num_classes: int, dropout: float = 0.1) -> nn.Module:
    if name in CRNN_SPECS:
        return CRNN(CRNN_SPECS[name], num_features, num_classes, dropout)
    raise ConfigError(f"unknown model '{name}'. Known models: {', '.join(MODEL_NAMES)} (see `fedac models`)")


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
