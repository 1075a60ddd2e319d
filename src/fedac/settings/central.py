"""Centralised training's settings (algorithms/central.py).

Settings are read and checked before torch loads: this module imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

from fedac.fields import number


@dataclass
class CentralConfig:
    warmup_epochs: int = number(5, ">= 0")
    """`--algorithm central` (FedKWS-UI Table 2's trainer): rounds of linear learning-rate warm-up,
    lr (t+1)/W."""
    decay_power: float = number(2.0, ">= 0")
    """After warm-up lr (1 - (t - W) / (T - W))^p over the T = train.rounds rounds: 2 is the
    official code's quadratic decay, 1 linear, 0 a constant lr."""
