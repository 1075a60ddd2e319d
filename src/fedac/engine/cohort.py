"""The engine's dispatch of a round's client updates: between the sequential path (`train_client` one
client after another) and an algorithm's stacked cohort hook (training/cohort.py, algorithms/cohort.py).

Never silent (issue 56): `Algorithm.execution_path` names the path ("stacked" or "sequential: <reason>"),
the simulator prints it first and writes it to results.json, and `train.execution=cohort` on a
configuration with no stacked form is a ConfigError naming the reason. A network stacked through
torch.func's vmap is timed both ways on a probe chunk in the first round (`probe`) under auto on an
accelerator, where batching usually wins, and under `train.execution=probe` on any device; under auto on
a CPU it trains sequentially, as every network measured faster so there (`Algorithm.probes` says why it
is not timed there by default: a choice by timing is not repeatable on a busy machine)."""

from __future__ import annotations

import time
from typing import Any

from fedac.algorithms.base import Algorithm
from fedac.errors import ConfigError
from fedac.training.cohort import client_progress
from fedac.training.device import autocast
from fedac.training.step import train_client
from fedac.training.types import ClientData, ClientResult

EXECUTION_MODES = ("auto", "cohort", "sequential", "probe")


def check_execution(mode: str) -> None:
    if mode not in EXECUTION_MODES:
        raise ConfigError(f"train.execution must be one of {', '.join(EXECUTION_MODES)}, got {mode!r}")


def check_path(algorithm: Algorithm) -> str:
    """The path `run_clients` takes (`Algorithm.execution_path`); `train.execution=cohort` on a
    configuration that cannot train stacked is an error naming the reason, never a silent fallback."""
    mode = algorithm.cfg.train.execution
    check_execution(mode)
    path = algorithm.execution_path()
    if mode == "cohort" and path != "stacked":
        raise ConfigError(f"train.execution=cohort, but the clients cannot train stacked: {path[len('sequential: '):]}; "
                          "set train.execution=auto or sequential")
    return path


def run_clients(algorithm: Algorithm, payload: Any, states: list[Any], datas: list[ClientData], round_idx: int,
                seed: int) -> list[ClientResult]:
    """The round's client updates, in `datas` order: through the algorithm's cohort hook when `check_path`
    says stacked, else one client at a time; under auto, a vmapped network first measures both paths on a
    probe chunk (`probe`)."""
    path = check_path(algorithm)
    if path.startswith("auto"):
        return probe(algorithm, payload, states, datas, round_idx, seed)
    if path == "stacked":
        with autocast(algorithm.cfg.train.precision, algorithm.device):  # as train_client has it
            return algorithm.cohort_update(payload, states, datas, round_idx, seed)
    return [train_client(algorithm, payload, state, data, round_idx, seed) for state, data in zip(states, datas)]


def probe(algorithm: Algorithm, payload: Any, states: list[Any], datas: list[ClientData], round_idx: int,
          seed: int) -> list[ClientResult]:
    """`train.execution=auto` with a vmapped network, first round: the first chunk's clients (at most
    `train.cohort_chunk`, 16 on the CPU) train both ways and are timed; the faster path's results are kept
    and it trains the rest of the run (`Algorithm.record_probe`; the checkpoint keeps the choice, so a
    resumed run takes the same path). The first stacked call carries its one-off setup (templates, dropout
    shapes), which counts against it."""
    count = min(len(datas), algorithm.packing.fixed_chunk)
    started, error = time.perf_counter(), None
    try:
        with autocast(algorithm.cfg.train.precision, algorithm.device):
            stacked = algorithm.cohort_update(payload, states[:count], datas[:count], round_idx, seed)
    except (RuntimeError, ConfigError) as exc:  # e.g. a random op vmap cannot give each client (F.dropout)
        stacked, error = [], str(exc).splitlines()[0]
    stacked_s = time.perf_counter() - started if error is None else float("inf")
    started = time.perf_counter()
    with client_progress(lambda done: None):  # the probe's second pass is not progress
        alone = [train_client(algorithm, payload, state, data, round_idx, seed)
                 for state, data in zip(states[:count], datas[:count])]
    chosen = algorithm.record_probe(stacked_s, time.perf_counter() - started, count, error)
    kept = stacked if chosen == "stacked" else alone
    return kept + (run_clients(algorithm, payload, states[count:], datas[count:], round_idx, seed) if count < len(datas) else [])
