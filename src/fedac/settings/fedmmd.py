"""FedMMD's settings (algorithms/fedmmd.py).

Settings are read and checked before torch loads: this module imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

from fedac.fields import number


@dataclass
class FedMMDConfig:
    weight: float = number(0.01, ">= 0")
    """lambda of CE + lambda * MMD^2(local, frozen global penultimate features) (official script:
    0.01)."""


#: FedMMD, FedKWS-UI's KWS baseline, shares its default cohort and rounds (settings/fedkwsui.py).
RUN_DEFAULTS = {"data.max_clients": 48, "train.fraction": 0.25, "train.rounds": 40}
