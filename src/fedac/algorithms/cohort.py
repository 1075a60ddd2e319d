"""Stacked client steps: the cohort hooks of the FedAvg family (fedavg.py, so FedProx and FedOPT too) and
of FedMLAC (fedmlac.py), on the machinery of training/cohort.py.

Each function is its sequential counterpart (`local.train_supervised`, `FedMLAC.client_update`)
written for a chunk of stacked clients: the same batches, dropout masks, loss functions (called with
per-sample weights, so padding counts for nothing and each client keeps its own batch mean), SGD
update (`train.optimizer`, each client's gradient clipped at `train.max_grad_norm`) and order of forward
passes. The numbers therefore match the sequential path to float rounding (tests/test_cohort.py,
tests/test_stacked_models.py). Each architecture's stacked forward is `Algorithm.stacked_forward`: the
hand-written CRNN (models/stacked.py) for the zoo's CRNNs, training/functional.py's vmapped module for
any other network; the engine (`Algorithm.execution_path`) sends a configuration with no stacked form
to the sequential path and says so, so nothing here falls back.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from fedac.algorithms.base import Algorithm
from fedac.algorithms.mutual import personalized_loss, plugin_loss
from fedac.errors import ConfigError
from fedac.models.stacked import stack_params
from fedac.training.cohort import CohortChunk, OnDevices, broadcast_params, grads_of, group_positions, plan_chunks, run_chunks
from fedac.training.functional import clip_stacked, param_leaves, stacked_optimizer, with_buffers
from fedac.training.local import cross_entropy
from fedac.training.types import ClientData, ClientResult, Params


class ParameterView:
    """What a regularizer (e.g. FedProx's proximal term) sees of one client on the cohort path: its
    parameters, as `named_parameters()` / `parameters()`; it has no forward pass."""

    def __init__(self, params: Params):
        self._params = params

    def named_parameters(self):
        return iter(self._params.items())

    def parameters(self):
        return iter(self._params.values())


def _client_views(params: Params, active: int) -> list[ParameterView]:
    unbound = {name: value.unbind(0) for name, value in params.items()}  # one backward node, not one per client
    return [ParameterView({name: parts[k] for name, parts in unbound.items()}) for k in range(active)]


def _first(params: Params, active: int) -> Params:
    return {name: value[:active] for name, value in params.items()}


def _chunks_trained(algo: Algorithm, train: Callable[[CohortChunk], list[tuple[int, ClientResult]]],
                    datas: list[ClientData], positions, arch: str, round_idx: int, seed: int):
    """(position, result) of every client of architecture `arch`: its chunks planned by the algorithm's
    packing and trained on its devices (the probe, while `arch` is unmeasured, alone first)."""
    probing = algo.packing.probing(arch)  # asked before planning: planning the probe measures it
    chunks = plan_chunks(datas, positions, algo.cfg.train, round_idx, seed, algo.packing, arch)
    return run_chunks(train, chunks, algo.cfg.train, algo.device, algo.devices, probing)


class StackedStep:
    """One stacked model's training state in a chunk: its (clients, ...) parameters and buffers, its
    stacked optimizer (`train.optimizer`) and forward (`Algorithm.stacked_forward`)."""

    def __init__(self, forward, params: Params, cfg):
        self.forward, self.params, self.cfg = forward, params, cfg
        self.optimizer = stacked_optimizer({n: params[n] for n in forward.param_names}, cfg)

    def leaves(self, active: int) -> tuple[Params, Params]:
        """(gradient leaves, leaves + buffers) over the first `active` clients."""
        leaf = param_leaves(self.params, active, self.forward.param_names)
        return leaf, with_buffers(leaf, self.params, active, self.forward.buffer_names)

    def frozen(self, active: int) -> Params:
        """The first `active` clients' entries without autograd (a teacher's forward)."""
        return _first(self.params, active)

    def update(self, loss: torch.Tensor, leaf: Params, active: int) -> None:
        """Backward of the chunk's summed loss, each client's gradient clipped (`train.max_grad_norm`), the step."""
        grads = grads_of(loss.sum(), leaf)
        clip_stacked(grads, self.cfg.max_grad_norm)
        self.optimizer.step(grads, active)

    def client(self, k: int) -> Params:
        return {name: value[k].clone() for name, value in self.params.items()}


def supervised_cohort(algo: Algorithm, payload: Params, datas: list[ClientData], round_idx: int, seed: int,
                      regularizer: Callable[[Params], Callable[[Any], torch.Tensor] | None] | None = None
                      ) -> list[ClientResult]:
    """FedAvg's client update (`local.train_supervised` from the global model) for a whole cohort;
    `regularizer(global_params)` gives the extra loss term of a client (FedProx's), built per device."""
    cfg = algo.cfg.train
    payloads = OnDevices(payload)
    forward = algo.stacked_forward(algo.cfg.model.name)
    results: list[ClientResult | None] = [None] * len(datas)

    def train(chunk: CohortChunk) -> list[tuple[int, ClientResult]]:
        start = payloads(chunk.device)
        penalty = regularizer(start) if regularizer is not None else None
        model = StackedStep(forward, broadcast_params(start, len(chunk)), cfg)
        loss_sum = torch.zeros(len(chunk), dtype=torch.float64, device=chunk.x.device)
        for step in chunk.steps:
            x, y = chunk.batch(step)
            leaf, state = model.leaves(step.active)
            loss = cross_entropy(forward(state, x, chunk.dropout(step), step.weight), y, step.weight)
            if penalty is not None:
                loss = loss + torch.stack([penalty(view) for view in _client_views(leaf, step.active)])
            model.update(loss, leaf, step.active)
            loss_sum[:step.active] += loss.detach()
        out = []
        for k, (position, total) in enumerate(zip(chunk.positions, loss_sum.tolist())):  # one host sync a chunk
            steps = chunk.client_steps[k]
            out.append((position, ClientResult(model.client(k), None, {"loss": total / steps, "steps": float(steps)})))
        return out

    for position, result in _chunks_trained(algo, train, datas, range(len(datas)), algo.cfg.model.name, round_idx,
                                            seed):
        results[position] = result
    return results  # type: ignore[return-value]


def mutual_cohort(algo: Algorithm, payload: Params, states: list[Params], datas: list[ClientData], round_idx: int,
                  seed: int) -> list[ClientResult]:
    """FedMLAC's client update (Algorithm 1: personalized step, then Plug-in step, per batch) for a whole
    cohort, one stacked group per personalized architecture."""

    cfg, opts = algo.cfg.train, algo.cfg.fedmlac
    if opts.teacher not in ("pre_update", "post_update"):
        raise ConfigError(f"fedmlac.teacher must be pre_update or post_update, got {opts.teacher!r}")
    theta_model = algo.stacked_forward(opts.plugin_model)
    mutual = algo.mutual(round_idx)
    results: list[ClientResult | None] = [None] * len(datas)
    payloads = OnDevices(payload)

    def train(omega_model, chunk: CohortChunk) -> list[tuple[int, ClientResult]]:
        omega = stack_params([states[i] for i in chunk.positions])
        omega = {name: value.to(chunk.device) for name, value in omega.items()}  # (no copy on the states' device)
        omega, theta = StackedStep(omega_model, omega, cfg), StackedStep(theta_model, broadcast_params(
            payloads(chunk.device), len(chunk)), cfg)
        sums = torch.zeros(2, len(chunk), dtype=torch.float64, device=chunk.x.device)
        for step in chunk.steps:
            x, y = chunk.batch(step)
            active, weight, masks = step.active, step.weight, chunk.dropout(step)
            # Personalized model step (Eq. 8), the Plug-in as a fixed teacher.
            leaf, state = omega.leaves(active)
            omega_logits = omega_model(state, x, masks, weight)
            theta_teacher = None
            if mutual:
                with torch.no_grad():
                    theta_teacher = theta_model(theta.frozen(active), x, masks, weight)
            loss_omega = personalized_loss(omega_logits, theta_teacher, y, opts.alpha, opts.temperature, mutual,
                                           weight)
            omega.update(loss_omega, leaf, active)
            # Plug-in step (Eq. 9), the personalized model as the teacher.
            if opts.teacher == "post_update":
                with torch.no_grad():
                    omega_logits = omega_model(omega.frozen(active), x, masks, weight)
            leaf, state = theta.leaves(active)
            loss_theta = plugin_loss(theta_model(state, x, masks, weight), omega_logits.detach(), y, opts.temperature,
                                     opts.plugin_ce_weight, mutual, weight)
            theta.update(loss_theta, leaf, active)
            sums[0, :active] += loss_omega.detach()
            sums[1, :active] += loss_theta.detach()
        out = []
        losses, plugin_losses = sums.tolist()  # one host sync a chunk
        for k, position in enumerate(chunk.positions):
            steps = chunk.client_steps[k]
            out.append((position, ClientResult(theta.client(k), omega.client(k),
                                               {"loss": losses[k] / steps, "plugin_loss": plugin_losses[k] / steps})))
        return out

    for arch, positions in group_positions([algo.client_architecture(d.name) for d in datas]).items():
        for position, result in _chunks_trained(algo, partial(train, algo.stacked_forward(arch)),
                                                [datas[i] for i in positions], positions, arch, round_idx, seed):
            results[position] = result
    return results  # type: ignore[return-value]
