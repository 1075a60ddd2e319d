"""FedMMD's settings (algorithms/fedmmd.py).

Settings are read and checked before torch loads: this module imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

from fedac.fields import number


@dataclass
class FedMMDConfig:
    weight: float = number(0.01, ">= 0")
    """lambda of CE + lambda * MMD^2(local, frozen global penultimate features) (official script: 0.01)."""
