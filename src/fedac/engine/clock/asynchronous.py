"""FedBuff and FedAsync on the virtual clock (`system.mode=fedbuff` / `fedasync`, docs/system.md).

`concurrency` clients train at once, each on the model of the moment it was dispatched; the event
of the earliest finish is processed first. A client takes at most one job per model version (it
waits for the next version), and jobs are trained, one stacked chunk per version, when that version
is about to be replaced (every job of a version starts from the same global model, so deferring
changes nothing). FedBuff (Nguyen et al. 2022) applies every `buffer` arrivals at once; FedAsync
(Xie et al. 2019) each arrival. An update of staleness s (the server steps since its model) is
weighted w(s) = (1 + s)^-a (`staleness_exponent`, 0.5: FedBuff's 1/sqrt(1 + s)) and discarded
above `max_staleness`. Both act through the method's own `server_update`, on uploads re-based onto
the current model x:

    fedbuff:  u' = x + w(s) (u - x_sent)           (each with its n_k: the mean of the rebased
                                                    uploads is x + sum n_k w(s_k) D_k / sum n_k)
    fedasync: u' = x + alpha w(s) (u - x)           (one arrival: the mean is FedAsync's mixing
                                                    (1 - a_s) x + a_s u)

which needs a method whose upload is a model of the broadcast's form (`Algorithm.dp_compatible`).
One `train.rounds` round is one server update.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from fedac.config import SystemConfig
from fedac.engine.clock.book import Job, SystemBook
from fedac.engine.clock.model import staleness_weight
from fedac.engine.clock.schedule import RoundPlan, RoundSchedule, TrainJob, traffic
from fedac.engine.server_step import Arrival
from fedac.engine.state import RunState
from fedac.errors import ConfigError
from fedac.training.types import ClientResult


def rebase(delta: Any, current: Any, scale: float) -> Any:
    """current + scale x delta over the floating tensors of a model's parameters (nested dicts;
    `delta` from `difference`)."""
    if isinstance(delta, dict):
        return {k: rebase(v, current[k], scale) for k, v in delta.items()}
    if not isinstance(delta, torch.Tensor) or not delta.is_floating_point():
        return delta  # (integer buffers such as a BatchNorm's batch count travel as they are)
    return current + scale * delta


def difference(upload: Any, origin: Any) -> Any:
    """upload - origin over a model's floating tensors (the rest as uploaded)."""
    if isinstance(upload, dict):
        return {k: difference(v, origin[k]) for k, v in upload.items()}
    if not isinstance(upload, torch.Tensor) or not upload.is_floating_point():
        return upload
    return upload - origin


class AsyncSchedule(RoundSchedule):
    """The event loop shared by FedBuff and FedAsync (module docstring); a subclass says how many
    deliveries a server update waits for (`needed`), what it keeps of a trained update (`kept`) and
    how it re-bases it onto the current model (`rebased`)."""

    asynchronous = True

    def __init__(self, context):
        super().__init__(context)
        assert context.clock is not None
        self.clock, self.system = context.clock, context.cfg.system

    # --- what a mode decides ---------------------------------------------------------------------
    def kept(self, result: ClientResult, payload: Any) -> ClientResult:
        """What is kept of a trained update until it is applied."""
        return result

    def rebased(self, job: Job, current: Any, version: int) -> Any:
        """A delivered job's upload re-based onto the current model (module docstring)."""
        raise NotImplementedError

    # --- one server update ---------------------------------------------------------------
    def plan(self, state: RunState, round_idx: int, payload: Any) -> RoundPlan:
        """Events until the buffer holds `needed` deliveries; the jobs on the current model version
        that will deliver and have not trained yet train now (the model is about to change)."""
        book = self.book(state)
        started = book.time
        counts = self.events(book, *traffic(payload, self.context.compression))
        pending = [
            job
            for job in book.jobs + book.buffer
            if job.version == book.version and job.status == "arrived" and job.result is None
        ]
        staleness = [book.version - job.version for job in book.buffer]
        metrics = {
            "virtual_time_s": book.time,
            "round_s": book.time - started,
            **counts,
            "arrived": float(len(book.buffer)),
            "mean_staleness": float(np.mean(staleness)),
        }
        return RoundPlan([TrainJob(job.client) for job in pending] or None, metrics, pending)

    def events(self, book: SystemBook, down_bytes: int, up_bytes: int) -> dict[str, float]:
        """Dispatch and process events until the buffer is full; the counts of the update."""
        slots = self.system.concurrency or self.context.cohort
        need = self.needed(self.system)
        counts = {"sampled": 0.0, "dropped": 0.0, "stale": 0.0}
        while len(book.buffer) < need:
            counts["sampled"] += self.dispatch(book, slots, down_bytes, up_bytes)
            if not book.jobs:
                self.wait(book)
                continue
            job = self.next_event(book)
            if job.status != "arrived":
                counts["dropped"] += 1
            elif book.version - job.version > self.system.max_staleness:
                counts["stale"] += 1
            else:
                book.buffer.append(job)
        return counts

    def arrivals(
        self, state: RunState, plan: RoundPlan, results: Sequence[ClientResult], payload: Any
    ) -> list[Arrival]:
        """The buffer's updates re-based onto the current model; the model version moves on."""
        book = self.book(state)
        for job, result in zip(plan.jobs, results):
            job.result = self.kept(result, payload)
        applied, book.buffer = book.buffer, []
        arrivals = [
            Arrival(
                job.client,
                self.rebased(job, payload, book.version),
                self.context.sizes[job.client],
                job.result.metrics.get("loss", math.nan),
                job.result.state,
            )
            for job in applied
        ]
        book.version += 1
        return arrivals

    # --- the event queue -----------------------------------------------------------------
    def dispatch(self, book: SystemBook, in_flight: int, down_bytes: int, up_bytes: int) -> int:
        """Fill the free slots (`in_flight` less the clients in flight) with clients online now
        that have not yet taken a delivering job on this model version, chosen by the selection
        rule (key ("dispatch", n), round: the model version + 1); the number dispatched."""
        busy = {job.client for job in book.jobs}
        eligible = [
            c
            for c in self.clock.online(list(self.context.sizes), book.time)
            if c not in busy and book.delivered.get(c, -1) != book.version
        ]
        free = min(in_flight - len(book.jobs), len(eligible))
        if free <= 0:
            return 0
        key, sent = ("dispatch", book.dispatched), (down_bytes, up_bytes)
        for client in self.choose(eligible, free, key, book.version + 1, sent):
            outcome = self.clock.outcome(
                client, book.time, ("async", book.dispatched), down_bytes, up_bytes
            )
            book.dispatched += 1
            if outcome.status == "arrived":
                book.delivered[client] = book.version
            book.jobs.append(
                Job(
                    client,
                    book.version,
                    outcome.at,
                    outcome.status,
                    outcome.compute_s,
                    outcome.comm_s,
                )
            )
        return free

    def wait(self, book: SystemBook) -> None:
        """Nothing in flight and no client to dispatch: move the clock to the next time a client
        that may take a job comes online (a ConfigError where none ever can)."""
        waiting = [c for c in self.context.sizes if book.delivered.get(c, -1) != book.version]
        if not waiting:
            raise ConfigError(
                f"system.buffer={self.system.buffer}: every client has delivered on model version "
                f"{book.version} and the buffer is still not full; lower system.buffer"
            )
        book.time = self.clock.first_online(waiting, book.time)

    def next_event(self, book: SystemBook) -> Job:
        """The job in flight that finishes (or fails) first; the clock moves to it."""
        job = min(book.jobs, key=lambda j: (j.at, j.client))
        book.jobs.remove(job)
        book.time = job.at
        book.record(job.client, job.status, job.compute_s, job.comm_s, book.version - job.version)
        return job

    def weight(self, job: Job, version: int) -> float:
        return staleness_weight(version - job.version, self.system.staleness_exponent)


class FedBuff(AsyncSchedule):
    """FedBuff (Nguyen et al. 2022): every `system.buffer` deliveries are applied at once, each as
    its difference from the model it started from, scaled by its staleness weight."""

    @classmethod
    def needed(cls, system: SystemConfig) -> int:
        return system.buffer

    def kept(self, result: ClientResult, payload: Any) -> ClientResult:
        return replace(result, upload=difference(result.upload, payload))

    def rebased(self, job: Job, current: Any, version: int) -> Any:
        return rebase(job.result.upload, current, self.weight(job, version))

    def describe(self) -> str:
        return self.clock.describe([f"buffer {self.system.buffer}"])


class FedAsync(AsyncSchedule):
    """FedAsync (Xie et al. 2019): every delivery is mixed in at once, x <- (1 - a_s) x + a_s u
    with a_s = alpha w(s)."""

    def rebased(self, job: Job, current: Any, version: int) -> Any:
        upload = job.result.upload
        scale = self.system.alpha * self.weight(job, version)
        return rebase(difference(upload, current), current, scale)

    def describe(self) -> str:
        return self.clock.describe(["buffer 1"])
