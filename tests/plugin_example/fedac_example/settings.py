# fedac_example/settings.py
"""The plug-ins' settings: `--set fedavg_lr.server_lr=0.5` (the algorithm's own section) and
`--set aggregation.drop=2` (the aggregator's, a field of the aggregation section). No torch here."""

from dataclasses import dataclass

from fedac.fields import number


@dataclass
class FedAvgLRSettings:
    server_lr: float = number(1.0, "> 0")
    """Server step: theta <- theta + server_lr * (mean of the uploads - theta); 1 is FedAvg."""


@dataclass
class DropFarthestSettings:
    drop: int = number(1, ">= 0")
    """drop_farthest: how many uploads farthest from the cohort's mean are left out (two are always
    kept)."""
