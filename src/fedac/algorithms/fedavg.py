"""FedAvg (McMahan et al. 2017; fedmlac.md Eq. 2-3): local SGD, n_k-weighted parameter mean.

The server combination is `aggregation.aggregate`, so `aggregation.method=lpa` turns this into
"FedAvg + LPA" (fedmlac.md Eq. 10-14) with no other change.
"""

from __future__ import annotations

from typing import Any

import torch

from fedac.algorithms.base import (
    Algorithm,
    ClientData,
    ClientResult,
    Params,
    model_params,
    reproduces,
)
from fedac.algorithms.cohort import supervised_cohort
from fedac.training.local import train_supervised


class FedAvg(Algorithm):
    name = "fedavg"
    dp_compatible = True
    # (FedProx, FedOpt's pseudo-gradient and FedMMD inherit it: their servers take the mean)
    sums_uploads = True

    def init_server(self) -> dict[str, Any]:
        return {"params": self.initial_params(self.cfg.model.name, "global-init")}

    def regularizer(self, global_params: Params):
        """Extra local loss term given the round's global parameters; None for plain FedAvg."""
        return None

    def client_update(
        self,
        payload: Params,
        state: Any,
        data: ClientData,
        round_idx: int,
        generator: torch.Generator,
    ) -> ClientResult:
        model = self.scratch_model(self.cfg.model.name, payload)
        metrics = train_supervised(
            model, data.x, data.y, self.cfg.train, generator, self.regularizer(payload)
        )
        return ClientResult(model_params(model), None, metrics)

    @reproduces(client_update)
    def cohort_update(
        self, payload: Params, states: list[Any], datas: list[ClientData], round_idx: int, seed: int
    ) -> list[ClientResult]:
        return supervised_cohort(self, payload, datas, round_idx, seed, self.regularizer)

    def server_update(
        self, server: dict[str, Any], uploads: list[tuple[Params, int]], round_idx: int
    ) -> tuple[dict[str, Any], dict[str, float]]:
        params, metrics = self.combine(server, uploads)
        return {**server, "params": params}, metrics
