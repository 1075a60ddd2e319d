"""Ditto (Li, Hu, Beirami and Smith, "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML 2021), Algorithm 1: a shared model trained as FedAvg trains it, and on each
client a personal model regularised towards the round's global model.

A sampled client k receives w^t and runs two updates on its data:
- the global one, FedAvg's local solver from w^t (`train.local_epochs` of `train.optimizer`),
  uploaded and averaged as FedAvg averages (`aggregation.method`);
- the personal one, from its own v_k, on h_k(v; w^t) = F_k(v) + lambda/2 ||v - w^t||^2
  (`ditto.lam`): each step adds lambda (v_k - w^t) to the data gradient, as Algorithm 1's update
  v_k <- v_k - eta (grad F_k(v_k) + lambda (v_k - w^t)). It takes as many steps as the global one
  (Algorithm 1's s), over its own draw of batches and dropout masks.
lambda = 0 leaves the personal models trained on their own data alone. The personal models start
from the global model's initial weights w^0 and never leave the client; the run's personalized
metrics evaluate them on the clients' held-out data. Both updates train stacked (the personal one a
`LocalObjective` starting from the client's own v_k). The global model is the mean of the uploads,
so DP, the robust rules and model-poisoning attacks apply as to FedAvg.
"""

from __future__ import annotations

from typing import Any

import torch

from fedac.algorithms.base import (
    ClientData,
    ClientResult,
    OneArchitecture,
    Params,
    reproduces,
)
from fedac.algorithms.fedavg import FedAvg
from fedac.algorithms.objective import LocalObjective
from fedac.seeding import derive_seed, torch_generator
from fedac.training.stacking import client_progress


class Ditto(OneArchitecture, LocalObjective, FedAvg):
    name = "ditto"
    reads_model_once = True
    personalized = True
    trains_ssl_encoders = False
    one_architecture = "regularises each personal model towards the global one"

    def init_client_state(self, client: str) -> Params:
        return self.initial_params(self.cfg.model.name, "global-init")  # v_k = w^0

    # --- the personal update: a local objective from the client's own v_k ----------------------
    def own_start(self, payload: Params, state: Params) -> Params:
        return state

    def transform_grads(self, grads, params, state, payload) -> Params:
        lam = self.cfg.ditto.lam
        return {n: g + lam * (params[n].detach() - payload[n]) for n, g in grads.items()}

    def finish_local(self, params, state, payload, steps) -> tuple[None, Params]:
        return None, params

    def _personal_seed(self, seed: int) -> int:
        """The personal update's own batches and dropout masks (the global update's use `seed`)."""
        return derive_seed(seed, "ditto-personal")

    # --- both updates ---------------------------------------------------------------------------
    def client_update(
        self, payload: Params, state: Any, data: ClientData, round_idx: int, generator
    ) -> ClientResult:
        shared = FedAvg.client_update(self, payload, None, data, round_idx, generator)
        seed = self._personal_seed(self.cfg.seed)
        # the global RNG draws dropout: seeded as train_client seeds it, under the personal seed
        torch.manual_seed(derive_seed(seed, "dropout", round_idx, data.name))
        own = LocalObjective.client_update(
            self,
            payload,
            state,
            data,
            round_idx,
            torch_generator(seed, "batches", round_idx, data.name),
        )
        return _joined(shared, own)

    @reproduces(client_update)
    def cohort_update(
        self, payload: Params, states: list[Any], datas: list[ClientData], round_idx: int, seed: int
    ) -> list[ClientResult]:
        with client_progress(lambda count: None):  # a client is done after its personal update
            shared = FedAvg.cohort_update(
                self, payload, [None] * len(datas), datas, round_idx, seed
            )
        own = LocalObjective.cohort_update(
            self, payload, states, datas, round_idx, self._personal_seed(seed)
        )
        return [_joined(s, o) for s, o in zip(shared, own)]


def _joined(shared: ClientResult, own: ClientResult) -> ClientResult:
    """The global update's upload and metrics with the personal model as the client's state."""
    metrics = {**shared.metrics, "personal_loss": own.metrics["loss"]}
    return ClientResult(shared.upload, own.state, metrics)
