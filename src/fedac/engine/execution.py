"""How a round's clients train: the engine's decision, made once per run and owned by the round
driver. An algorithm only declares what it supports (a `cohort_update` marked `@reproduces` its
`client_update`, and each architecture's `stacked_kind`); the `ExecutionPlan` here checks that
declaration, measures where measuring is asked for, records the choice, and runs every round on it.

The paths:
- sequential: `train_client` one client after another;
- stacked: the algorithm's `cohort_update` (clients along a leading axis: training/stacking.py).

`runtime.execution`:
- `sequential` and `cohort` force a path (`cohort` on a configuration that cannot stack is a
  ConfigError naming the reason, at start);
- `auto` stacks every configuration that can: the CRNNs' hand-written stacked forward is always
  faster, so it is never timed; a network stacked through vmap, or through the KWS networks'
  hand-written forms (models/kws_stacked.py: faster on some CPUs, not on others, so measured), is
  timed both ways on a probe chunk of the first round, on the user's own machine, unless a
  measurement for this model, device and machine is cached (`ProbeCache`, under the feature cache),
  and the faster path trains the run: stacked where the probe measured it faster, and the run says
  so with the two timings;
- `probe` times it in any case (the cache is refreshed, not read).

Never silent: `ExecutionPlan.path` names the path ("stacked" or "sequential: <reason>"), the run
prints it first and writes it (and the probe's timings) to results.json. The measured choice goes
into the checkpoint (`RunState.auto_choice`), so a resumed run takes the same path, and over
torchrun every rank follows rank 0's measurement.

Repeatable: a run that probes keeps, for its first round, exactly what the chosen path computes on
its own (a stacked choice re-trains the round stacked, so the probe's chunking leaves no trace), so
a later run of the same command that reads the cached choice gives the same numbers bit for bit.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

from fedac.algorithms.base import Algorithm
from fedac.config import EXECUTION_MODES
from fedac.data.features import cache_root
from fedac.errors import ConfigError
from fedac.training.device import autocast, device_name
from fedac.training.packing import PROBE_CLIENTS
from fedac.training.stacking import client_progress
from fedac.training.step import train_client
from fedac.training.types import ClientData, ClientResult

#: The stacked forms `auto` times against the sequential path (the CRNNs' is always faster).
PROBED_KINDS = ("vmap", "kws")


def check_execution(mode: str) -> None:
    """ConfigError for a `runtime.execution` outside `EXECUTION_MODES` (a config built by hand
    rather than loaded: a loaded one was checked by its choice)."""
    if mode not in EXECUTION_MODES:
        raise ConfigError(
            f"runtime.execution must be one of {', '.join(EXECUTION_MODES)}, got {mode!r}"
        )


def stacking_obstacle(algorithm: Algorithm) -> str | None:
    """Why `algorithm` in its configuration cannot train stacked (None: it can): what it declares
    is checked, not trusted. Its `cohort_update` must be marked `@reproduces` the `client_update`
    in effect (a subclass that overrides `client_update` has no stacked form of it), the optimiser
    must have a stacked form, and every architecture it stacks a stacked forward."""
    cls = type(algorithm).__name__
    if algorithm.no_stacked_form is not None:  # (an instance may set it from its config)
        return algorithm.no_stacked_form
    target = getattr(type(algorithm).cohort_update, "reproduces", None)
    if target is None:
        return f"{cls} has no stacked cohort_update"
    current = getattr(algorithm.client_update, "__func__", None)
    if current is not target:
        owner = next(
            (
                k.__name__
                for k in type(algorithm).__mro__
                if k.__dict__.get("client_update") is current
            ),
            None,
        )
        return f"{owner} overrides client_update" if owner else f"{cls}.client_update was replaced"
    # lazy: torch.func loads with the stacked path
    from fedac.training.functional import OPTIMIZERS

    optimizer = algorithm.cfg.train.optimizer
    if optimizer not in OPTIMIZERS:
        return f"train.optimizer={optimizer} has no stacked form"
    for arch in algorithm.stacked_architectures():
        kind = algorithm.stacked_kind(arch)
        if kind.startswith("none"):
            return f"model {arch} has no stacked forward ({kind[len('none: ') :]})"
    return None


def machine_id(device: torch.device) -> str:
    """What a probe's timing depends on besides the model: the device (a GPU by name), the CPU's
    model, its kernels and the thread count, and torch's version."""
    if device.type == "cuda":
        where = device_name(device)
    else:
        where = (
            f"{platform.machine()} {_cpu_model()} {torch.backends.cpu.get_cpu_capability()} "
            f"threads {torch.get_num_threads()}"
        )
    return f"{where} torch {torch.__version__}"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown cpu"


class ProbeCache:
    """Probe measurements kept between runs on one machine (`<feature cache>/execution-probes.json`:
    "<architectures>|<machine>" -> the measurement), so `auto` times a vmapped network once per
    machine, not once per run, and two runs of one command take one path."""

    def __init__(self, root: Path, writes: bool = True):
        self.path = root / "execution-probes.json"
        #: False on torchrun's other ranks: rank 0's measurement is the one every rank follows, so
        #: it alone is kept.
        self.writes = writes

    def read(self, key: str) -> dict[str, Any] | None:
        try:
            entry = json.loads(self.path.read_text()).get(key)
        except (OSError, ValueError):  # none yet, or unreadable: measure again
            return None
        return entry if isinstance(entry, dict) and entry.get("path") else None

    def write(self, key: str, measurement: dict[str, Any]) -> None:
        if not self.writes:
            return
        try:
            saved = json.loads(self.path.read_text())
        except (OSError, ValueError):
            saved = {}
        saved[key] = measurement
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(saved, indent=2, sort_keys=True))
        os.replace(tmp, self.path)


class ExecutionPlan:
    """How this run's clients train (see the module docstring): built once by the round driver from
    the algorithm's declaration, run every round (`run`), its measurement checkpointed
    (`measured`, `restore`) and shared over torchrun (`adopt`)."""

    def __init__(self, algorithm: Algorithm, cache: ProbeCache | None = None):
        self.algorithm = algorithm
        self.mode = algorithm.cfg.runtime.execution
        self.obstacle = None if self.mode == "sequential" else stacking_obstacle(algorithm)
        if self.mode == "cohort" and self.obstacle is not None:
            raise ConfigError(
                "runtime.execution=cohort, but the clients cannot train stacked: "
                f"{self.obstacle}; set runtime.execution=auto or sequential"
            )
        stacks = self.obstacle is None and self.mode != "sequential"
        archs = algorithm.stacked_architectures() if stacks else []
        self.key = f"{','.join(archs)}@{algorithm.device}"
        #: The architectures whose stacked speed is measured, not assumed: the vmapped ones and the
        #: KWS networks' hand-written forms (`PROBED_KINDS`).
        self.vmapped = [a for a in archs if algorithm.stacked_kind(a) in PROBED_KINDS]
        #: The probe's measurement per key ({path, stacked_s, sequential_s, clients[, error]}).
        self.measured: dict[str, dict[str, Any]] = {}
        self.cache = cache
        self.machine = machine_id(algorithm.device)
        if cache is not None and self.mode == "auto" and self.vmapped:
            cached = cache.read(self._cache_key)
            if cached is not None:
                self.measured[self.key] = {**cached, "cached": True}

    @classmethod
    def for_run(cls, algorithm: Algorithm, writes: bool = True) -> ExecutionPlan:
        """A run's plan, with the machine's probe cache under the feature cache (`writes`: this
        process keeps its measurement there; torchrun's rank 0 alone)."""
        return cls(algorithm, ProbeCache(cache_root(algorithm.cfg.data.cache_dir), writes))

    @property
    def _cache_key(self) -> str:
        return f"{self.key}|{self.machine}"

    @property
    def probes(self) -> bool:
        """Whether this run times the paths (a vmapped network under auto or probe)."""
        return bool(self.vmapped) and self.mode in ("auto", "probe")

    @property
    def needs_probe(self) -> bool:
        return self.probes and self.key not in self.measured

    @property
    def path(self) -> str:
        """ "stacked", "sequential: <reason>", or, before the probe, "auto: ..." (the run's first
        line and results.json name it)."""
        if self.mode == "sequential":
            return "sequential: runtime.execution=sequential"
        if self.obstacle is not None:
            return f"sequential: {self.obstacle}"
        if not self.probes:
            return "stacked"
        choice = self.measured.get(self.key)
        if choice is None:
            return (
                "auto: stacked or sequential, whichever a probe chunk of the first round trains "
                "faster"
            )
        arch = self.vmapped[0]
        kind = self.algorithm.stacked_kind(arch)
        if "error" in choice:
            return (
                f"sequential: model {arch}'s stacked path ({kind}) failed on the probe chunk: "
                + (choice["error"])
            )
        if choice["path"] == "sequential":
            # measured, not assumed: on a CPU vmapped convolutions can lose to per-client oneDNN
            return (
                f"sequential: auto measured model {arch}'s stacked path ({kind}) slower on "
                f"{device_name(self.algorithm.device)}: {choice['stacked_s']:.2f} s against "
                f"{choice['sequential_s']:.2f} s for a probe of {choice['clients']} clients"
                f"{' (cached for this machine)' if choice.get('cached') else ''} "
                "(runtime.execution=cohort forces it)"
            )
        return "stacked"

    @property
    def verdict(self) -> str:
        """`path`, and for a measured stacked choice the measurement behind it (what the run
        prints once the probe has chosen)."""
        choice = self.measured.get(self.key)
        if self.path != "stacked" or not self.probes or choice is None:
            return self.path
        arch = self.vmapped[0]
        return (
            f"stacked: auto measured model {arch}'s stacked path "
            f"({self.algorithm.stacked_kind(arch)}) faster on "
            f"{device_name(self.algorithm.device)}: {choice['stacked_s']:.2f} s against "
            f"{choice['sequential_s']:.2f} s for a probe of {choice['clients']} clients"
            f"{' (cached for this machine)' if choice.get('cached') else ''}"
        )

    def restore(self, measured: dict[str, dict[str, Any]]) -> None:
        """A resumed run's measurement (the checkpoint's), which outranks the machine's cache."""
        self.measured.update(measured)

    def adopt(self, measured: dict[str, dict[str, Any]]) -> None:
        """Another process's measurement (torchrun: rank 0's), in place of this one's."""
        self.measured.clear()
        self.measured.update(measured)

    def run(
        self,
        payload: Any,
        states: list[Any],
        datas: list[ClientData],
        round_idx: int,
        seed: int,
    ) -> list[ClientResult]:
        """The round's client updates, in `datas` order, on this plan's path (probing first where
        the path is still unmeasured)."""
        if self.needs_probe:
            return self._probe(payload, states, datas, round_idx, seed)
        algorithm = self.algorithm
        if self.path == "stacked":
            with autocast(algorithm.cfg.runtime.precision, algorithm.device):  # as train_client's
                return algorithm.cohort_update(payload, states, datas, round_idx, seed)
        return [
            train_client(algorithm, payload, state, data, round_idx, seed)
            for state, data in zip(states, datas)
        ]

    def _probe(
        self,
        payload: Any,
        states: list[Any],
        datas: list[ClientData],
        round_idx: int,
        seed: int,
    ) -> list[ClientResult]:
        """Both paths train the same clients and are timed; the faster one trains the run.

        Fair to both:
        - each path first trains `warm` clients untimed (one-off set-up: templates, dropout shapes,
          kernels, and on a GPU packing's memory probe of `PROBE_CLIENTS`), then the next clients
          are timed;
        - where packing sizes chunks by memory (auto on a GPU) the timed clients are the rest of
          the round, so the stacked path is timed on the chunks it will train, not on 8 at a time;
          elsewhere they are one chunk (`runtime.cohort_chunk`, 16 on the CPU).
        A sequential choice keeps its clients' results (each client's computation is its own); a
        stacked one trains the round again stacked, so its numbers are those of a run that read
        the choice from the cache."""
        algorithm = self.algorithm
        packing = algorithm.packing
        warm = min(PROBE_CLIENTS, len(datas) // 2) if packing.by_memory else min(1, len(datas) - 1)
        count = len(datas) if packing.by_memory else min(len(datas), warm + packing.fixed_chunk)
        error = None
        with client_progress(lambda done: None):  # the probe is not the round's progress
            alone = [
                train_client(algorithm, payload, state, data, round_idx, seed)
                for state, data in zip(states[:warm], datas[:warm])
            ]
            try:
                with autocast(algorithm.cfg.runtime.precision, algorithm.device):
                    if warm:
                        algorithm.cohort_update(
                            payload, states[:warm], datas[:warm], round_idx, seed
                        )
                    started = _now(algorithm.device)
                    algorithm.cohort_update(
                        payload, states[warm:count], datas[warm:count], round_idx, seed
                    )
                    stacked_s = _now(algorithm.device) - started
            # e.g. a random op vmap cannot give each client (F.dropout)
            except (RuntimeError, ConfigError) as exc:
                error, stacked_s = str(exc).splitlines()[0], float("inf")
            started = _now(algorithm.device)
            alone += [
                train_client(algorithm, payload, state, data, round_idx, seed)
                for state, data in zip(states[warm:count], datas[warm:count])
            ]
            sequential_s = _now(algorithm.device) - started
        self.record(stacked_s, sequential_s, count - warm, error)
        # the run's first line said "auto: ..."; this says what the probe chose
        if self.cache is not None and self.cache.writes:
            print(f"fedac: clients train {self.verdict}", file=sys.stderr, flush=True)
        if self.path == "stacked":
            return self.run(payload, states, datas, round_idx, seed)
        return alone + self.run(payload, states[count:], datas[count:], round_idx, seed)

    def record(
        self, stacked_s: float, sequential_s: float, clients: int, error: str | None = None
    ) -> str:
        """A probe's timings: the faster path (returned) trains the run from now on, and the
        machine's cache keeps it; a stacked probe that raised (`error`) leaves the sequential
        path, with the error as its reason (not cached: it is not a speed)."""
        path = "stacked" if error is None and stacked_s <= sequential_s else "sequential"
        measurement = {
            "path": path,
            "stacked_s": stacked_s,
            "sequential_s": sequential_s,
            "clients": clients,
            **({"error": error} if error else {}),
        }
        self.measured[self.key] = measurement
        if self.cache is not None and error is None:
            self.cache.write(self._cache_key, {**measurement, "machine": self.machine})
        return path


def run_clients(
    algorithm: Algorithm,
    payload: Any,
    states: list[Any],
    datas: list[ClientData],
    round_idx: int,
    seed: int,
    plan: ExecutionPlan | None = None,
) -> list[ClientResult]:
    """One round's client updates on `plan` (default: a fresh plan of `algorithm`, no cache)."""
    return (plan or ExecutionPlan(algorithm)).run(payload, states, datas, round_idx, seed)


def _now(device) -> float:
    """The wall clock once `device` has finished its queued work (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
