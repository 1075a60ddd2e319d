"""The schedule interface: who trains in a round, from which model, and what reaches the server.

A driver asks its `RoundSchedule` for the round's `RoundPlan` (the clients to train now from this
round's broadcast, each to its step limit, and the clock's metrics), trains them through its
execution plan, and hands the trained results back (`arrivals`): the schedule turns them into the
`Arrival`s of the one server step. `IdealSchedule` is the federation without a clock; the clock's
modes (sync.py, asynchronous.py) are registered parts (settings/clock.py `CLOCK_MODES`)."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fedac.config import Config, SystemConfig
from fedac.engine.clock.book import Job, SystemBook
from fedac.engine.clock.selection import Selection, build_selection
from fedac.engine.clock.virtual import SystemClock
from fedac.engine.server_step import Arrival
from fedac.engine.state import RunState
from fedac.rules.compression import Compressor
from fedac.training.device import nbytes
from fedac.training.types import ClientResult


@dataclass(frozen=True)
class TrainJob:
    """One client to train from this round's broadcast, to at most `steps` local steps (None: its
    whole schedule)."""

    client: str
    steps: int | None = None


@dataclass
class RoundPlan:
    """A round as its schedule decided it before anyone trained."""

    train: list[TrainJob] | None
    """The clients to train now from this round's broadcast (None: no training call this round)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The clock's columns of metrics.csv / system.csv (none without a clock)."""
    jobs: list[Job] = field(default_factory=list)
    """Async: the jobs `train` trains (their results are kept until their update is applied)."""

    @property
    def clients(self) -> list[str]:
        return [job.client for job in self.train or []]

    @property
    def limits(self) -> dict[str, int]:
        """The step limits the clock set (partial work)."""
        return {job.client: job.steps for job in self.train or [] if job.steps is not None}


@dataclass(frozen=True)
class ScheduleContext:
    """What a schedule knows of its run."""

    cfg: Config
    sizes: dict[str, int]
    """Each trainable client's training clips (n_k), in the clients' order."""
    cohort: int
    """K: train.fraction's cohort size."""
    compression: Compressor | None = None
    """The uploads' compression (the clock charges their wire size)."""
    clock: SystemClock | None = None
    """The devices, availability and time; None for the ideal federation."""


def traffic(payload: Any, compression: Compressor | None) -> tuple[int, int]:
    """Bytes a client downloads and uploads in one update, for the clock: the upload is taken to
    be a model of the broadcast's form, at its compressed size where compression is on."""
    if compression is None:
        return nbytes(payload), nbytes(payload)
    down = compression.broadcast_bytes(payload)
    return (nbytes(payload) if down is None else down), compression.wire_bytes(payload, payload)


class RoundSchedule(ABC):
    """One way of timing the federation (module docstring). A clock mode registered in
    `CLOCK_MODES` (a plug-in's included) is a subclass built as `cls(context)`."""

    #: Each upload reaches the server on its own, re-based by its staleness (no all-reduced sum,
    #: no compression; no deadline, over-commitment or partial work).
    asynchronous: ClassVar[bool] = False

    def __init__(self, context: ScheduleContext):
        self.context = context
        self.cfg = context.cfg
        #: Who trains among the candidates (selection.py `selection.method`).
        self.selector: Selection = build_selection(self.cfg, context.sizes)

    @classmethod
    def needed(cls, system: SystemConfig) -> int:
        """Deliveries on one model version a server update waits for (async modes)."""
        return 1

    @abstractmethod
    def plan(self, state: RunState, round_idx: int, payload: Any) -> RoundPlan:
        """Round `round_idx`'s clients to train from `payload` (the broadcast), and its clock."""

    @abstractmethod
    def arrivals(
        self, state: RunState, plan: RoundPlan, results: Sequence[ClientResult], payload: Any
    ) -> list[Arrival]:
        """What reaches the server step, from the results of `plan.train` (in its order)."""

    def choose(
        self,
        candidates: list[str],
        size: int,
        key: tuple,
        round_idx: int,
        sent: tuple[int, int] = (0, 0),
    ) -> list[str]:
        """`size` of `candidates` by the run's selection rule (in the candidates' order), seeded by
        `key`: ("cohort", round) for a sync round, ("dispatch", n) for the n-th async dispatch (the
        random rule's stream, cohort.py `sample_clients`). With the clock the rule sees each
        candidate's modelled times for `sent` (bytes down, up). The driver binds the rule to the
        run state's history (`RunState.selection`) at each round's start."""
        clock = self.context.clock
        times = (lambda c: clock.times(c, *sent)) if clock is not None else None
        return self.selector.choose(candidates, size, key, round_idx, times)

    def observe(self, round_idx: int, arrivals: Sequence[Arrival]) -> None:
        """The selection rule learns the training losses of the updates the server received."""
        self.selector.observe(round_idx, {a.client: a.loss for a in arrivals})

    def describe(self) -> str | None:
        """The run's first line's part on the clock (None: no clock)."""
        return None

    def summary(self, state: RunState, flops: dict[str, float]) -> dict[str, Any] | None:
        """results.json's `system` (virtual.py `SystemClock.summary`; None without a clock).
        `flops`: the training FLOPs per sample counted for each architecture."""
        clock = self.context.clock
        if clock is None or state.system is None:
            return None
        return clock.summary(state.system, state.history, flops)

    def book(self, state: RunState) -> SystemBook:
        if state.system is None:
            state.system = SystemBook()
        return state.system


class IdealSchedule(RoundSchedule):
    """The federation without a clock: every sampled client is online, finishes at once and
    reports in the same instant (K clients drawn by the selection rule, `RoundSchedule.choose`)."""

    def plan(self, state: RunState, round_idx: int, payload: Any) -> RoundPlan:
        clients, cohort = list(self.context.sizes), self.context.cohort
        names = self.choose(clients, cohort, ("cohort", round_idx), round_idx)
        return RoundPlan([TrainJob(name) for name in names])

    def arrivals(
        self, state: RunState, plan: RoundPlan, results: Sequence[ClientResult], payload: Any
    ) -> list[Arrival]:
        return [
            Arrival(
                job.client,
                r.upload,
                self.weight(job),
                r.metrics.get("loss", math.nan),
                r.state,
            )
            for job, r in zip(plan.train or [], results)
        ]

    def weight(self, job: TrainJob) -> int:
        """n_k."""
        return self.context.sizes[job.client]
