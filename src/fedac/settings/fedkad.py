"""FedKAD's settings (algorithms/fedkad.py).

Settings are read and checked before torch loads: this module imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

from fedac.fields import number


@dataclass
class FedKADConfig:
    proto_dim: int = number(64, ">= 1")
    """Shared prototype size that every client's penultimate features are projected to."""
    align_weight: float = number(1.0, ">= 0")
    """Weight of the feature-alignment loss toward global class prototypes."""
