"""SCAFFOLD's settings (algorithms/scaffold.py).

Settings are read and checked before torch loads: this module imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

from fedac.fields import number


@dataclass
class ScaffoldConfig:
    server_lr: float = number(1.0, "> 0")
    """eta_g of Algorithm 1, the server step x <- x + eta_g * mean(y_i - x); 1 takes the clients'
    mean. The local step eta_l is train.lr."""


#: SCAFFOLD's option II reads the local step count times eta_l as plain SGD's (Algorithm 1), and
#: the server's means are unweighted (1/|S| sums).
RUN_DEFAULTS = {"train.momentum": 0.0, "aggregation.weighting": "uniform"}
