"""The clock's arithmetic, with no state of its own: one client's modelled time (`ClientTimes`),
what it did when dispatched (`client_outcome` -> `Outcome`), which arrivals a sync round keeps and
when it ends (`plan_sync_round`), the staleness weight, and the FLOP count that sets a device's
speed.

A client fails when its device goes offline before it is done (the availability trace) or, with
probability `system.dropout`, at a uniform point of its work; both are one failure time. A client
the server told to stop before that time (at the deadline, or at the K-th arrival of an
over-committed round) did not fail: it is late, and its time is clamped to the round's end.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fedac.config import SystemConfig
from fedac.seeding import numpy_rng

#: metrics.csv's and system.csv's columns of the clock, per round (or server update).
CLOCK_METRICS = (
    "virtual_time_s",
    "round_s",
    "sampled",
    "arrived",
    "late",
    "dropped",
    "stale",
    "mean_staleness",
)
SYSTEM_CSV = "system.csv"

#: Consecutive sync rounds in which no client arrived before a run with a deadline is refused.
EMPTY_ROUNDS = 3


def staleness_weight(staleness: int, exponent: float) -> float:
    """w(s) = (1 + s)^-a."""
    return float((1 + staleness) ** -exponent)


@dataclass(frozen=True)
class ClientTimes:
    """One client's modelled update: download, each local step's compute, upload (seconds)."""

    down_s: float
    step_s: tuple[float, ...]
    up_s: float

    @property
    def total(self) -> float:
        return self.down_s + sum(self.step_s) + self.up_s

    def spent(self, duration: float) -> tuple[float, float]:
        """(compute, communication) seconds of its first `duration` seconds of work (download,
        then the steps, then the upload)."""
        duration = max(0.0, min(duration, self.total))
        down = min(duration, self.down_s)
        compute = min(duration - down, sum(self.step_s))
        return compute, duration - compute

    def steps_within(self, budget: float) -> int:
        """Whole local steps it can finish and still upload within `budget` seconds."""
        left = budget - self.down_s - self.up_s
        done = 0
        for step in self.step_s:
            if step > left:
                break
            left -= step
            done += 1
        return done


@dataclass
class Outcome:
    """What one dispatched client did: `status` arrived / late / dropped (failed mid-way, or its
    device went offline), at virtual time `at`; `steps` the local steps it contributes (None:
    all)."""

    client: str
    status: str
    at: float
    steps: int | None = None
    compute_s: float = 0.0
    comm_s: float = 0.0


def failure_point(cfg: SystemConfig, seed: int, key: object, client: str) -> float | None:
    """`system.dropout`: the fraction of its work after which the client fails, or None (it does
    not), drawn from (seed, key, client) alone."""
    if cfg.dropout <= 0:
        return None
    rng = numpy_rng(seed, "system-dropout", key, client)
    fails, point = rng.random() < cfg.dropout, rng.random()
    return float(point) if fails else None


def client_outcome(
    client: str,
    start: float,
    times: ClientTimes,
    offline_at: float,
    fails_at: float | None,
    deadline: float,
    partial: bool,
) -> Outcome:
    """One client's fate when dispatched at `start` (module docstring). It fails at the earlier of
    `fails_at` of its work (dropout) and the moment its device goes offline (`offline_at`), unless
    it is done by then or the deadline comes first: a client told to stop at the deadline is late
    (or, with `partial`, sends the steps it finished), whatever would have ended its work later."""
    end = start + times.total
    stopped = start + deadline if deadline > 0 else math.inf  # (told to stop at the deadline)
    if fails_at is not None:
        failed = fails_at * times.total  # (seconds into its work)
        if start + failed < min(offline_at, stopped):  # dropout ended its work first
            return Outcome(client, "dropped", start + failed, 0, *times.spent(failed))
        offline_at = min(offline_at, start + failed)
    if end > offline_at and offline_at < stopped:  # its device left before it was done
        return Outcome(client, "dropped", offline_at, 0, *times.spent(offline_at - start))
    if deadline > 0 and times.total > deadline:
        steps = times.steps_within(min(deadline, offline_at - start)) if partial else 0
        if steps == 0:
            return Outcome(client, "late", start + deadline, 0, *times.spent(deadline))
        took = times.down_s + sum(times.step_s[:steps]) + times.up_s
        return Outcome(
            client,
            "arrived",
            start + took,
            steps,
            sum(times.step_s[:steps]),
            times.down_s + times.up_s,
        )
    return Outcome(client, "arrived", end, None, *times.spent(times.total))


def plan_sync_round(
    start: float, outcomes: list[Outcome], keep: int, deadline: float
) -> tuple[list[Outcome], float]:
    """The arrivals a sync round keeps (the first `keep`, by time then name; the later ones become
    late) and the round's end: the keep-th arrival, else the deadline, else the last event. A client
    still working when the round ended was told to stop then: it is late at the round's end, also
    when it would have failed later (its device going offline, or dropout, after the K-th
    arrival)."""
    arrived = sorted((o for o in outcomes if o.status == "arrived"), key=lambda o: (o.at, o.client))
    kept = arrived[:keep]
    for extra in arrived[keep:]:  # over-committed: the server stopped listening
        extra.status, extra.steps = "late", 0
    if len(kept) == keep and keep > 0:
        end = kept[-1].at
    elif deadline > 0:
        end = start + deadline
    else:
        end = max((o.at for o in outcomes), default=start)
    for o in outcomes:  # told to stop when the round ended: late, its time clamped to the end
        if o.status == "dropped" and o.at > end:
            o.status, o.steps = "late", 0
        if o.status == "late" and o.at > end:
            o.at = end
    return kept, end


def count_flops(run: Callable[[], Any]) -> float:
    """FLOPs of `run()` (one real local update) as torch's FlopCounterMode counts them, with the
    global RNG left as it was. The CPU's fused attention kernels (forward and backward), which
    the counter has no formula for, are counted by its formula for the other fused attention
    kernels: without them KWT's and the SSL encoders' attention products cost nothing."""
    from torch.utils.flop_counter import (
        FlopCounterMode,
        sdpa_backward_flop_count,
        sdpa_flop_count,
    )

    aten = torch.ops.aten
    attention = {
        aten._scaled_dot_product_flash_attention_for_cpu: (
            lambda q, k, v, *args, out_shape=None, **kwargs: sdpa_flop_count(q, k, v)
        ),
        aten._scaled_dot_product_flash_attention_for_cpu_backward: (
            lambda grad, q, k, v, *args, out_shape=None, **kwargs: sdpa_backward_flop_count(
                grad, q, k, v
            )
        ),
    }
    with (
        torch.random.fork_rng(),
        FlopCounterMode(display=False, custom_mapping=attention) as counter,
    ):
        run()
    return float(counter.get_total_flops())
