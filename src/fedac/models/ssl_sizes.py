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
