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
from dataclasses import dataclass, field

from fedac.fields import number
from fedac.registry import Entry, Registry, choice, resolve

#: `model.peft`: how the SSL encoders are fine-tuned (models/ssl.py `adapted_encoder`).
PEFT_METHODS = ("none", "lora", "ia3", "head")


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
    peft: str = choice("none", PEFT_METHODS)
    """SSL models: parameter-efficient fine-tuning through Hugging Face `peft` (the `peft` extra).
    none: every encoder weight trains and travels. lora: low-rank updates (LoRA) of the
    `peft_targets` projections. ia3: IA3's learned rescaling vectors on the keys, values and the
    feed-forward output (peft has no bottleneck adapter; IA3 is its adapter for these encoders).
    head: no adapter, the whole encoder frozen (linear probing of its pooled output; needs no
    peft). With any of them, the encoder's own weights stay frozen and never travel: only the
    adapters and the head(s) are trained, uploaded and aggregated (docs/ssl.md,
    "Parameter-efficient fine-tuning")."""
    peft_rank: int = number(8, ">= 1")
    """model.peft=lora: the rank r of each low-rank update."""
    peft_alpha: float = number(16.0, "> 0")
    """model.peft=lora: the scale alpha; the update B A is multiplied by alpha / r."""
    peft_dropout: float = number(0.0, "[0, 1)")
    """model.peft=lora: dropout on the input of the low-rank path."""
    peft_targets: list[str] = field(default_factory=list)
    """model.peft: the encoder modules that get adapters, by name suffix (e.g. q_proj,v_proj).
    Empty: the method's default, lora q_proj,v_proj (the attention's query and value projections
    of every transformer layer, LoRA's own choice) and ia3 k_proj,v_proj,output_dense (IA3's
    keys, values and feed-forward output)."""


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
