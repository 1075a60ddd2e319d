"""Model families, one file each; `build_model` is the single way algorithms create models."""

from __future__ import annotations

from torch import nn

from fedac.errors import ConfigError
from fedac.models.crnn import CRNN, CRNN_SPECS
from fedac.models.kws import KWS_MODELS
from fedac.models.kws_cnn import KWS_CNN_SPECS, KWSCNN
from fedac.models.ssl import SIZES as SSL_SIZES, build_ssl_model  # transformers loads only when one is built

MODEL_NAMES = tuple(CRNN_SPECS)
SSL_NAMES = tuple(SSL_SIZES)
#: Every model `build_model` knows; MODEL_NAMES is the CRNN zoo (the stacked cohort path's models),
#: then FedKWS-UI's networks, the zero-shot paper's small CNNs and the SSL encoders.
ALL_MODELS = MODEL_NAMES + tuple(KWS_MODELS) + tuple(KWS_CNN_SPECS) + SSL_NAMES


def build_model(name: str, num_features: int, num_classes: int, dropout: float = 0.1,
                kind: str = "classification", options=None) -> nn.Module:
    """`options` (a config.ModelConfig) carries the SSL settings: encoder_path, freeze_cnn, encoder_depth, ctc_hidden,
    head_norm."""
    if options is not None and options.head_norm and name not in SSL_NAMES:
        raise ConfigError(f"model.head_norm applies to the SSL models' pooled heads, not to {name}")
    if name in CRNN_SPECS:
        return CRNN(CRNN_SPECS[name], num_features, num_classes, dropout)
    if name in KWS_MODELS:  # FedKWS-UI's networks use no dropout (models/kws.py)
        return KWS_MODELS[name](num_features, num_classes)
    if name in KWS_CNN_SPECS:  # the zero-shot paper's small CNNs (no dropout listed)
        return KWSCNN(KWS_CNN_SPECS[name], num_features, num_classes)
    if name in SSL_NAMES:
        o = options
        return build_ssl_model(name, kind, num_classes, o and o.encoder_path, o.freeze_cnn if o else True,
                               o.encoder_depth if o else 0, o.ctc_hidden if o else 0, dropout, bool(o and o.head_norm))
    raise ConfigError(f"unknown model '{name}'. Known models: {', '.join(ALL_MODELS)} (see `fedac models`)")


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
