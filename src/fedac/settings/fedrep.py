"""FedRep's settings (algorithms/fedrep.py).

Settings are read and checked before torch loads: this module imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

from fedac.fields import number


@dataclass
class FedRepConfig:
    head_epochs: int = number(10, ">= 1")
    """Local epochs of the head phase (Collins et al. 2021, Algorithm 1 lines 6-8: tau_h updates of
    the head, the body fixed) before `train.local_epochs` epochs of the body (lines 9-11, the head
    fixed). 10 is the reference code's default (11 local epochs, 1 of them the body's)."""
