"""APFL's settings (algorithms/apfl.py).

Settings are read and checked before torch loads: this module imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

from fedac.fields import number


@dataclass
class APFLConfig:
    alpha: float = number(0.25, "[0, 1]")
    """alpha_i at the start: the personalised model is alpha v_i + (1 - alpha) w_i."""
    learn_alpha: bool = True
    """Learn each client's alpha_i by gradient steps (Algorithm 1, "adaptive"); false keeps it at
    `alpha`."""
    alpha_lr: float = number(0.01, ">= 0")
    """eta_alpha, alpha's step size (Algorithm 1; its gradient is <v - w, grad f(v_bar)>)."""
