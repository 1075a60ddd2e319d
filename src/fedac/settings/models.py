"""The model registry (`model.name`, `model.client_model`, `model.zoo`) and the models' own
settings.

The table names every built-in network and its builder ("module:function" in
fedac/models/registry.py, imported when a model is built); a model's settings are a dataclass here
that its entries name (`Entry(..., settings=...)`), and `Config` adds their fields to the `model`
section beside the shared `name`, `dropout`, `heterogeneous`, `client_model` and `zoo` (config.py).
This module imports no torch, so a model name is checked when the config loads; the one-line
descriptions (`fedac list`) are drawn from the networks' specs on demand. tests/test_settings.py
checks the names against those specs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fedac.fields import number
from fedac.registry import Entry, Registry, resolve


@dataclass
class SSLSettings:
    encoder_path: str | None = None
    """SSL models (w2v2_*): a local Hugging Face wav2vec 2.0 / HuBERT checkpoint folder whose
    weights (and size, from its config.json) replace the named size's random initialisation. Never
    downloaded. Unset: the encoder shipped with fedac for that size (w2v2_s), random weights for the
    others; `random`: random weights for every size."""
    freeze_cnn: bool = True
    """SSL models: keep the CNN feature encoder frozen and run it once per clip (outputs cached)."""
    encoder_depth: int = number(0, ">= 0")
    """SSL models: transformer layers run (encoder.layers[:depth]); 0 = all."""
    ctc_hidden: int = number(0, ">= 0")
    """SSL models on CTC tasks: BiLSTM units per direction of the ASR head; 0 = the encoder
    width."""
    head_norm: bool = False
    """SSL classification heads (beyond the papers, which put the linear layer straight on the
    pooled [mean; std]): standardise each pooled dimension with a BatchNorm1d first. The pooled
    statistics of a pretrained encoder differ in scale by 10x or more across dimensions, and a plain
    linear head trained by AdamW stays near the class prior for thousands of steps
    (docs/earlyexit.md, "The head")."""


_R = "fedac.models.registry"


def _line(name: str) -> Callable[[], str]:
    # (read from the torch-free specs when the models are listed)
    return lambda: resolve("fedac.models.specs:describe_model")(name)


def _family(builder: str, names: tuple[str, ...], settings: type | None = None) -> dict[str, Entry]:
    return {name: Entry(f"{_R}:{builder}", _line(name), settings) for name in names}


# models/crnn.py CRNN_SPECS
CRNN_NAMES = ("crnn_tiny", "crnn_lite", "crnn_mid", "crnn_base", "crnn_deep")
KWS_NAMES = ("dscnn", "mhattrnn", "resnet15", "kwt")  # models/kws.py KWS_MODELS
KWS_CNN_NAMES = (
    "cnn2_softmax",
    "cnn3_relu",
    "dscnn3_relu",
    "ann3_relu",
    "cnn1_softmax",
    "cnn3_softmax",
    "cnn4_softmax",
)  # models/kws_cnn.py KWS_CNN_SPECS
SSL_NAMES = ("w2v2_tiny", "w2v2_s", "w2v2_m", "w2v2_base")  # models/ssl_sizes.py SIZES

#: The model registry (fedac/registry.py): built-ins here, plug-ins from the `fedac.models` entry
#: points. fedac.models re-exports it.
MODELS = Registry(
    "model",
    {
        **_family("build_crnn", CRNN_NAMES),
        **_family("build_kws", KWS_NAMES),
        **_family("build_kws_cnn", KWS_CNN_NAMES),
        **_family("build_ssl", SSL_NAMES, SSLSettings),
    },
    setting="model.name",
)
