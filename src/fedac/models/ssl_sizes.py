"""The named sizes of the SSL speech encoders (models/ssl.py builds them), kept free of torch so
that `fedac memory --help` and `fedac pretrain` can name them without loading it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SSLSize:
    hidden: int
    layers: int
    heads: int
    ffn: int
    conv: int
    """Channels of each of the 7 CNN layers (kernels 10,3,3,3,3,2,2, strides 5,2,2,2,2,2,2: 49
    frames/s)."""
    pos_kernel: int = 128
    pos_groups: int = 16


#: Small sizes for CPU federations (s: 2.79M parameters, m: 11.1M) and wav2vec 2.0 Base (94.4M).
#: w2v2_tiny is the test and CI size (a shorter positional convolution keeps it fast).
SIZES: dict[str, SSLSize] = {
    "w2v2_tiny": SSLSize(64, 4, 2, 256, 64, pos_kernel=32, pos_groups=8),
    "w2v2_s": SSLSize(128, 12, 4, 512, 128),
    "w2v2_m": SSLSize(256, 12, 4, 1024, 256),
    "w2v2_base": SSLSize(768, 12, 12, 3072, 512),
}


#: What `fedac models` shows of each size without building it (a build needs transformers' model
#: code, whose import alone takes longer than torch's): models/ssl.py `measure_counts` measured
#: them (its docstring defines the keys); tests/models/test_ssl_counts.py checks them against it.
#: With C classes the head adds 2H * C + C parameters and 4H * C FLOPs.
COUNTS: dict[str, dict[str, int]] = {
    "w2v2_tiny": {
        "params": 220832,
        "cnn": 66304,
        "flops": 21307392,
        "lora": 8192,
        "ia3": 1536,
    },
    "w2v2_s": {
        "params": 2527616,
        "cnn": 263680,
        "flops": 245923840,
        "lora": 49152,
        "ia3": 9216,
    },
    "w2v2_m": {
        "params": 10068608,
        "cnn": 1051648,
        "flops": 983695360,
        "lora": 98304,
        "ia3": 18432,
    },
    "w2v2_base": {
        "params": 90170496,
        "cnn": 4200448,
        "flops": 8833990656,
        "lora": 294912,
        "ia3": 55296,
    },
}


def ssl_counts(name: str, num_classes: int) -> dict[str, int]:
    """COUNTS of size `name` with a head of `num_classes`: params, cnn, flops (one 1 s clip) and
    the trainable parameters under each model.peft (none, lora, ia3, head)."""
    c, hidden = COUNTS[name], SIZES[name].hidden
    head = 2 * hidden * num_classes + num_classes
    return {
        "params": c["params"] + head,
        "cnn": c["cnn"],
        "flops": c["flops"] + 4 * hidden * num_classes,
        "none": c["params"] + head,
        "lora": c["lora"] + head,
        "ia3": c["ia3"] + head,
        "head": head,
    }
