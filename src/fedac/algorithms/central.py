"""Centralised training (FedKWS-UI Table 2's column, the official code's train_classify.py): one
model trained on every training clip, the upper bound the federated methods are compared with.

It runs through the simulator like any algorithm, so it writes the same run directory and resumes
exactly: the data is one client holding every training clip (`data.partition=pooled`, the default
for this algorithm), a round is one local update of `train.local_epochs` passes (1: one epoch, the
Table 2 protocol), and the optimiser's state (SGD momentum or AdamW moments) is that client's
persistent state, so it carries over the rounds as in one long training job. The learning rate of
round t = 0..T-1 (T = train.rounds) is the code's schedule with W = central.warmup_epochs, p =
central.decay_power:

    lr_t = lr (t + 1) / W                      for t < W   (linear warm-up, reaching lr at round W),
    lr_t = lr (1 - (t - W) / (T - W))^p        for t >= W  (quadratic decay for p = 2),

held for the whole round. The spec writes the decay as (1 - (t - 5) / (T - 5))^2 with epochs counted
from the end of warm-up; whether the warm-up's first epoch runs at lr / W or 0 is not stated, and
this reads it as (t + 1) / W so that no epoch is wasted at lr 0. Evaluation, model selection, FA /
FR and the test curve are the engine's, as for the federated methods.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from fedac.algorithms.base import Algorithm, ClientData, ClientResult, Params, Task, model_params
from fedac.config import Config
from fedac.errors import ConfigError
from fedac.training.local import make_optimizer, train_supervised


def scheduled_lr(base_lr: float, round_idx: int, rounds: int, warmup: int, power: float) -> float:
    """lr of round `round_idx` (1-based, as the engine counts) of `rounds`: linear warm-up, then (1
    - x)^power."""
    t = round_idx - 1
    if t < warmup:
        return base_lr * (t + 1) / warmup
    return base_lr * (1.0 - (t - warmup) / (rounds - warmup)) ** power


class Central(Algorithm):
    name = "central"
    centralised = True

    def __init__(self, cfg: Config, task: Task, runtime=None):
        super().__init__(cfg, task, runtime)
        c = cfg.central
        if len(task.clients) != 1:
            raise ConfigError(
                f"algorithm central trains one model on all training data, but data.partition="
                f"{cfg.data.partition} gives {len(task.clients)} clients; unset data.partition or "
                "set it to pooled"
            )
        if c.warmup_epochs < 0 or c.warmup_epochs >= cfg.train.rounds:
            raise ConfigError(
                f"central.warmup_epochs must lie in [0, train.rounds={cfg.train.rounds}), got "
                f"{c.warmup_epochs}"
            )
        if c.decay_power < 0:
            raise ConfigError(f"central.decay_power must be >= 0, got {c.decay_power}")

    def init_server(self) -> dict[str, Any]:
        return {"params": self.initial_params(self.cfg.model.name, "global-init")}

    def lr(self, round_idx: int) -> float:
        c = self.cfg.central
        return scheduled_lr(
            self.cfg.train.lr, round_idx, self.cfg.train.rounds, c.warmup_epochs, c.decay_power
        )

    def client_update(
        self,
        payload: Params,
        state: Any,
        data: ClientData,
        round_idx: int,
        generator: torch.Generator,
    ) -> ClientResult:
        model = self.scratch_model(self.cfg.model.name, payload)
        optimizer = make_optimizer(model.parameters(), self.cfg.train)
        if state is not None:
            optimizer.load_state_dict(state)
        lr = self.lr(round_idx)
        for group in optimizer.param_groups:
            group["lr"] = lr
        metrics = train_supervised(
            model, data.x, data.y, self.cfg.train, generator, optimizer=optimizer
        )
        # A copy: load_state_dict shares the buffers, which the next round's steps change in place.
        return ClientResult(
            model_params(model), copy.deepcopy(optimizer.state_dict()), {**metrics, "lr": lr}
        )

    def server_update(
        self, server: dict[str, Any], uploads: list[tuple[Params, int]], round_idx: int
    ) -> tuple[dict[str, Any], dict[str, float]]:
        ((params, _),) = uploads  # the one client's model is the model
        return {**server, "params": params}, {"lr": self.lr(round_idx)}
