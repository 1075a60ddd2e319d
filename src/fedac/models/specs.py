"""The built-in networks' specs and their one-line descriptions, kept free of torch (as
ssl_sizes.py is) so that `fedac list models` names and describes every model without loading it:
the CRNN zoo (models/crnn.py builds it), the zero-shot paper's small CNNs (models/kws_cnn.py) and
the names of FedKWS-UI's network classes (models/kws.py)."""

from __future__ import annotations

from dataclasses import dataclass

from fedac.models.ssl_sizes import SIZES as SSL_SIZES


@dataclass(frozen=True)
class CRNNSpec:
    conv_channels: tuple[int, ...]
    hidden: int
    bidirectional: bool


CRNN_SPECS: dict[str, CRNNSpec] = {
    "crnn_tiny": CRNNSpec((16,), 32, False),
    "crnn_lite": CRNNSpec((32, 32), 64, False),
    "crnn_mid": CRNNSpec((32, 32, 32), 64, False),
    "crnn_base": CRNNSpec((64, 64), 128, True),
    "crnn_deep": CRNNSpec((64, 128, 128), 128, True),
}


@dataclass(frozen=True)
class KWSCNNSpec:
    channels: tuple[int, ...]
    activation: str
    """relu or softmax (over channels)."""
    kind: str = "cnn"
    """cnn, dscnn (depthwise separable) or ann (dense layers on the flattened input)."""


KWS_CNN_SPECS: dict[str, KWSCNNSpec] = {
    "cnn2_softmax": KWSCNNSpec((16, 32), "softmax"),
    "cnn3_relu": KWSCNNSpec((16, 16, 32), "relu"),
    "dscnn3_relu": KWSCNNSpec((16, 16, 32), "relu", "dscnn"),
    "ann3_relu": KWSCNNSpec((16, 16, 32), "relu", "ann"),
    "cnn1_softmax": KWSCNNSpec((16,), "softmax"),
    "cnn3_softmax": KWSCNNSpec((16, 16, 32), "softmax"),
    "cnn4_softmax": KWSCNNSpec((8, 16, 16, 32), "softmax"),
}

#: models/kws.py KWS_MODELS: each name's class name (tests/test_settings.py checks them)
KWS_CLASS_NAMES = {"dscnn": "DSCNN", "mhattrnn": "MHAttRNN", "resnet15": "ResNet15", "kwt": "KWT"}


def describe_model(name: str) -> str:
    """The line `fedac list` shows for built-in model `name`."""
    if name in CRNN_SPECS:
        spec = CRNN_SPECS[name]
        return (
            f"CRNN-{name.split('_')[1].title()} (FedMLAC Table 3): conv "
            f"{'-'.join(map(str, spec.conv_channels))}, {'Bi' if spec.bidirectional else ''}GRU "
            f"{spec.hidden}"
        )
    if name in KWS_CLASS_NAMES:
        return f"FedKWS-UI's {KWS_CLASS_NAMES[name]} keyword spotter (models/kws.py)"
    if name in KWS_CNN_SPECS:
        cnn = KWS_CNN_SPECS[name]
        return (
            f"zero-shot paper's small {cnn.kind.upper()}: channels "
            f"{'-'.join(map(str, cnn.channels))}, {cnn.activation}"
        )
    size = SSL_SIZES[name]
    return (
        f"wav2vec 2.0 / HuBERT encoder, {size.hidden} wide, {size.layers} layers (waveform input; "
        "local checkpoints only)"
    )
