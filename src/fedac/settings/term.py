"""TERM's settings (algorithms/term.py).

Settings are read and checked before torch loads: this module imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

from fedac.fields import number


@dataclass
class TERMConfig:
    t: float = number(1.0, "finite")
    """The tilt: the clients' models weighted by exp(t F_k); 0 is FedAvg, > 0 favours the clients
    of larger loss (fairness), < 0 discounts them (robustness)."""
