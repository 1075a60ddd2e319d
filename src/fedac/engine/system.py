"""FL as it happens on devices: a deterministic virtual clock (`system.*`, docs/system.md).

Each client has a device (data/traces.py: FLOP/s, upload and download bandwidth, memory) and an
availability pattern. One local update of client k, dispatched at virtual time t, takes

    down_k + sum over its steps s of (FLOPs per sample x samples of step s / flops_per_s_k) + up_k

with down_k / up_k the broadcast's / the upload's bytes over its bandwidths and the FLOPs per sample
counted by fedac (torch's FlopCounterMode) on one real local update of the run's own method and
model (`count_flops`). The client fails when its device goes offline before it is done (the
availability trace), or, with probability `system.dropout` (seeded per client and round), at a
uniform point of its work.

The clock is computed, never measured, so who arrives is known before anyone trains: only the
clients whose updates will count are trained, stacked as without the clock, and a run repeats bit
for bit. The clock, the in-flight work and the counts live in the run state (`SystemBook`), so a run
killed mid-way resumes to the uninterrupted run's numbers.

sync (`plan_sync_round`): the round samples ceil(overcommit x K) clients among those online at its
start (K: train.fraction's cohort), keeps the first K arrivals before the deadline and ends at the
K-th arrival, else at the deadline, else (no deadline) once every sampled client has arrived or
failed. A client that misses the deadline contributes nothing, or with `system.partial` the steps it
finished by then (weighted by the share of its samples it processed).

fedbuff / fedasync (`AsyncClock`): `concurrency` clients train at once, each on the model of the
moment it was dispatched; the event of the earliest finish is processed first. A client takes at
most one job per model version (it waits for the next version), and jobs are trained, one stacked
chunk per version, when that version is about to be replaced (every job of a version starts from
the same global model, so deferring changes nothing). FedBuff (Nguyen et al. 2022) applies every
`buffer` arrivals at once; FedAsync (Xie et al. 2019) each arrival. An update of staleness s (the
server steps since its model) is weighted w(s) = (1 + s)^-a (`staleness_exponent`, 0.5: FedBuff's
1/sqrt(1 + s)) and discarded above `max_staleness`. Both act through the method's own
`server_update`, on uploads re-based onto the current model (`rebase`):

    fedbuff:  u' = x + w(s) (u - x_sent)           (each with its n_k: the mean of the rebased
                                                    uploads is x + sum n_k w(s_k) D_k / sum n_k)
    fedasync: u' = x + alpha w(s) (u - x)           (one arrival: the mean is FedAsync's mixing
                                                    (1 - a_s) x + a_s u)

which needs a method whose upload is a model of the broadcast's form (`Algorithm.dp_compatible`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fedac.config import Config, SystemConfig
from fedac.engine.clock.selection import build_selection
from fedac.engine.state import SystemBook
from fedac.errors import ConfigError
from fedac.seeding import numpy_rng
from fedac.training.schedule import step_sizes

log = logging.getLogger(__name__)

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


def system_active(cfg: SystemConfig) -> bool:
    """Whether the run models devices and time at all (off: the ideal federation, bit for bit the
    numbers of a run without the clock)."""
    return (
        cfg.devices != "none"
        or cfg.availability != "always"
        or cfg.deadline > 0
        or cfg.overcommit > 1
        or cfg.dropout > 0
        or cfg.mode != "sync"
    )


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
    """One client's fate when dispatched at `start` (module docstring): it fails at `fails_at` of
    its work (dropout) or when its device goes offline (`offline_at`); else it arrives, unless the
    deadline comes first (late, or with `partial` the steps it finished)."""
    if fails_at is not None:
        return Outcome(
            client,
            "dropped",
            start + fails_at * times.total,
            0,
            *times.spent(fails_at * times.total),
        )
    end = start + times.total
    stopped = start + deadline if deadline > 0 else math.inf  # (told to stop at the deadline)
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
    late) and the round's end: the keep-th arrival, else the deadline, else the last event."""
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
    for o in outcomes:  # a late client worked until the round ended (then it was told to stop)
        if o.status == "late" and o.at > end:
            o.at = end
    return kept, end


def count_flops(run: Callable[[], Any]) -> float:
    """FLOPs of `run()` (one real local update) as torch's FlopCounterMode counts them, with the
    global RNG left as it was."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.random.fork_rng(), FlopCounterMode(display=False) as counter:
        run()
    return float(counter.get_total_flops())


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


class SystemClock:
    """The run's devices, availability and clock (module docstring), built by the simulator when
    `system_active`. `sizes`: each trainable client's training clips; `architecture`: a client's
    model (its FLOPs); `flops`: counts one architecture's training FLOPs per sample."""

    def __init__(
        self,
        cfg: Config,
        sizes: dict[str, int],
        architecture: Callable[[str], str],
        flops: Callable[[str], float],
        uploads_model: bool,
        partial_work: str | None = None,
    ):
        from fedac.data.traces import load_availability, load_devices

        self.cfg, self.system, self.seed = cfg, cfg.system, cfg.seed
        self.sizes, self.architecture, self.flops = sizes, architecture, flops
        names = list(sizes)
        system = cfg.system
        self.devices = (
            None
            if system.devices == "none"
            else load_devices(system.devices, names, cfg.seed, system.fill)
        )
        self.availability = load_availability(system.availability, names, cfg.seed, system.fill)
        never = self.availability.never_online()
        if never:
            shown = ", ".join(never[:10]) + (" ..." if len(never) > 10 else "")
            log.warning(
                "%d of %d clients are never online in system.availability=%s and never train: %s",
                len(never),
                len(names),
                system.availability,
                shown,
            )
        if system.partial and partial_work is not None:
            raise ConfigError(f"system.partial=true: {partial_work}; set system.partial=false")
        self.asynchronous = system.mode != "sync"
        if self.asynchronous:
            self._check_async(uploads_model, len(names) - len(never))
        self._steps = {name: step_sizes(n, cfg.train) for name, n in sizes.items()}
        #: Who trains (engine/clock/selection.py); the simulator binds its history every round.
        self.selector = build_selection(cfg, sizes, clocked=True)

    def _check_async(self, uploads_model: bool, reachable: int) -> None:
        system = self.system
        if not uploads_model:
            raise ConfigError(
                f"system.mode={system.mode} re-bases each update onto the current model, and "
                f"{self.cfg.algorithm} does not upload a model of its broadcast's form; use "
                "system.mode=sync, or a method of the FedAvg family, fedmlac, fedper or lgfedavg"
            )
        if system.deadline > 0 or system.overcommit > 1 or system.partial:
            raise ConfigError(
                f"system.deadline, system.overcommit and system.partial shape sync rounds; "
                f"system.mode={system.mode} has none (leave them at 0, 1 and false)"
            )
        need = 1 if system.mode == "fedasync" else system.buffer
        if need > reachable:
            raise ConfigError(
                f"system.buffer={system.buffer} needs that many clients to deliver on one model, "
                f"but only {reachable} can ever be online; lower system.buffer"
            )

    # --- times ---------------------------------------------------------------------------------
    def times(self, client: str, down_bytes: int, up_bytes: int) -> ClientTimes:
        """Client `client`'s modelled update (zero seconds without a device trace)."""
        steps = self._steps[client]
        if self.devices is None:
            return ClientTimes(0.0, tuple(0.0 for _ in steps), 0.0)
        device = self.devices[client]
        per_sample = self.flops(self.architecture(client)) / device.flops_per_s
        return ClientTimes(
            8 * down_bytes / device.down_bps,
            tuple(per_sample * size for size in steps),
            8 * up_bytes / device.up_bps,
        )

    def outcome(
        self, client: str, start: float, key: object, down_bytes: int, up_bytes: int
    ) -> Outcome:
        times = self.times(client, down_bytes, up_bytes)
        return client_outcome(
            client,
            start,
            times,
            self.availability.online_until(client, start),
            failure_point(self.system, self.seed, key, client),
            self.system.deadline,
            self.system.partial,
        )

    def share_done(self, client: str, steps: int | None) -> float:
        """The share of its samples a client processed in `steps` local steps (None: all)."""
        sizes = self._steps[client]
        return 1.0 if steps is None else sum(sizes[:steps]) / max(1, sum(sizes))

    def first_online(self, clients: list[str], start: float) -> float:
        """The earliest time >= start at which one of `clients` is online (a ConfigError if
        never)."""
        when = min((self.availability.next_online(c, start) for c in clients), default=math.inf)
        if math.isinf(when):
            raise ConfigError(
                f"no client is ever online again after virtual time {start:.0f} s in "
                f"system.availability={self.system.availability}"
            )
        return when

    # --- sync ----------------------------------------------------------------------------------
    def sync_round(
        self, book: SystemBook, round_idx: int, keep: int, down_bytes: int, up_bytes: int
    ) -> tuple[list[Outcome], dict[str, float]]:
        """Round `round_idx`'s clients that count (their outcomes, arrival order) and its metrics;
        advances the clock."""
        clients = list(self.sizes)
        online = [c for c in clients if self.availability.online(c, book.time)]
        if not online:
            book.time = self.first_online(clients, book.time)
            online = [c for c in clients if self.availability.online(c, book.time)]
        start = book.time
        size = min(len(online), math.ceil(keep * self.system.overcommit - 1e-9))
        times = lambda c: self.times(c, down_bytes, up_bytes)  # noqa: E731
        sampled = self.selector.choose(online, size, ("cohort", round_idx), round_idx, times)
        outcomes = [self.outcome(c, start, round_idx, down_bytes, up_bytes) for c in sampled]
        kept, end = plan_sync_round(start, outcomes, keep, self.system.deadline)
        for o in outcomes:
            o.compute_s, o.comm_s = (
                (o.compute_s, o.comm_s)
                if o.status != "late"
                else self.times(o.client, down_bytes, up_bytes).spent(o.at - start)
            )
            book.record(o.client, o.status, o.compute_s, o.comm_s)
        book.time = end
        book.empty_rounds = 0 if kept else book.empty_rounds + 1
        if book.empty_rounds >= EMPTY_ROUNDS and self.system.deadline > 0:
            self._refuse_deadline(sampled, down_bytes, up_bytes)
        metrics = {
            "virtual_time_s": end,
            "round_s": end - start,
            "sampled": float(len(sampled)),
            "arrived": float(len(kept)),
            "late": float(sum(o.status == "late" for o in outcomes)),
            "dropped": float(sum(o.status == "dropped" for o in outcomes)),
        }
        return kept, metrics

    def _refuse_deadline(self, sampled: list[str], down_bytes: int, up_bytes: int) -> None:
        fastest = min(self.times(c, down_bytes, up_bytes).total for c in sampled)
        raise ConfigError(
            f"system.deadline={self.system.deadline:g} s: no client finished within it for "
            f"{EMPTY_ROUNDS} rounds in a row (the fastest client of the last round needed "
            f"{fastest:.1f} s); raise system.deadline (e.g. to {2 * fastest:.0f}), or set "
            "system.partial=true so that clients send the steps they finished"
        )

    # --- async ---------------------------------------------------------------------------------
    def dispatch(self, book: SystemBook, in_flight: int, down_bytes: int, up_bytes: int) -> int:
        """FedBuff / FedAsync: fill the free slots (`system.concurrency` less the clients in
        flight) with clients online now that have not yet taken a delivering job on this model
        version; the number dispatched."""
        busy = {job["client"] for job in book.jobs}
        eligible = [
            c
            for c in self.sizes
            if c not in busy
            and book.delivered.get(c, -1) != book.version
            and self.availability.online(c, book.time)
        ]
        free = min(in_flight - len(book.jobs), len(eligible))
        if free <= 0:
            return 0
        times = lambda c: self.times(c, down_bytes, up_bytes)  # noqa: E731
        key = ("dispatch", book.dispatched)
        for client in self.selector.choose(eligible, free, key, book.version + 1, times):
            outcome = self.outcome(
                client, book.time, ("async", book.dispatched), down_bytes, up_bytes
            )
            book.dispatched += 1
            if outcome.status == "arrived":
                book.delivered[client] = book.version
            book.jobs.append(
                {
                    "client": client,
                    "version": book.version,
                    "at": outcome.at,
                    "status": outcome.status,
                    "compute_s": outcome.compute_s,
                    "comm_s": outcome.comm_s,
                    "result": None,
                }
            )
        return free

    def wait(self, book: SystemBook) -> None:
        """Nothing in flight and no client to dispatch: move the clock to the next time a client
        that may take a job comes online (a ConfigError where none ever can)."""
        waiting = [c for c in self.sizes if book.delivered.get(c, -1) != book.version]
        if not waiting:
            raise ConfigError(
                f"system.buffer={self.system.buffer}: every client has delivered on model version "
                f"{book.version} and the buffer is still not full; lower system.buffer"
            )
        book.time = self.first_online(waiting, book.time)

    def next_event(self, book: SystemBook) -> dict[str, Any]:
        """The job in flight that finishes (or fails) first; the clock moves to it."""
        job = min(book.jobs, key=lambda j: (j["at"], j["client"]))
        book.jobs.remove(job)
        book.time = job["at"]
        staleness = book.version - job["version"]
        book.record(job["client"], job["status"], job["compute_s"], job["comm_s"], staleness)
        return job

    def concurrency(self, cohort: int) -> int:
        return self.system.concurrency or cohort

    def rebased(self, job: dict[str, Any], current: Any, version: int) -> Any:
        """A delivered job's upload re-based onto the current model (module docstring)."""
        weight = staleness_weight(version - job["version"], self.system.staleness_exponent)
        if self.system.mode == "fedbuff":
            return rebase(job["result"].upload, current, weight)  # (kept as a difference)
        upload = job["result"].upload
        return rebase(difference(upload, current), current, self.system.alpha * weight)

    # --- what the user sees ----------------------------------------------------------------------
    def describe(self) -> str:
        """The run's first line's part on the clock."""
        system = self.system
        parts = [f"devices {system.devices}", f"availability {system.availability}"]
        if self.asynchronous:
            parts.append(f"buffer {system.buffer}" if system.mode == "fedbuff" else "buffer 1")
        else:
            parts += [f"deadline {system.deadline:g} s" if system.deadline else "no deadline"]
            parts += [f"over-commit {system.overcommit:g}"] if system.overcommit > 1 else []
        parts += [f"dropout {system.dropout:g}"] if system.dropout else []
        return f"virtual clock: {system.mode} ({', '.join(parts)})"

    def summary(
        self, book: SystemBook, history: list[dict[str, float]], flops: dict[str, float]
    ) -> dict[str, Any]:
        """results.json's `system`: the clock at the end, the time to `system.target_accuracy`, and
        the clients never heard from."""
        target = self.system.target_accuracy
        reached = next(
            (
                row["virtual_time_s"]
                for row in history
                if target is not None
                and row.get("val_accuracy", -1.0) >= target
                and "virtual_time_s" in row
            ),
            None,
        )
        silent = [c for c in self.sizes if not book.clients.get(c, [0.0] * 6)[2]]
        return {
            "mode": self.system.mode,
            "devices": self.system.devices,
            "availability": self.system.availability,
            "virtual_time_s": book.time,
            "target_accuracy": target,
            "time_to_target_s": reached,
            "clients_never_contributed": len(silent),
            "never_contributed_fraction": len(silent) / max(1, len(self.sizes)),
            "training_flops_per_sample": dict(flops),
        }
