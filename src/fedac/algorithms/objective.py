"""The plug-in API for a method stated as a local objective: `LocalObjective` (docs/extending.md).

A client side stated once, as functions of one client, from which fedac builds both paths: the
sequential `client_update` and the stacked `cohort_update`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.func import vmap

from fedac.algorithms.base import Algorithm, model_params, reproduces
from fedac.models.stacked import stack_params
from fedac.training.functional import StackedStep, clip_stacked, first_clients
from fedac.training.local import (
    client_batches,
    clip_gradients,
    cross_entropy,
    make_optimizer,
    on_device,
)
from fedac.training.stacking import (
    CohortChunk,
    OnDevices,
    broadcast_params,
    grads_of,
    train_cohort,
)
from fedac.training.types import ClientData, ClientResult, Params, class_labels, feature_windows


def _stacked_teacher(entries: list[Params], device: torch.device) -> Params:
    """A chunk's teacher entries along a client axis, on `device`: one model that every client
    reads (MOON's global one) as an expanded view, without a copy per client."""
    if all(e is entries[0] for e in entries):
        return {
            n: v.to(device).unsqueeze(0).expand(len(entries), *v.shape)
            for n, v in entries[0].items()
        }
    return {n: v.to(device) for n, v in stack_params(entries).items()}


def _stacked_states(states: list[Any], device: torch.device) -> Params | None:
    """A chunk's client states along a client axis on `device` (None: the method keeps none)."""
    if states[0] is None:
        return None
    return {n: v.to(device) for n, v in stack_params(states).items()}


class LocalObjective(Algorithm):
    """A client side stated once, as functions of one client, from which both paths are built: the
    sequential `client_update` (an nn.Module, torch.optim) and the stacked `cohort_update` (the same
    functions vmapped over a chunk's clients, training/functional.py). Subclasses define
    `local_loss` and, where they need them, `transform_grads` and `finish_local`; per-client state
    (a dict of tensors, e.g. SCAFFOLD's control variate) is stacked like the parameters. On the
    stacked path the zoo's CRNNs train through their hand-written forward (`reads_model_once`, the
    default), any other model through the vmapped module, with the optimiser, clipping and
    per-client randomness of the FedAvg family; write `client_update` yourself for anything else
    (the run then says `sequential: <Class> overrides client_update`)."""

    #: True when `local_loss` reads its model once a step, on its batch: `forward(x)`, or
    #: `forward(x, "embed")` then `forward(z, "head")` of that embedding, and each of its
    #: `teachers` likewise. The zoo's CRNNs then train stacked through their hand-written forward
    #: (training/functional.py `HandWritten.map`), which computes the chunk's embeddings and logits
    #: first; otherwise through the vmapped module. The hand-written forward is always the faster
    #: stacked form, so it is the default: an objective that reads its model otherwise (twice a
    #: step, on other inputs, another method) is refused by name on that path and sets this False.
    reads_model_once: bool = True

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
        on both paths. By default the weighted cross-entropy of the logits (Ditto's, SCAFFOLD's
        and FedDyn's objective, whose corrections act on the gradients)."""
        return cross_entropy(forward(x), y, weight)

    def zeros_like_params(self) -> Params:
        """One zero tensor per trainable parameter of `model.name` (a control variate's, a dual
        term's or a gradient's shape)."""
        model = self.scratch_model(self.cfg.model.name)
        return {name: torch.zeros_like(p.detach()) for name, p in model.named_parameters()}

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
        # the hand-written CRNN computes a chunk's logits at once, before the objective sees them;
        # the hand-written KWS forms serve the training loops' calls only, not an objective's map
        if kind == "kws":
            return "vmap"
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

        def train(chunk: CohortChunk) -> list[tuple[int, ClientResult]]:
            here = payloads(chunk.device)
            chunk_states = [states[i] for i in chunk.positions]
            owns = [self.own_start(here, state) for state in chunk_states]
            start = _stacked_states(owns, chunk.device) or broadcast_params(
                starts(chunk.device), len(chunk)
            )
            model = StackedStep(forward, start, cfg)
            stacked_state = _stacked_states(chunk_states, chunk.device)
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
                st = None if stacked_state is None else first_clients(stacked_state, active)

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
                    teachers={name: first_clients(e, active) for name, e in teachers.items()},
                )
                grads = grads_of(loss.sum(), leaf)
                present = {n: g for n, g in grads.items() if g is not None}
                present = vmap(
                    lambda g, p, s: self.transform_grads(g, p, s, here),
                    in_dims=(0, 0, None if st is None else 0),  # (a method with no client state)
                )(present, leaf, st)
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

        return train_cohort(self, train, datas, arch, round_idx, seed)
