"""FedDyn's settings (algorithms/feddyn.py).

Settings are read and checked before torch loads: this module imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

from fedac.fields import number
from fedac.registry import choice


@dataclass
class FedDynConfig:
    alpha: float = number(0.01, ">= 0")
    """alpha of Algorithm 1: the weight of the dynamic regulariser (alpha/2 ||theta -
    theta^{t-1}||^2 minus the client's linear term) and of the server's correction h / alpha. 0
    switches both off: FedAvg with the same steps."""
    m: str = choice("all", ("all", "training"))
    """m of the server's step h^t = h^{t-1} - alpha / m sum_k (theta_k^t - theta^{t-1}): all (every
    client of the task, those without training windows included: the default, which the committed
    tables ran) or training (only the clients that hold training windows and can ever be sampled,
    as Algorithm 1's m, the number of devices that train, reads)."""


#: The server's mean in Algorithm 1 is unweighted (1/|P_t| sum over the active clients).
RUN_DEFAULTS = {"aggregation.weighting": "uniform"}
