"""AFL's settings (algorithms/afl.py).

Settings are read and checked before torch loads: this module imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

from fedac.fields import number


@dataclass
class AFLConfig:
    lambda_lr: float = number(0.01, ">= 0")
    """gamma_lambda: the step of the projected gradient ascent on the mixing weights lambda."""
