"""The model registry (`MODELS`, fedac/registry.py) and `build_model`, the single way algorithms
create models; the package face (models/__init__.py) loads this module on first use, so `import
fedac.models.ssl_sizes` stays free of torch."""

from __future__ import annotations

from torch import nn

from fedac.errors import ConfigError
from fedac.models.crnn import CRNN, CRNN_SPECS
from fedac.models.kws import KWS_MODELS
from fedac.models.kws_cnn import KWS_CNN_SPECS, KWSCNN

# transformers loads only when one is built
from fedac.models.ssl import SIZES as SSL_SIZES
from fedac.models.ssl import build_ssl_model
from fedac.settings.models import MODELS  # the registry's torch-free table; re-exported

MODEL_NAMES = tuple(CRNN_SPECS)
SSL_NAMES = tuple(SSL_SIZES)
#: Every built-in model; MODEL_NAMES is the CRNN zoo (the stacked path's models), then
#: FedKWS-UI's networks, the zero-shot paper's small CNNs and the SSL encoders. `MODELS` adds the
#: plug-ins.
ALL_MODELS = MODEL_NAMES + tuple(KWS_MODELS) + tuple(KWS_CNN_SPECS) + SSL_NAMES


def build_crnn(name: str, num_features: int, num_classes: int, dropout: float, **_) -> nn.Module:
    return CRNN(CRNN_SPECS[name], num_features, num_classes, dropout)


def build_kws(name: str, num_features: int, num_classes: int, **_) -> nn.Module:
    # FedKWS-UI's networks use no dropout (models/kws.py)
    return KWS_MODELS[name](num_features, num_classes)


def build_kws_cnn(name: str, num_features: int, num_classes: int, **_) -> nn.Module:
    # the zero-shot paper lists no dropout
    return KWSCNN(KWS_CNN_SPECS[name], num_features, num_classes)


def build_ssl(
    name: str, num_classes: int, dropout: float, kind: str, options=None, **_
) -> nn.Module:
    o = options
    return build_ssl_model(
        name,
        kind,
        num_classes,
        o and o.encoder_path,
        o.freeze_cnn if o else True,
        o.encoder_depth if o else 0,
        o.ctc_hidden if o else 0,
        dropout,
        bool(o and o.head_norm),
        o,
    )


def build_model(
    name: str,
    num_features: int,
    num_classes: int,
    dropout: float = 0.1,
    kind: str = "classification",
    options=None,
) -> nn.Module:
    """`options` (a config.ModelConfig) carries the SSL settings: encoder_path, freeze_cnn,
    encoder_depth, ctc_hidden, head_norm, peft*."""
    if options is not None and options.head_norm and name not in SSL_NAMES:
        raise ConfigError(f"model.head_norm applies to the SSL models' pooled heads, not to {name}")
    if options is not None and getattr(options, "peft", "none") != "none" and name not in SSL_NAMES:
        raise ConfigError(
            f"model.peft={options.peft} adapts the SSL encoders (w2v2_*), not {name}: set "
            "model.peft=none"
        )
    if name not in MODELS:
        raise ConfigError(
            f"unknown model '{name}'. Registered models: {', '.join(MODELS)} (see `fedac list`)"
        )
    return MODELS.load(name)(
        name=name,
        num_features=num_features,
        num_classes=num_classes,
        dropout=dropout,
        kind=kind,
        options=options,
    )


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
