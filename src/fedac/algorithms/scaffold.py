"""SCAFFOLD (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated
Learning", ICML 2020), Algorithm 1 with option II, as a local objective (it trains stacked).

The server holds the model x and a control variate c, client i its own control variate c_i (zero
at first, a tensor per trainable parameter). A sampled client starts from y_i = x and corrects every
gradient of its K local steps of size eta_l (`train.lr`):

    y_i <- y_i - eta_l (g_i(y_i) - c_i + c)
    c_i+ = c_i - c + (x - y_i) / (K eta_l)                        (option II)
    upload (y_i, Delta c_i = c_i+ - c_i),  keep c_i <- c_i+

and the server, with S the round's clients and N the task's:

    x <- x + eta_g mean_S (y_i - x)       (`scaffold.server_lr`; the mean is `aggregation.method`)
    c <- c + |S| / N mean_S Delta c_i

Option II reads K eta_l as plain SGD's step, so the run defaults are `train.momentum=0` and the
paper's unweighted means (`aggregation.weighting=uniform`); another optimiser runs, its control
variates then an approximation. The robust rules replace the mean of the models; the control
variates are always the plain mean. DP and model-poisoning attacks are refused: the upload carries
the control variate beside the model, which neither clips nor poisons.
"""

from __future__ import annotations

from typing import Any

import torch

from fedac.algorithms.base import Params
from fedac.algorithms.objective import LocalObjective
from fedac.errors import ConfigError
from fedac.settings.attacks import ATTACKS


class Scaffold(LocalObjective):
    name = "scaffold"
    reads_model_once = True
    trains_ssl_encoders = False  # (a local objective reads feature windows)

    def __init__(self, cfg, task, runtime=None):
        super().__init__(cfg, task, runtime)
        if ATTACKS.load(cfg.attack.kind).poisons == "upload":
            raise ConfigError(
                f"attack.kind={cfg.attack.kind} poisons model uploads, and scaffold uploads its "
                "control variate beside the model: use a data attack (label_flip, label_permute, "
                "backdoor) with it"
            )
        if cfg.dp.mode != "none":
            raise ConfigError(
                f"dp.mode={cfg.dp.mode} clips and noises the uploaded model, and scaffold uploads "
                "its control variate beside it, which DP-FedAvg does not cover: set dp.mode=none"
            )

    def init_server(self) -> dict[str, Any]:
        return {
            "params": self.initial_params(self.cfg.model.name, "global-init"),
            "control": self.zeros_like_params(),
        }

    def broadcast(self, server: dict[str, Any]) -> dict[str, Params]:
        return {"params": server["params"], "control": server["control"]}

    def init_client_state(self, client: str) -> Params:
        return self.zeros_like_params()

    def start_params(self, payload: dict[str, Params]) -> Params:
        return payload["params"]

    def transform_grads(self, grads, params, state, payload) -> Params:
        control = payload["control"]
        return {name: g - state[name] + control[name] for name, g in grads.items()}

    def finish_local(self, params, state, payload, steps) -> tuple[dict[str, Params], Params]:
        x, control = payload["params"], payload["control"]
        scale = 1.0 / (max(steps, 1) * self.cfg.train.lr)
        fresh = {n: c_i - control[n] + (x[n] - params[n]) * scale for n, c_i in state.items()}
        delta = {n: fresh[n] - state[n] for n in fresh}
        return {"params": params, "control": delta}, fresh

    def server_update(
        self, server: dict[str, Any], uploads: list[tuple[dict[str, Params], int]], round_idx: int
    ) -> tuple[dict[str, Any], Any]:
        mean, metrics = self.combine(server, [(u["params"], n) for u, n in uploads])
        step, old = self.cfg.scaffold.server_lr, server["params"]
        params = {
            n: old[n] + step * (v - old[n]) if v.is_floating_point() else v for n, v in mean.items()
        }
        share = len(uploads) / len(self.task.clients)
        control = {
            n: c + share * torch.stack([u["control"][n] for u, _ in uploads]).mean(0)
            for n, c in server["control"].items()
        }
        return {"params": params, "control": control}, metrics
