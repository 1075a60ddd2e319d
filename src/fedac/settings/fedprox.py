"""FedProx's settings (algorithms/fedprox.py).

Settings are read and checked before torch loads: this module imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

from fedac.fields import number


@dataclass
class FedProxConfig:
    mu: float = number(0.01, ">= 0")
    """Proximal weight: local loss + mu/2 * ||w - w_global||^2."""
    form: str = "l2"
    """l2 (Li et al.: mu/2 ||w - w_global||^2) or smooth_l1 (FedKWS-UI's code: mu * the mean over
    parameter tensors of the mean smooth-L1 distance to the global model)."""
