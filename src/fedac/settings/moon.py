"""MOON's settings (algorithms/moon.py).

Settings are read and checked before torch loads: this module imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

from fedac.fields import number


@dataclass
class MoonConfig:
    mu: float = number(1.0, ">= 0")
    """mu of the local loss l_sup + mu * l_con (Eq. 4); 0 is FedAvg."""
    temperature: float = number(0.5, "> 0")
    """tau of Eq. 3, the temperature of the two cosine similarities."""
