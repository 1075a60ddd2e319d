"""FedOPT family (Reddi et al. 2021, "Adaptive Federated Optimization", Alg. 2): a server optimizer
on the pseudo-gradient Delta_t = aggregate(client models) - x_t.

    m_t = beta1 * m_{t-1} + (1 - beta1) * Delta_t     (FedAvgM: m_t = momentum * m_{t-1} + Delta_t)
    FedAdagrad: v_t = v_{t-1} + Delta_t^2
    FedYogi:    v_t = v_{t-1} - (1 - beta2) * Delta_t^2 * sign(v_{t-1} - Delta_t^2)
    FedAdam:    v_t = beta2 * v_{t-1} + (1 - beta2) * Delta_t^2
    x_{t+1} = x_t + server_lr * m_t / (sqrt(v_t) + tau)     (FedAvgM: x_t + avgm_server_lr * m_t)

m and v start at zero (as Flower's strategies do; Reddi et al. allow v_{-1} >= tau^2), without bias
correction, exactly as Alg. 2 is written.

`fedopt.form=torch` is instead torch's optimizers on the gradient x_t - aggregate, as FedKWS-UI's
code runs FedOpt: FedAdam is torch.optim.Adam (bias-corrected, eps = tau) and FedAvgM
torch.optim.SGD with momentum, both on the model's parameters only; buffers (BatchNorm statistics)
take the aggregate.
"""

from __future__ import annotations

from typing import Any

import torch

from fedac.algorithms.base import Params
from fedac.algorithms.fedavg import FedAvg
from fedac.errors import ConfigError


def _second_moment(
    rule: str, v: torch.Tensor, delta_sq: torch.Tensor, beta2: float
) -> torch.Tensor:
    if rule == "adagrad":
        return v + delta_sq
    if rule == "yogi":
        return v - (1 - beta2) * delta_sq * torch.sign(v - delta_sq)
    return beta2 * v + (1 - beta2) * delta_sq


def server_step(
    rule: str,
    params: Params,
    average: Params,
    state: dict[str, Any],
    opt,
    stepped: set[str] | None = None,
) -> tuple[Params, dict[str, Any]]:
    """One server-optimizer step for rule in {adam, yogi, adagrad, avgm}; returns new params and
    moments. `stepped`: the entries the optimizer moves (None: every floating entry); the others
    take the average. `opt.form == "torch"` bias-corrects Adam's moments with the step count kept in
    the state."""
    new_params, new_m, new_v = {}, {}, {}
    step = int(state.get("step", 0)) + 1
    torch_form = getattr(opt, "form", "reddi") == "torch"
    for name, x in params.items():
        if not x.is_floating_point() or (stepped is not None and name not in stepped):
            new_params[name] = average[name]
            continue
        delta = average[name] - x
        m_prev = state["m"].get(name, torch.zeros_like(x))
        if rule == "avgm":
            new_m[name] = opt.momentum * m_prev + delta
            new_params[name] = x + opt.avgm_server_lr * new_m[name]
            continue
        new_m[name] = opt.beta1 * m_prev + (1 - opt.beta1) * delta
        new_v[name] = _second_moment(
            rule, state["v"].get(name, torch.zeros_like(x)), delta.square(), opt.beta2
        )
        if torch_form and rule == "adam":  # torch.optim.Adam: bias-corrected moments
            m_hat, v_hat = new_m[name] / (1 - opt.beta1**step), new_v[name] / (1 - opt.beta2**step)
            new_params[name] = x + opt.server_lr * m_hat / (v_hat.sqrt() + opt.tau)
            continue
        new_params[name] = x + opt.server_lr * new_m[name] / (new_v[name].sqrt() + opt.tau)
    moments: dict[str, Any] = {"m": new_m, "v": new_v}
    if torch_form:  # a tensor, so the state still travels as a dict of tensors
        moments["step"] = torch.tensor(step)
    return new_params, moments


class FedOpt(FedAvg):
    """Base for the server-optimizer variants; `rule` picks the update."""

    rule = "adam"
    dp_compatible = False  # the server's optimiser step transforms the noised aggregate further

    def init_server(self) -> dict[str, Any]:
        return {**super().init_server(), "moments": {"m": {}, "v": {}}}

    def server_update(
        self, server: dict[str, Any], uploads: list[tuple[Params, int]], round_idx: int
    ) -> tuple[dict[str, Any], dict[str, float]]:
        average, metrics = self.combine(server, uploads)
        stepped = None
        if self.cfg.fedopt.form == "torch":
            stepped = {
                name for name, _ in self.scratch_model(self.cfg.model.name).named_parameters()
            }
        elif self.cfg.fedopt.form != "reddi":
            raise ConfigError(f"fedopt.form must be reddi or torch, got {self.cfg.fedopt.form!r}")
        params, moments = server_step(
            self.rule, server["params"], average, server["moments"], self.cfg.fedopt, stepped
        )
        return {**server, "params": params, "moments": moments}, metrics


class FedAdam(FedOpt):
    name, rule = "fedadam", "adam"


class FedYogi(FedOpt):
    name, rule = "fedyogi", "yogi"


class FedAdagrad(FedOpt):
    name, rule = "fedadagrad", "adagrad"


class FedAvgM(FedOpt):
    name, rule = "fedavgm", "avgm"
