"""Stacked client steps: the cohort hooks of the FedAvg family (fedavg.py, so FedProx and FedOPT
too) and of FedMLAC (fedmlac.py), on the machinery of training/cohort.py.

Each function is its sequential counterpart (`local.train_supervised`, `FedMLAC.client_update`)
written for a chunk of stacked clients: the same batches, dropout masks, loss functions (called with
per-sample weights, so padding counts for nothing and each client keeps its own batch mean), SGD
update (`train.optimizer`, each client's gradient clipped at `train.max_grad_norm`) and order of
forward passes. The numbers therefore match the sequential path to float rounding
(tests/training/test_cohort.py, tests/models/test_stacked_models.py). Each architecture's stacked
forward is `Algorithm.stacked_forward`: the hand-written CRNN (models/stacked.py) for the zoo's
CRNNs, training/functional.py's vmapped module for any other network; the engine
(`Algorithm.execution_path`) sends a configuration with no stacked form to the sequential path and
says so, so nothing here falls back.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch.func import vmap

from fedac.algorithms.base import Algorithm, model_params, reproduces
from fedac.algorithms.mutual import personalized_loss, plugin_loss
from fedac.errors import ConfigError
from fedac.models.stacked import stack_params
from fedac.seeding import torch_generator
from fedac.training.cohort import (
    CohortChunk,
    OnDevices,
    broadcast_params,
    grads_of,
    group_positions,
    plan_chunks,
    run_chunks,
)
from fedac.training.functional import clip_stacked, param_leaves, stacked_optimizer, with_buffers
from fedac.training.local import (
    client_batches,
    clip_gradients,
    cross_entropy,
    cycling_batches,
    make_optimizer,
    on_device,
)
from fedac.training.types import ClientData, ClientResult, Params, class_labels, feature_windows


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
    # one backward node, not one per client
    unbound = {name: value.unbind(0) for name, value in params.items()}
    return [
        ParameterView({name: parts[k] for name, parts in unbound.items()}) for k in range(active)
    ]


def _first(params: Params, active: int) -> Params:
    return {name: value[:active] for name, value in params.items()}


def _chunks_trained(
    algo: Algorithm,
    train: Callable[[CohortChunk], list[tuple[int, ClientResult]]],
    datas: list[ClientData],
    positions,
    arch: str,
    round_idx: int,
    seed: int,
):
    """(position, result) of every client of architecture `arch`: its chunks planned by the
    algorithm's packing and trained on its devices (the probe, while `arch` is unmeasured, alone
    first)."""
    probing = algo.packing.probing(arch)  # asked before planning: planning the probe measures it
    workers = algo.runtime.workers
    chunks = plan_chunks(
        datas, positions, algo.cfg.train, round_idx, seed, algo.packing, arch, workers
    )
    return run_chunks(train, chunks, algo.cfg.train, algo.device, algo.devices, probing, workers)


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
        """Backward of the chunk's summed loss, each client's gradient clipped
        (`train.max_grad_norm`), the step."""
        grads = grads_of(loss.sum(), leaf)
        clip_stacked(grads, self.cfg.max_grad_norm)
        self.optimizer.step(grads, active)

    def client(self, k: int) -> Params:
        return {name: value[k].clone() for name, value in self.params.items()}


def supervised_cohort(
    algo: Algorithm,
    payload: Params,
    datas: list[ClientData],
    round_idx: int,
    seed: int,
    regularizer: Callable[[Params], Callable[[Any], torch.Tensor] | None] | None = None,
) -> list[ClientResult]:
    """FedAvg's client update (`local.train_supervised` from the global model) for a whole cohort;
    `regularizer(global_params)` gives the extra loss term of a client (FedProx's), built per
    device."""
    cfg = algo.cfg.train
    payloads = OnDevices(payload)
    forward = algo.stacked_forward(algo.cfg.model.name)
    results: list[ClientResult | None] = [None] * len(datas)

    def train(chunk: CohortChunk) -> list[tuple[int, ClientResult]]:
        start = payloads(chunk.device)
        penalty = regularizer(start) if regularizer is not None else None
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
                    [penalty(view) for view in _client_views(leaf, step.active)]
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

    for position, result in _chunks_trained(
        algo, train, datas, range(len(datas)), algo.cfg.model.name, round_idx, seed
    ):
        results[position] = result
    return results  # type: ignore[return-value]


def mutual_cohort(
    algo: Algorithm,
    payload: Params,
    states: list[Params],
    datas: list[ClientData],
    round_idx: int,
    seed: int,
) -> list[ClientResult]:
    """FedMLAC's client update (Algorithm 1: personalized step, then Plug-in step, per batch) for a
    whole cohort, one stacked group per personalized architecture."""

    cfg, opts = algo.cfg.train, algo.cfg.fedmlac
    if opts.teacher not in ("pre_update", "post_update"):
        raise ConfigError(
            f"fedmlac.teacher must be pre_update or post_update, got {opts.teacher!r}"
        )
    theta_model = algo.stacked_forward(opts.plugin_model)
    mutual = algo.mutual(round_idx)  # type: ignore[attr-defined]  # FedMLAC's (importing it here: a cycle)
    results: list[ClientResult | None] = [None] * len(datas)
    payloads = OnDevices(payload)

    def train(omega_model, chunk: CohortChunk) -> list[tuple[int, ClientResult]]:
        stacked = stack_params([states[i] for i in chunk.positions])
        # (no copy on the states' device)
        stacked = {name: value.to(chunk.device) for name, value in stacked.items()}
        omega, theta = (
            StackedStep(omega_model, stacked, cfg),
            StackedStep(theta_model, broadcast_params(payloads(chunk.device), len(chunk)), cfg),
        )
        sums = torch.zeros(2, len(chunk), dtype=torch.float64, device=chunk.device)
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
            loss_omega = personalized_loss(
                omega_logits, theta_teacher, y, opts.alpha, opts.temperature, mutual, weight
            )
            omega.update(loss_omega, leaf, active)
            # Plug-in step (Eq. 9), the personalized model as the teacher.
            if opts.teacher == "post_update":
                with torch.no_grad():
                    omega_logits = omega_model(omega.frozen(active), x, masks, weight)
            leaf, state = theta.leaves(active)
            loss_theta = plugin_loss(
                theta_model(state, x, masks, weight),
                omega_logits.detach(),
                y,
                opts.temperature,
                opts.plugin_ce_weight,
                mutual,
                weight,
            )
            theta.update(loss_theta, leaf, active)
            sums[0, :active] += loss_omega.detach()
            sums[1, :active] += loss_theta.detach()
        out = []
        losses, plugin_losses = sums.tolist()  # one host sync a chunk
        for k, position in enumerate(chunk.positions):
            steps = chunk.client_steps[k]
            out.append(
                (
                    position,
                    ClientResult(
                        theta.client(k),
                        omega.client(k),
                        {"loss": losses[k] / steps, "plugin_loss": plugin_losses[k] / steps},
                    ),
                )
            )
        return out

    for arch, positions in group_positions(
        [algo.client_architecture(d.name) for d in datas]
    ).items():
        for position, result in _chunks_trained(
            algo,
            partial(train, algo.stacked_forward(arch)),
            [datas[i] for i in positions],
            positions,
            arch,
            round_idx,
            seed,
        ):
            results[position] = result
    return results  # type: ignore[return-value]


def fedkwsui_cohort(
    algo,
    payload: Params,
    states: list[Params | None],
    datas: list[ClientData],
    round_idx: int,
    seed: int,
) -> list[ClientResult]:
    """FedKWS-UI's client update (`FedKWSUI.client_update`: the private phase, then ALT's s_k global
    steps of the ALO loss) for a whole cohort. Every client's batches are drawn from its own
    generator in the sequential order (private phase first); clients are sorted by total steps so
    those still training are a prefix (ALT gives each client its own count); the optimiser starts
    afresh with the global phase."""
    cfg, opts, arch = algo.cfg.train, algo.cfg.fedkwsui, algo.cfg.model.name
    forward = algo.stacked_forward(arch)
    private_steps = int(opts.private_ratio * opts.local_steps) + 1 if opts.adv_lambda else 0
    plans = [algo.client_plan(d.name) for d in datas]
    batches = []
    for d, plan in zip(datas, plans):
        gen = torch_generator(seed, "batches", round_idx, d.name)
        batches.append(
            list(cycling_batches(d.num_samples, cfg.batch_size, private_steps, gen))
            + list(cycling_batches(d.num_samples, cfg.batch_size, int(plan["steps"]), gen))
        )
    order = sorted(range(len(datas)), key=lambda i: -len(batches[i]))
    payloads = OnDevices(payload)
    results: list[ClientResult | None] = [None] * len(datas)

    def train(chunk: CohortChunk) -> list[tuple[int, ClientResult]]:
        params = broadcast_params(payloads(chunk.device), len(chunk))
        # `private=persistent`: each client's own private head
        for k, position in enumerate(chunk.positions):
            for name, value in (states[position] or {}).items():
                params[name][k].copy_(value)
        model = StackedStep(forward, params, cfg)
        mus = torch.tensor([plans[i]["mu"] for i in chunk.positions], device=chunk.device)
        sums = torch.zeros(2, len(chunk), dtype=torch.float64, device=chunk.device)
        for s, step in enumerate(chunk.steps):
            x, y = chunk.batch(step)
            active, weight, masks = step.active, step.weight, chunk.dropout(step)
            if s == private_steps:  # the global phase's optimiser is new, as the sequential path's
                model.optimizer = stacked_optimizer(
                    {n: params[n] for n in forward.param_names}, cfg
                )
            if s < private_steps:  # only the private head learns: the encoder runs without autograd
                with torch.no_grad():
                    h = forward(model.frozen(active), x, masks, weight, "embed")
                leaf, state = model.leaves(active)
                loss = cross_entropy(forward(state, h, None, weight, "private_logits"), y, weight)
            else:
                leaf, state = model.leaves(active)
                h = forward(state, x, masks, weight, "embed")
                loss = _alo_loss(
                    forward(state, h, None, weight, "global_logits"),
                    forward(state, h, None, weight, "private_logits"),
                    y,
                    weight,
                    mus[:active],
                    opts.adv_lambda,
                )
            model.update(loss, leaf, active)
            sums[int(s >= private_steps), :active] += loss.detach()
        out = []
        private_sums, global_sums = sums.tolist()  # one host sync a chunk
        for k, position in enumerate(chunk.positions):
            plan, steps = plans[position], int(plans[position]["steps"])
            params_k = model.client(k)
            private = (
                {n: v for n, v in params_k.items() if n.startswith("private_")}
                if states[position] is not None
                else None
            )
            metrics = {
                "loss": global_sums[k] / steps if steps else float("nan"),
                "steps": float(steps),
                "private_loss": private_sums[k] / max(private_steps, 1),
                "private_steps": float(private_steps),
                "alt_ratio": plan["ratio"],
                "mu": plan["mu"],
            }
            out.append((position, ClientResult(params_k, private, metrics)))
        return out

    size = algo.packing.fixed_chunk
    chunks = (
        CohortChunk(
            [order[i] for i in part],
            [datas[order[i]] for i in part],
            cfg,
            round_idx,
            seed,
            [batches[order[i]] for i in part],
        )
        for part in (range(j, min(j + size, len(order))) for j in range(0, len(order), size))
    )
    workers = algo.runtime.workers
    for position, result in run_chunks(
        train, chunks, cfg, algo.device, algo.devices, workers=workers
    ):
        results[position] = result
    return results  # type: ignore[return-value]


def _alo_loss(
    global_logits: torch.Tensor,
    private_logits: torch.Tensor,
    y: torch.Tensor,
    weight: torch.Tensor,
    mu: torch.Tensor,
    adv_lambda: float,
) -> torch.Tensor:
    """`fedkwsui.alo_loss` per client (clients, batch) -> (clients,): each client's label smoothing
    mu_k, weighted batch means (padding at weight 0)."""
    log_p = global_logits.log_softmax(dim=-1)
    classes = global_logits.shape[-1]
    target = (
        F.one_hot(y, classes).to(log_p.dtype) * (1.0 - mu.view(-1, 1, 1))
        + mu.view(-1, 1, 1) / classes
    )
    loss = (-(target * log_p).sum(-1) * weight).sum(-1)
    if adv_lambda:
        teacher = private_logits.detach().softmax(dim=-1)
        loss = loss - adv_lambda * (-(teacher * log_p).sum(-1) * weight).sum(-1)
    return loss


def _stacked_teacher(entries: list[Params], device: torch.device) -> Params:
    """A chunk's teacher entries along a client axis, on `device`: one model that every client
    reads (MOON's global one) as an expanded view, without a copy per client."""
    if all(e is entries[0] for e in entries):
        return {
            n: v.to(device).unsqueeze(0).expand(len(entries), *v.shape)
            for n, v in entries[0].items()
        }
    return {n: v.to(device) for n, v in stack_params(entries).items()}


class LocalObjective(Algorithm):
    """A client side stated once, as functions of one client, from which both paths are built: the
    sequential `client_update` (an nn.Module, torch.optim) and the stacked `cohort_update` (the same
    functions vmapped over a chunk's clients, training/functional.py). Subclasses define
    `local_loss` and, where they need them, `transform_grads` and `finish_local`; per-client state
    (a dict of tensors, e.g. SCAFFOLD's control variate) is stacked like the parameters. Models
    train through the vmapped module on the stacked path, or, for an objective that declares
    `reads_model_once`, the zoo's CRNNs through their hand-written forward, with the optimiser,
    clipping and per-client randomness of the FedAvg family; write `client_update` yourself for
    anything else (the run then says `sequential: <Class> overrides client_update`)."""

    #: True when `local_loss` reads its model once a step, on its batch: `forward(x)`, or
    #: `forward(x, "embed")` then `forward(z, "head")` of that embedding, and each of its
    #: `teachers` likewise. The zoo's CRNNs then train stacked through their hand-written forward
    #: (training/functional.py `HandWritten.map`), which computes the chunk's embeddings and logits
    #: first; otherwise through the vmapped module.
    reads_model_once: bool = False

    def local_loss(
        self,
        forward,
        params: Params,
        x: torch.Tensor,
        y: torch.Tensor,
        weight: torch.Tensor,
        state: Any,
        payload: Any,
    ) -> torch.Tensor:
        """One client's loss on one batch: `forward(x)` its model's logits (call it once per step
        when the model has dropout), `params` its trainable parameters, `weight` (batch,) summing to
        1 over its real samples (0 on padding), so `(per_sample * weight).sum()` is the batch mean
        on both paths."""
        raise NotImplementedError

    def transform_grads(self, grads: Params, params: Params, state: Any, payload: Any) -> Params:
        """One client's gradients before clipping and the optimiser step (SCAFFOLD's correction); as
        they are."""
        return grads

    def finish_local(self, params: Params, state: Any, payload: Any, steps: int) -> tuple[Any, Any]:
        """(upload, new client state) from one client's trained entries (parameters and buffers)."""
        return params, state

    def start_params(self, payload: Any) -> Params:
        """The model entries a client starts from (the payload itself by default)."""
        return payload

    def teachers(self, payload: Any, state: Any) -> dict[str, Params]:
        """Frozen models one client's objective reads beside its own, by name, as model entries
        (MOON's global and previous local model); `local_loss` gets their outputs, in eval mode and
        without gradient, as `forward(x, method, teacher=name)`; none by default."""
        return {}

    def own_start(self, payload: Any, state: Any) -> Params | None:
        """The model entries one client starts from when they are its own (a personal model kept
        in its state: Ditto's); None (the default): `start_params(payload)`, the round's clients
        alike."""
        return None

    def stacked_kind(self, arch: str) -> str:
        kind = super().stacked_kind(arch)
        # the hand-written CRNN computes a chunk's logits at once, before the objective sees them
        return "vmap" if kind == "crnn" and not self.reads_model_once else kind

    def client_update(
        self, payload: Any, state: Any, data: ClientData, round_idx: int, generator: torch.Generator
    ) -> ClientResult:
        cfg = self.cfg.train
        own = self.own_start(payload, state)
        start = own if own is not None else self.start_params(payload)
        model = self.scratch_model(self.cfg.model.name, start)
        model.train()
        params: Params = dict(model.named_parameters())
        optimizer = make_optimizer(params.values(), cfg)
        # (as the stacked path: a LocalObjective states its loss on feature windows and classes)
        x, y = (
            feature_windows(data.x, type(self).__name__),
            class_labels(data.y, type(self).__name__),
        )
        frozen = {
            name: self.scratch_model(self.cfg.model.name, entries, role=f"teacher {name}").eval()
            for name, entries in self.teachers(payload, state).items()
        }

        def forward(inputs: torch.Tensor, method: str = "forward", teacher: str | None = None):
            if teacher is None:
                return getattr(model, method)(inputs)
            with torch.no_grad():
                return getattr(frozen[teacher], method)(inputs)

        total, steps = torch.zeros((), dtype=torch.float64, device=y.device), 0
        for idx in on_device(client_batches(data.num_samples, cfg, generator), x):
            weight = torch.full((len(idx),), 1.0 / len(idx), device=x.device)
            loss = self.local_loss(forward, params, x[idx], y[idx], weight, state, payload)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grads = self.transform_grads(
                {n: p.grad for n, p in params.items() if p.grad is not None}, params, state, payload
            )
            for name, grad in grads.items():
                params[name].grad = grad
            clip_gradients(model, cfg)
            optimizer.step()
            total = total + loss.detach().double()  # on the device: read once, after the last step
            steps += 1
        upload, new_state = self.finish_local(model_params(model), state, payload, steps)
        return ClientResult(
            upload, new_state, {"loss": float(total) / max(steps, 1), "steps": float(steps)}
        )

    @reproduces(client_update)
    def cohort_update(
        self, payload: Any, states: list[Any], datas: list[ClientData], round_idx: int, seed: int
    ) -> list[ClientResult]:
        cfg, arch = self.cfg.train, self.cfg.model.name
        forward = self.stacked_forward(arch)
        payloads, starts = OnDevices(payload), OnDevices(self.start_params(payload))
        results: list[ClientResult | None] = [None] * len(datas)

        def train(chunk: CohortChunk) -> list[tuple[int, ClientResult]]:
            here = payloads(chunk.device)
            chunk_states = [states[i] for i in chunk.positions]
            owns = [self.own_start(here, state) for state in chunk_states]
            start = (
                {n: v.to(chunk.device) for n, v in stack_params(owns).items()}  # type: ignore[arg-type]
                if owns[0] is not None
                else broadcast_params(starts(chunk.device), len(chunk))
            )
            model = StackedStep(forward, start, cfg)
            stacked_state = (
                None
                if chunk_states[0] is None
                else {n: v.to(chunk.device) for n, v in stack_params(chunk_states).items()}
            )
            frozen = [self.teachers(here, state) for state in chunk_states]
            teachers = {
                name: _stacked_teacher([f[name] for f in frozen], chunk.device)
                for name in frozen[0]
            }
            loss_sum = torch.zeros(len(chunk), dtype=torch.float64, device=chunk.device)
            for step in chunk.steps:
                x, y = chunk.batch(step)
                active = step.active
                leaf, state = model.leaves(active)
                st = None if stacked_state is None else _first(stacked_state, active)

                def one(fwd, params, inputs, w, labels, client_state):
                    return self.local_loss(fwd, params, inputs, labels, w, client_state, here)

                loss = forward.map(
                    one,
                    state,
                    x,
                    chunk.dropout(step),
                    step.weight,
                    y,
                    st,
                    teachers={name: _first(e, active) for name, e in teachers.items()},
                )
                grads = grads_of(loss.sum(), leaf)
                present = {n: g for n, g in grads.items() if g is not None}
                present = vmap(lambda g, p, s: self.transform_grads(g, p, s, here))(
                    present, leaf, st
                )
                grads = {n: present.get(n) for n in grads}
                clip_stacked(grads, cfg.max_grad_norm)
                model.optimizer.step(grads, active)
                loss_sum[:active] += loss.detach()
            out = []
            for k, (position, total) in enumerate(zip(chunk.positions, loss_sum.tolist())):
                steps = chunk.client_steps[k]
                upload, new_state = self.finish_local(
                    model.client(k), states[position], here, steps
                )
                out.append(
                    (
                        position,
                        ClientResult(
                            upload, new_state, {"loss": total / steps, "steps": float(steps)}
                        ),
                    )
                )
            return out

        for position, result in _chunks_trained(
            self, train, datas, range(len(datas)), arch, round_idx, seed
        ):
            results[position] = result
        return results  # type: ignore[return-value]
