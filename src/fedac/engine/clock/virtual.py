"""`SystemClock`: the run's devices and availability (data/traces.py) and the virtual time they give
each client's update (`times`, `outcome`), a sync round's accounting (`sync_round`), the run's first
line on the clock and results.json's `system`. It decides nothing about modes: the schedules
(sync.py, asynchronous.py) ask it."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from fedac.config import Config
from fedac.engine.clock.book import SystemBook
from fedac.engine.clock.model import (
    EMPTY_ROUNDS,
    ClientTimes,
    Outcome,
    client_outcome,
    failure_point,
    plan_sync_round,
)
from fedac.errors import ConfigError
from fedac.training.schedule import step_sizes

log = logging.getLogger(__name__)


class SystemClock:
    """The run's devices, availability and clock (module docstring), built when the run models
    devices or time (`clock.active`). `sizes`: each trainable client's training clips;
    `architecture`: a client's model (its FLOPs); `flops`: counts one architecture's training FLOPs
    per sample."""

    def __init__(
        self,
        cfg: Config,
        sizes: dict[str, int],
        architecture: Callable[[str], str],
        flops: Callable[[str], float],
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
        self.never = self.availability.never_online()
        if self.never:
            shown = ", ".join(self.never[:10]) + (" ..." if len(self.never) > 10 else "")
            log.warning(
                "%d of %d clients are never online in system.availability=%s and never train: %s",
                len(self.never),
                len(names),
                system.availability,
                shown,
            )
        self._steps = {name: step_sizes(n, cfg.train) for name, n in sizes.items()}

    @property
    def reachable(self) -> int:
        """Clients that are online at some time."""
        return len(self.sizes) - len(self.never)

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

    def online(self, clients: list[str], time: float) -> list[str]:
        """Those of `clients` online at `time`."""
        return [c for c in clients if self.availability.online(c, time)]

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
        self,
        book: SystemBook,
        round_idx: int,
        keep: int,
        down_bytes: int,
        up_bytes: int,
        sample: Callable[[list[str], int, object], list[str]] | None = None,
    ) -> tuple[list[Outcome], dict[str, float]]:
        """Round `round_idx`'s clients that count (their outcomes, arrival order) and its metrics;
        advances the clock. `sample(candidates, k, round_idx)`: the clients dispatched among
        those online (default: the cohort's seeded draw, `cohort.sample_clients`)."""
        clients = list(self.sizes)
        online = self.online(clients, book.time)
        if not online:
            book.time = self.first_online(clients, book.time)
            online = self.online(clients, book.time)
        start = book.time
        size = min(len(online), math.ceil(keep * self.system.overcommit - 1e-9))
        sampled = (sample or self.sample)(online, size, round_idx)
        outcomes = [self.outcome(c, start, round_idx, down_bytes, up_bytes) for c in sampled]
        kept, end = plan_sync_round(start, outcomes, keep, self.system.deadline)
        for o in outcomes:
            if o.status == "late":  # (it worked until it was told to stop)
                o.compute_s, o.comm_s = self.times(o.client, down_bytes, up_bytes).spent(
                    o.at - start
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

    def sample(self, candidates: list[str], k: int, round_idx: object) -> list[str]:
        """The sync round's draw: `sample_clients` from the cohort's seeded stream."""
        from fedac.engine.clock.cohort import cohort_rng, sample_clients

        return sample_clients(candidates, k, cohort_rng(self.seed, round_idx))

    def _refuse_deadline(self, sampled: list[str], down_bytes: int, up_bytes: int) -> None:
        fastest = min(self.times(c, down_bytes, up_bytes).total for c in sampled)
        raise ConfigError(
            f"system.deadline={self.system.deadline:g} s: no client finished within it for "
            f"{EMPTY_ROUNDS} rounds in a row (the fastest client of the last round needed "
            f"{fastest:.1f} s); raise system.deadline (e.g. to {2 * fastest:.0f}), or set "
            "system.partial=true so that clients send the steps they finished"
        )

    # --- what the user sees ----------------------------------------------------------------------
    def describe(self, parts: list[str]) -> str:
        """The run's first line's part on the clock, with the schedule's own `parts`."""
        system = self.system
        shown = [f"devices {system.devices}", f"availability {system.availability}", *parts]
        shown += [f"dropout {system.dropout:g}"] if system.dropout else []
        return f"virtual clock: {system.mode} ({', '.join(shown)})"

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
        silent = [c for c in self.sizes if not book.client_columns(c)["arrived"]]
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
