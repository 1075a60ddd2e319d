"""FedRep's settings (algorithms/fedrep.py).

Settings are read and checked before torch loads: this module imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

from fedac.fields import number


@dataclass
class FedRepConfig:
    head_epochs: int = number(10, ">= 1")
    """Local epochs of the head phase (Collins et al. 2021, Algorithm 1: tau_h updates of the head,
    the body fixed) before `train.local_epochs` epochs of the body (tau_phi updates, the head
    fixed). 10: the head epochs of the reference code's default schedule (11 local epochs, the last
    one the body's)."""
