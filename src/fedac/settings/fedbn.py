"""FedBN's settings (algorithms/fedbn.py).

Settings are read and checked before torch loads: this module imports no torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FedBNConfig:
    require_batchnorm: bool = False
    """What FedBN does on a network without BatchNorm (the CRNNs, KWT, the KWS CNNs, the SSL
    encoders; models/parts.py): false, it runs and warns that it is FedAvg there (every entry is
    shared; its own models are the clients' last local models); true, it refuses to start."""
