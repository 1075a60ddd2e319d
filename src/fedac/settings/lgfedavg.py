"""LG-FedAvg's settings (algorithms/lgfedavg.py).

Settings are read and checked before torch loads: this module imports no torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LGFedAvgConfig:
    warm_start: str | None = None
    """The official code's warm start: the run directory of a FedAvg run of the same network
    (`fedac run --algorithm fedavg ...`), whose global model at its last checkpoint is every
    client's initial network and the server's initial head, as LG-FedAvg's code starts every client
    from a FedAvg-trained model. None (the default): the common random initial model, as the
    committed tables ran."""
