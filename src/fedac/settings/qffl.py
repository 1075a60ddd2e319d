"""q-FFL's settings (algorithms/qffl.py).

Settings are read and checked before torch loads: this module imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

from fedac.fields import number


@dataclass
class QFFLConfig:
    q: float = number(1.0, ">= 0")
    """The fairness exponent: min sum_k p_k F_k^{q+1} / (q + 1); 0 is FedAvg."""
    lipschitz: float = number(0.0, ">= 0")
    """L, the Lipschitz estimate of Alg. 2; 0: the paper's 1 / train.lr."""
