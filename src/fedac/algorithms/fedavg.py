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
from fedac.training.functional import StackedStep, client_views
from fedac.training.local import cross_entropy, train_supervised
from fedac.training.stacking import CohortChunk, OnDevices, broadcast_params, train_cohort


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
        """FedAvg's client update (`local.train_supervised` from the global model) for a whole
        cohort; `self.regularizer(global_params)` gives the extra loss term of a client (FedProx's),
        built per device."""
        cfg = self.cfg.train
        payloads = OnDevices(payload)
        forward = self.stacked_forward(self.cfg.model.name)

        def train(chunk: CohortChunk) -> list[tuple[int, ClientResult]]:
            start = payloads(chunk.device)
            penalty = self.regularizer(start)
            model = StackedStep(forward, broadcast_params(start, len(chunk)), cfg)
            loss_sum = torch.zeros(len(chunk), dtype=torch.float64, device=chunk.device)
            for step in chunk.steps:
                x, y = chunk.batch(step)
                leaf, state = model.leaves(step.active)
                loss = cross_entropy(
                    forward(state, x, chunk.dropout(step), step.weight), y, step.weight
                )
                if penalty is not None:
                    loss = loss + torch.stack(
                        [penalty(view) for view in client_views(leaf, step.active)]
                    )
                model.update(loss, leaf, step.active)
                loss_sum[: step.active] += loss.detach()
            out = []
            # one host sync a chunk
            for k, (position, total) in enumerate(zip(chunk.positions, loss_sum.tolist())):
                steps = chunk.client_steps[k]
                out.append(
                    (
                        position,
                        ClientResult(
                            model.client(k), None, {"loss": total / steps, "steps": float(steps)}
                        ),
                    )
                )
            return out

        return train_cohort(self, train, datas, self.cfg.model.name, round_idx, seed)

    def server_update(
        self, server: dict[str, Any], uploads: list[tuple[Params, int]], round_idx: int
    ) -> tuple[dict[str, Any], dict[str, float]]:
        params, metrics = self.combine(server, uploads)
        return {**server, "params": params}, metrics
