"""Sync rounds on the virtual clock (`system.mode=sync`, docs/system.md): the round samples
ceil(overcommit x K) clients among those online at its start, keeps the first K arrivals before the
deadline and ends at the K-th arrival, else at the deadline, else once every sampled client has
arrived or failed (virtual.py `SystemClock.sync_round`, model.py `plan_sync_round`). Only the kept
arrivals train, each to the steps it finished (`system.partial`), weighted by the share of its
samples it processed."""

from __future__ import annotations

from typing import Any

from fedac.engine.clock.schedule import IdealSchedule, RoundPlan, TrainJob, traffic
from fedac.engine.state import RunState


class SyncSchedule(IdealSchedule):
    """Rounds with a deadline, over-commitment, dropout and partial work on the virtual clock."""

    def __init__(self, context):
        super().__init__(context)
        assert context.clock is not None
        self.clock = context.clock

    def plan(self, state: RunState, round_idx: int, payload: Any) -> RoundPlan:
        sent = traffic(payload, self.context.compression)
        kept, metrics = self.clock.sync_round(
            self.book(state),
            round_idx,
            self.context.cohort,
            *sent,
            lambda online, k, _: self.choose(online, k, ("cohort", round_idx), round_idx, sent),
        )
        return RoundPlan([TrainJob(o.client, o.steps) for o in kept], metrics)

    def weight(self, job: TrainJob) -> int:
        """n_k, or with partial work the samples the client processed (at least 1)."""
        samples = self.context.sizes[job.client]
        if job.steps is None:
            return samples
        return max(1, round(samples * self.clock.share_done(job.client, job.steps)))

    def describe(self) -> str:
        system = self.cfg.system
        parts = [f"deadline {system.deadline:g} s" if system.deadline else "no deadline"]
        parts += [f"over-commit {system.overcommit:g}"] if system.overcommit > 1 else []
        return self.clock.describe(parts)
