"""Partly shared models: the personalised-FL methods whose clients train one network, keep some of
its entries and share the rest by FedAvg. Each method says which entries stay private
(models/parts.py defines a network's head, body and BatchNorm entries per model family):

- FedBN (fedbn.py): the BatchNorm layers' parameters and statistics;
- FedPer and FedRep (fedper.py, fedrep.py): the head;
- LG-FedAvg (lgfedavg.py): the body;
- local (local_only.py): everything (nothing is shared).

A round, for every such method: client k starts from its own private entries and the global shared
ones, trains them by `train.*`'s local SGD in one or more phases (`phases`: FedRep trains the head,
then the body), uploads its shared entries with n_k and keeps the whole trained network as its
state; the server's shared entries become the `aggregation.*` mean of the uploads (so robust rules,
DP-FedAvg on the shared entries and torchrun's summed uploads apply as to FedAvg).

Choices (the same for every method here):
- Every client's private entries start from the common initial model (the server's), as the
  methods' reference code copies one initial network to every client.
- A client's own model (`personalized_model`, the personalised columns of results.json) is the
  network its last local update ended with: its private entries and the shared ones as it trained
  them. Implementations often evaluate the private entries with the newest aggregate instead
  (FedRep's code does); that needs the server's model wherever a client is evaluated, which a
  Flower node does not hold, so fedac evaluates what a client holds.
- There is no shared model to test (`global_model` is None): the shared entries alone are not a
  classifier, so the shared-model columns read '—'. FedBN on a network without BatchNorm shares
  every entry: its aggregate is the whole network and is tested as FedAvg's.

These are not `LocalObjective`s (algorithms/cohort.py): there every client of a round starts from
one payload (`start_params`) and trains every parameter in one schedule, while here each client
starts from its own private entries and FedRep trains in two phases. Both paths train these methods:
the sequential `client_update` (the network as an nn.Module, the frozen entries of a phase with
`requires_grad` off, one optimiser per phase as the reference code's optimiser skips entries without
a gradient) and the stacked `cohort_update` (a chunk's clients as one computation, each from its own
start). A client's phases start at different steps for clients of different sizes; the stacked path
steps each phase's optimiser over the clients in that phase, which equals skipping the others
exactly for the first phase, and for later ones with plain SGD without weight decay (their buffers
are still zero): otherwise a multi-phase method trains sequentially and says why
(`sequential_reason`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import nn

from fedac.algorithms.base import (
    Algorithm,
    ClientData,
    ClientResult,
    OneArchitecture,
    Params,
    model_params,
    reproduces,
)
from fedac.config import TrainConfig
from fedac.models.parts import entry_names
from fedac.models.stacked import stack_params
from fedac.training.functional import (
    clip_stacked,
    param_leaves,
    stacked_optimizer,
    with_buffers,
)
from fedac.training.local import cross_entropy, local_steps, train_supervised
from fedac.training.stacking import CohortChunk, OnDevices, grads_of, plan_chunks, run_chunks

#: One phase of a local update: the parameters it trains (None: all) and its schedule.
Phase = tuple[set[str] | None, TrainConfig]


class PartlyShared(OneArchitecture, Algorithm):
    """A network of which each client keeps `private_entries` and shares the rest (module
    docstring)."""

    personalized = True
    # the new shared entries are the aggregate itself
    dp_compatible = True
    sums_uploads = True

    one_architecture = "shares entries of one network between the clients"

    def __init__(self, cfg, task, runtime=None):
        super().__init__(cfg, task, runtime)
        model = self.scratch_model(cfg.model.name)
        self.private = self.private_entries(model)
        #: The entries the server averages, in state order.
        self.shared = [name for name in entry_names(model) if name not in self.private]
        self._initial: Params | None = None
        train = cfg.train
        if len(self.phases()) > 1 and (train.optimizer != "sgd" or train.weight_decay != 0):
            # an instance's own reason (engine/execution.py reads it): it depends on the config
            self.no_stacked_form = (
                f"{cfg.algorithm}'s phases start at a different step for each client, which the "
                "stacked path reproduces with train.optimizer=sgd and train.weight_decay=0 only "
                f"(here {train.optimizer}, {train.weight_decay})"
            )

    # --- what a method says -------------------------------------------------------------------
    def private_entries(self, model: nn.Module) -> set[str]:
        """The state entries (parameters and buffers) each client keeps."""
        raise NotImplementedError

    def phases(self) -> list[Phase]:
        """A local update's phases, in order: one, training every parameter on `train.*`'s
        schedule."""
        return [(None, self.cfg.train)]

    # --- models and states --------------------------------------------------------------------
    def initial_model(self) -> Params:
        """The common initial network (the same weights as the server's shared entries)."""
        if self._initial is None:
            self._initial = self.initial_params(self.cfg.model.name, "global-init")
        return self._initial

    def init_server(self) -> dict[str, Any]:
        initial = self.initial_model()
        return {"params": {name: initial[name].clone() for name in self.shared}}

    def init_client_state(self, client: str) -> Params:
        # one dict for every client that has not trained yet (no copy until it trains)
        return self.initial_model()

    def start(self, payload: Params, state: Params) -> Params:
        """A client's network at the start of its update: its own entries, the shared ones from
        the server."""
        return {**state, **{name: payload[name] for name in self.shared}}

    def global_model(self, server: dict[str, Any]) -> nn.Module | None:
        if self.private:
            return None  # the shared entries alone are no classifier
        # nothing kept (FedBN on a network without BatchNorm): the aggregate is the whole network
        return self.scratch_model(self.cfg.model.name, server["params"])

    # --- the client: sequential ---------------------------------------------------------------
    def client_update(
        self,
        payload: Params,
        state: Params,
        data: ClientData,
        round_idx: int,
        generator: torch.Generator,
    ) -> ClientResult:
        model = self.scratch_model(self.cfg.model.name, self.start(payload, state))
        total, steps = 0.0, 0.0
        try:
            for trainable, cfg in self.phases():
                for name, param in model.named_parameters():
                    param.requires_grad_(trainable is None or name in trainable)
                metrics = train_supervised(model, data.x, data.y, cfg, generator)
                total += metrics["loss"] * metrics["steps"]
                steps += metrics["steps"]
        finally:  # the scratch model is shared with the next client
            for param in model.parameters():
                param.requires_grad_(True)
        trained = model_params(model)
        return ClientResult(
            {name: trained[name] for name in self.shared},
            trained,
            {"loss": total / max(steps, 1.0), "steps": steps},
        )

    # --- the client: stacked ------------------------------------------------------------------
    def schedule(self) -> TrainConfig:
        """The whole update's batches as one schedule: the phases' epochs drawn back to back from
        the client's generator, as the sequential phases draw them."""
        phases = self.phases()
        if len(phases) == 1:
            return phases[0][1]
        return replace(self.cfg.train, local_epochs=sum(cfg.local_epochs for _, cfg in phases))

    @reproduces(client_update)
    def cohort_update(
        self,
        payload: Params,
        states: list[Params],
        datas: list[ClientData],
        round_idx: int,
        seed: int,
    ) -> list[ClientResult]:
        arch = self.cfg.model.name
        forward = self.stacked_forward(arch)
        phases = self.phases()
        trains = [
            [n for n in forward.param_names if trainable is None or n in trainable]
            for trainable, _ in phases
        ]
        phase_of = {name: p for p, names in enumerate(trains) for name in names}
        payloads = OnDevices(payload)
        results: list[ClientResult | None] = [None] * len(datas)

        def train(chunk: CohortChunk) -> list[tuple[int, ClientResult]]:
            here = payloads(chunk.device)
            params = {
                name: value.to(chunk.device)
                for name, value in stack_params(
                    [self.start(here, states[i]) for i in chunk.positions]
                ).items()
            }
            optimizers = [
                stacked_optimizer({n: params[n] for n in names}, cfg)
                for names, (_, cfg) in zip(trains, phases)
            ]
            ends = _phase_ends(chunk.datas, phases)
            loss_sum = torch.zeros(len(chunk), dtype=torch.float64, device=chunk.device)
            for step in chunk.steps:
                x, y = chunk.batch(step)
                active = step.active
                leaf = param_leaves(params, active, forward.param_names)
                logits = forward(
                    with_buffers(leaf, params, active, forward.buffer_names),
                    x,
                    chunk.dropout(step),
                    step.weight,
                )
                loss = cross_entropy(logits, y, step.weight)
                grads = grads_of(loss.sum(), leaf)
                phase = [
                    next(p for p, end in enumerate(ends[k]) if step.number < end)
                    for k in range(active)
                ]
                _step_phases(grads, phase, phase_of, optimizers, self.cfg.train.max_grad_norm)
                loss_sum[:active] += loss.detach()
            return self._chunk_results(chunk, params, loss_sum)

        schedule = self.schedule()
        workers = self.runtime.workers
        # asked before planning: planning the probe measures it
        probing = self.packing.probing(arch)
        chunks = plan_chunks(
            datas, range(len(datas)), schedule, round_idx, seed, self.packing, arch, workers
        )
        for position, result in run_chunks(
            train, chunks, self.cfg.runtime, self.device, self.devices, probing, workers
        ):
            results[position] = result
        return results  # type: ignore[return-value]

    def _chunk_results(
        self, chunk: CohortChunk, params: Params, loss_sum: torch.Tensor
    ) -> list[tuple[int, ClientResult]]:
        """(position, result) of each client of a trained chunk: its shared entries uploaded, its
        whole network kept."""
        out = []
        for k, (position, total) in enumerate(zip(chunk.positions, loss_sum.tolist())):
            trained = {name: value[k].clone() for name, value in params.items()}
            steps = chunk.client_steps[k]
            metrics = {"loss": total / steps, "steps": float(steps)}
            upload = {name: trained[name] for name in self.shared}
            out.append((position, ClientResult(upload, trained, metrics)))
        return out

    # --- the server ---------------------------------------------------------------------------
    def server_update(
        self, server: dict[str, Any], uploads: list[tuple[Params, int]], round_idx: int
    ) -> tuple[dict[str, Any], Any]:
        params, metrics = self.combine(server, uploads)
        return {**server, "params": params}, metrics


def _phase_ends(datas: list[ClientData], phases: list[Phase]) -> list[list[int]]:
    """Each client's last step (exclusive) of every phase."""
    ends = []
    for data in datas:
        bounds, total = [], 0
        for _, cfg in phases:
            total += local_steps(data.num_samples, cfg)
            bounds.append(total)
        ends.append(bounds)
    return ends


def _step_phases(
    grads: dict[str, torch.Tensor | None],
    phase: list[int],
    phase_of: dict[str, int],
    optimizers: list,
    max_norm: float,
) -> None:
    """One stacked step of a chunk's active clients, client k in phase `phase[k]`: each client's
    gradient of the parameters its phase trains (clipped over those alone, as the sequential path
    clips the parameters that have a gradient), stepped by that phase's optimiser over the clients
    in it. Clients are sorted by size, so a phase's clients are consecutive: [lo, hi); the optimiser
    steps the prefix [0, hi), the rows before lo (clients still in an earlier phase) at gradient
    0."""
    if len(optimizers) == 1:  # every client in the one phase: FedAvg's step
        clip_stacked(grads, max_norm)
        optimizers[0].step(grads, len(phase))
        return
    owner = torch.tensor(phase, device=next(g for g in grads.values() if g is not None).device)
    kept: dict[str, torch.Tensor | None] = {}
    for name, grad in grads.items():
        p = phase_of.get(name)
        if grad is None or p is None:
            kept[name] = None
            continue
        mask = (owner == p).to(grad.dtype).view(-1, *[1] * (grad.dim() - 1))
        kept[name] = grad * mask
    clip_stacked(kept, max_norm)
    for p, optimizer in enumerate(optimizers):
        rows = [k for k, q in enumerate(phase) if q == p]
        if not rows:
            continue
        lo, hi = rows[0], rows[-1] + 1
        if rows != list(range(lo, hi)):
            raise RuntimeError(f"phase {p}'s clients are not consecutive: {rows}")
        optimizer.step(
            {n: g[:hi] for n, g in kept.items() if g is not None and phase_of[n] == p}, hi
        )
