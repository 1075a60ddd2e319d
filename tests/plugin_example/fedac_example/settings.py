# fedac_example/settings.py
"""The settings of the fedavg_lr algorithm: `--set fedavg_lr.server_lr=0.5`. No torch here."""

from dataclasses import dataclass

from fedac.fields import number


@dataclass
class FedAvgLRSettings:
    server_lr: float = number(1.0, "> 0")
    """Server step: theta <- theta + server_lr * (mean of the uploads - theta); 1 is FedAvg."""
