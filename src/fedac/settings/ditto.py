"""Ditto's settings (algorithms/ditto.py).

Settings are read and checked before torch loads: this module imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

from fedac.fields import number


@dataclass
class DittoConfig:
    lam: float = number(0.1, ">= 0")
    """lambda of Ditto's personal objective (Algorithm 1), F_k(v) + lambda/2 ||v - w^t||^2; 0
    trains each personal model on its client's data alone."""
