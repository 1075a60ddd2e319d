"""Local training alone (the local-only baseline of personalised FL, e.g. PFLlib's "Local"): every
client trains its own network on its own data, from the common initial model, and nothing is
uploaded or aggregated. Each round a client trains `train.*`'s local update on its model as it
left the last one, so its model after R visits is R local updates of plain SGD, with no server in
between.

There is no aggregate and no shared model, so DP noise, a robust aggregation rule and model
poisoning have nothing to act on: `dp.mode` and a non-default `aggregation.method` are refused.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from fedac.algorithms.base import Params
from fedac.algorithms.partial import PartlyShared
from fedac.errors import ConfigError
from fedac.models.parts import entry_names


class Local(PartlyShared):
    name = "local"
    dp_compatible = False
    sums_uploads = False
    # (it is the partly shared models' baseline: their network, nothing shared)
    one_architecture = "trains the partly shared baselines' network alone"

    def __init__(self, cfg, task, runtime=None):
        if cfg.aggregation.method != "mean":
            raise ConfigError(
                f"local aggregates nothing, so aggregation.method={cfg.aggregation.method} would "
                "have no effect: leave it at mean"
            )
        if cfg.dp.mode != "none":
            raise ConfigError(
                f"local uploads nothing, so dp.mode={cfg.dp.mode} has nothing to clip or noise: "
                "set dp.mode=none"
            )
        super().__init__(cfg, task, runtime)

    def private_entries(self, model: nn.Module) -> set[str]:
        return set(entry_names(model))

    def global_model(self, server: dict[str, Any]) -> None:
        return None  # nothing is shared

    def server_update(
        self, server: dict[str, Any], uploads: list[tuple[Params, int]], round_idx: int
    ) -> tuple[dict[str, Any], dict[str, float]]:
        return server, {}
