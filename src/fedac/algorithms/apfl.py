"""APFL (Deng, Kamani and Mahdavi, "Adaptive Personalized Federated Learning", 2020), Algorithm 1
with the adaptive mixing weight: each client keeps a local model v_i and a weight alpha_i, and its
personalised model is the mixture of parameters v_bar_i = alpha_i v_i + (1 - alpha_i) w_i.

A sampled client receives w and, from w_i = w, takes on every batch xi (all three gradients at the
step's start, then all three steps):

    w_i     <- w_i - eta grad f_i(w_i; xi)                  (the global model's local copy)
    v_i     <- v_i - eta grad_v f_i(v_bar_i; xi)           (= alpha_i grad f_i(v_bar_i; xi))
    alpha_i <- alpha_i - eta_alpha grad_alpha f_i(v_bar_i; xi)   (= <v_i - w_i, grad f_i(v_bar_i)>)

with eta and the optimiser `train.lr` / `train.optimizer` (one each for w_i and v_i), eta_alpha
`apfl.alpha_lr`, alpha_i kept in [0, 1] (`apfl.learn_alpha=false` holds it at `apfl.alpha`). The
server averages the w_i as FedAvg does (`aggregation.method`), so DP, the robust rules and
model-poisoning attacks apply as to FedAvg. Choices where the paper leaves them open: v_i starts
from the global model's initial weights; v_bar_i's forward uses v_i's BatchNorm statistics (which
its training updates); the personalised model a client keeps for evaluation is v_bar_i at the end
of its last round, mixed with that round's w_i (the paper's output mixes with the final w). Each
client keeps two models (v_i and v_bar_i) and alpha_i.

Both paths: `client_update` trains one client (two nn.Modules); `cohort_update` a cohort at once,
w_i and v_i two stacked models of a chunk's clients and alpha_i one entry per client, the same
steps in the same order (each client's batches and dropout masks as it draws them alone).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedac.algorithms.base import (
    ClientData,
    ClientResult,
    OneArchitecture,
    Params,
    model_params,
    reproduces,
)
from fedac.algorithms.fedavg import FedAvg
from fedac.models.stacked import stack_params
from fedac.training.functional import StackedStep, clip_stacked
from fedac.training.local import (
    client_batches,
    clip_gradients,
    cross_entropy,
    make_optimizer,
    on_device,
)
from fedac.training.stacking import CohortChunk, OnDevices, broadcast_params, grads_of, train_cohort
from fedac.training.types import class_labels, feature_windows

#: alpha's entry among the personal loss's gradient leaves (no module parameter is named so)
_ALPHA = "<apfl alpha>"


def mixture(alpha: torch.Tensor, local: Params, shared: Params) -> Params:
    """alpha * local + (1 - alpha) * shared for the entries `shared` holds (the parameters); the
    others (BatchNorm's statistics) `local`'s. `alpha` one weight, or one per client along the
    leading axis of stacked entries."""

    def mix(v: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        a = alpha.view(*alpha.shape, *[1] * (v.dim() - alpha.dim()))
        return a * v + (1 - a) * w

    return {n: mix(v, shared[n]) if n in shared else v for n, v in local.items()}


class APFL(OneArchitecture, FedAvg):
    name = "apfl"
    personalized = True
    trains_ssl_encoders = False
    one_architecture = "mixes each local model with the global one parameter by parameter"

    def init_client_state(self, client: str) -> dict[str, Any]:
        start = self.initial_params(self.cfg.model.name, "global-init")
        return {
            "local": start,
            "personal": {n: v.clone() for n, v in start.items()},
            "alpha": torch.tensor(self.cfg.apfl.alpha),
        }

    def client_update(
        self, payload: Params, state: Any, data: ClientData, round_idx: int, generator
    ) -> ClientResult:
        cfg, opts, arch = self.cfg.train, self.cfg.apfl, self.cfg.model.name
        shared = self.scratch_model(arch, payload)
        local = self.scratch_model(arch, state["local"], role="apfl-local")
        shared.train(), local.train()
        optimizers = (
            make_optimizer(shared.parameters(), cfg),
            make_optimizer(local.parameters(), cfg),
        )
        x, y = feature_windows(data.x, "APFL"), class_labels(data.y, "APFL")
        alpha = state["alpha"].detach().clone().to(y.device)
        sums = torch.zeros(2, dtype=torch.float64, device=y.device)
        steps = 0
        for idx in on_device(client_batches(data.num_samples, cfg, generator), x):
            a = alpha.clone().requires_grad_(opts.learn_alpha)
            w_now = {n: p.detach().clone() for n, p in shared.named_parameters()}
            loss_w = F.cross_entropy(shared(x[idx]), y[idx])
            mixed = mixture(a, dict(local.named_parameters()), w_now)
            loss_v = F.cross_entropy(functional_call(local, mixed, (x[idx],)), y[idx])
            for optimizer in optimizers:
                optimizer.zero_grad(set_to_none=True)
            (loss_w + loss_v).backward()  # disjoint leaves: each loss's own gradients
            clip_gradients(shared, cfg)
            clip_gradients(local, cfg)
            for optimizer in optimizers:
                optimizer.step()
            if opts.learn_alpha and a.grad is not None:
                alpha = (alpha - opts.alpha_lr * a.grad).clamp(0.0, 1.0)
            sums += torch.stack([loss_w.detach(), loss_v.detach()]).double()
            steps += 1
        kept_local, kept_shared = model_params(local), model_params(shared)
        weights = {n: kept_shared[n] for n, _ in shared.named_parameters()}
        new_state = {
            "local": kept_local,
            "personal": mixture(alpha, kept_local, weights),
            "alpha": alpha.detach(),
        }
        losses = (sums / max(steps, 1)).tolist()
        metrics = {
            "loss": losses[0],
            "personal_loss": losses[1],
            "alpha": float(alpha),
            "steps": float(steps),
        }
        return ClientResult(kept_shared, new_state, metrics)

    def personalized_model(self, client: str, state: Any):
        return self.scratch_model(self.cfg.model.name, state["personal"], role="personal")

    @reproduces(client_update)
    def cohort_update(
        self, payload: Params, states: list[Any], datas: list[ClientData], round_idx: int, seed: int
    ) -> list[ClientResult]:
        """`client_update` for a cohort: per chunk, the clients' w_i (from the payload) and v_i
        (their own) as two stacked models and their alpha_i as one vector; each step takes both
        losses and all gradients at the step's start, then both steps and alpha's."""
        cfg, opts, arch = self.cfg.train, self.cfg.apfl, self.cfg.model.name
        forward = self.stacked_forward(arch)
        payloads = OnDevices(payload)

        def train(chunk: CohortChunk) -> list[tuple[int, ClientResult]]:
            device, own = chunk.device, [states[i] for i in chunk.positions]
            shared = StackedStep(forward, broadcast_params(payloads(device), len(chunk)), cfg)
            locals_ = {n: v.to(device) for n, v in stack_params([s["local"] for s in own]).items()}
            local = StackedStep(forward, locals_, cfg)
            alpha = torch.stack([s["alpha"] for s in own]).to(device)
            sums = torch.zeros(2, len(chunk), dtype=torch.float64, device=device)
            for step in chunk.steps:
                x, y = chunk.batch(step)
                active, weight, masks = step.active, step.weight, chunk.dropout(step)
                w_leaf, w_state = shared.leaves(active)
                v_leaf, v_state = local.leaves(active)
                a = alpha[:active].clone().requires_grad_(opts.learn_alpha)
                # the dropout masks in the sequential order: w_i's forward, then the mixture's
                loss_w = cross_entropy(forward(w_state, x, masks, weight), y, weight)
                w_now = {n: t.detach() for n, t in w_leaf.items()}
                mixed = mixture(a, v_state, w_now)
                loss_v = cross_entropy(forward(mixed, x, masks, weight), y, weight)
                w_grads = grads_of(loss_w.sum(), w_leaf)
                v_grads = grads_of(
                    loss_v.sum(), {**v_leaf, **({_ALPHA: a} if a.requires_grad else {})}
                )
                a_grad = v_grads.pop(_ALPHA, None)
                for model, grads in ((shared, w_grads), (local, v_grads)):
                    clip_stacked(grads, cfg.max_grad_norm)
                    model.optimizer.step(grads, active)
                if a_grad is not None:
                    alpha[:active] = (alpha[:active] - opts.alpha_lr * a_grad).clamp(0.0, 1.0)
                sums[:, :active] += torch.stack([loss_w.detach(), loss_v.detach()]).double()
            out = []
            losses = sums.tolist()  # one host sync a chunk
            for k, position in enumerate(chunk.positions):
                steps = chunk.client_steps[k]
                kept_local, kept_shared = local.client(k), shared.client(k)
                weights = {n: kept_shared[n] for n in forward.param_names}
                new_state = {
                    "local": kept_local,
                    "personal": mixture(alpha[k], kept_local, weights),
                    "alpha": alpha[k].clone(),
                }
                metrics = {
                    "loss": losses[0][k] / max(steps, 1),
                    "personal_loss": losses[1][k] / max(steps, 1),
                    "alpha": float(alpha[k]),
                    "steps": float(steps),
                }
                out.append((position, ClientResult(kept_shared, new_state, metrics)))
            return out

        return train_cohort(self, train, datas, arch, round_idx, seed)
