"""Model families, one file each; `build_model` is the single way algorithms create models."""

from __future__ import annotations

from torch import nn

from fedac.errors import ConfigError
from fedac.models.crnn import CRNN, CRNN_SPECS
from fedac.models.kws import KWS_MODELS
from fedac.models.kws_cnn import KWS_CNN_SPECS, KWSCNN

MODEL_NAMES = tuple(CRNN_SPECS)
#: Every model `build_model` knows; MODEL_NAMES is the CRNN zoo (the stacked cohort path's models),
#: then FedKWS-UI's networks and the zero-shot paper's small CNNs.
ALL_MODELS = MODEL_NAMES + tuple(KWS_MODELS) + tuple(KWS_CNN_SPECS)


def build_model(name: str, num_features: int, num_classes: int, dropout: float = 0.1) -> nn.Module:
    if name in CRNN_SPECS:
        return CRNN(CRNN_SPECS[name], num_features, num_classes, dropout)
    if name in KWS_MODELS:  # FedKWS-UI's networks use no dropout (models/kws.py)
        return KWS_MODELS[name](num_features, num_classes)
    if name in KWS_CNN_SPECS:  # the zero-shot paper's small CNNs (no dropout listed)
        return KWSCNN(KWS_CNN_SPECS[name], num_features, num_classes)
    raise ConfigError(f"unknown model '{name}'. Known models: {', '.join(ALL_MODELS)} (see `fedac models`)")


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
