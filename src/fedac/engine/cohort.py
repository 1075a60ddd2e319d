"""The engine's dispatch of a round's client updates: between the sequential path (`train_client`
one client after another) and an algorithm's stacked cohort hook (training/cohort.py,
algorithms/cohort.py).

Never silent (issue 56): `Algorithm.execution_path` names the path ("stacked" or "sequential:
<reason>"), the simulator prints it first and writes it to results.json, and
`train.execution=cohort` on a configuration with no stacked form is a ConfigError naming the reason.
A network stacked through torch.func's vmap is timed both ways on a probe chunk in the first round
(`probe`) under auto on an accelerator, where batching usually wins, and under
`train.execution=probe` on any device; under auto on a CPU it trains sequentially, as every network
measured faster so there (`Algorithm.probes` says why it is not timed there by default: a choice by
timing is not repeatable on a busy machine)."""

from __future__ import annotations

import time
from typing import Any

import torch

from fedac.algorithms.base import Algorithm
from fedac.errors import ConfigError
from fedac.training.cohort import client_progress
from fedac.training.device import autocast
from fedac.training.packing import PROBE_CLIENTS
from fedac.training.step import train_client
from fedac.training.types import ClientData, ClientResult

EXECUTION_MODES = ("auto", "cohort", "sequential", "probe")


def check_execution(mode: str) -> None:
    if mode not in EXECUTION_MODES:
        raise ConfigError(
            f"train.execution must be one of {', '.join(EXECUTION_MODES)}, got {mode!r}"
        )


def check_path(algorithm: Algorithm) -> str:
    """The path `run_clients` takes (`Algorithm.execution_path`); `train.execution=cohort` on a
    configuration that cannot train stacked is an error naming the reason, never a silent
    fallback."""
    mode = algorithm.cfg.train.execution
    check_execution(mode)
    path = algorithm.execution_path()
    if mode == "cohort" and path != "stacked":
        raise ConfigError(
            "train.execution=cohort, but the clients cannot train stacked: "
            f"{path[len('sequential: ') :]}; set train.execution=auto or sequential"
        )
    return path


def run_clients(
    algorithm: Algorithm,
    payload: Any,
    states: list[Any],
    datas: list[ClientData],
    round_idx: int,
    seed: int,
) -> list[ClientResult]:
    """The round's client updates, in `datas` order: through the algorithm's cohort hook when
    `check_path` says stacked, else one client at a time; under auto, a vmapped network first
    measures both paths on a probe chunk (`probe`)."""
    path = check_path(algorithm)
    if path.startswith("auto"):
        return probe(algorithm, payload, states, datas, round_idx, seed)
    if path == "stacked":
        with autocast(algorithm.cfg.train.precision, algorithm.device):  # as train_client has it
            return algorithm.cohort_update(payload, states, datas, round_idx, seed)
    return [
        train_client(algorithm, payload, state, data, round_idx, seed)
        for state, data in zip(states, datas)
    ]


def probe(
    algorithm: Algorithm,
    payload: Any,
    states: list[Any],
    datas: list[ClientData],
    round_idx: int,
    seed: int,
) -> list[ClientResult]:
    """`train.execution=auto` with a vmapped network, first round: both paths train the same clients
    and are timed; the faster path's results are kept and it trains the rest of the run
    (`Algorithm.record_probe`; the checkpoint keeps the choice, so a resumed run takes the same
    path).

    Fair to both (issue 56's GPU finding, where a probe of 16 clients ran stacked as packing's
    memory probe of 8 plus a chunk of 8, with the process's first CUDA and vmap set-up counted
    against it):
    - each path first trains `warm` clients untimed (one-off set-up: templates, dropout shapes,
      kernels, and on a GPU packing's memory probe of `PROBE_CLIENTS`), then the next clients are
      timed;
    - where packing sizes chunks by memory (auto on a GPU) the timed clients are the rest of the
      round, so the stacked path is timed on the chunks it will train (as full as memory allows),
      not on 8 at a time; elsewhere they are one chunk (`train.cohort_chunk`, 16 on the CPU).
    The first round so trains its probed clients twice (once per path)."""
    packing = algorithm.packing
    warm = min(PROBE_CLIENTS, len(datas) // 2) if packing.by_memory else min(1, len(datas) - 1)
    count = len(datas) if packing.by_memory else min(len(datas), warm + packing.fixed_chunk)
    stacked, error = [], None
    # the sequential pass is not progress (the stacked one counts)
    with client_progress(lambda done: None):
        alone = [
            train_client(algorithm, payload, state, data, round_idx, seed)
            for state, data in zip(states[:warm], datas[:warm])
        ]
    try:
        with autocast(algorithm.cfg.train.precision, algorithm.device):
            stacked = (
                algorithm.cohort_update(payload, states[:warm], datas[:warm], round_idx, seed)
                if warm
                else []
            )
            started = _now(algorithm.device)
            stacked += algorithm.cohort_update(
                payload, states[warm:count], datas[warm:count], round_idx, seed
            )
            stacked_s = _now(algorithm.device) - started
    # e.g. a random op vmap cannot give each client (F.dropout)
    except (RuntimeError, ConfigError) as exc:
        stacked, error, stacked_s = [], str(exc).splitlines()[0], float("inf")
    started = _now(algorithm.device)
    with client_progress(lambda done: None):
        alone += [
            train_client(algorithm, payload, state, data, round_idx, seed)
            for state, data in zip(states[warm:count], datas[warm:count])
        ]
    sequential_s = _now(algorithm.device) - started
    chosen = algorithm.record_probe(stacked_s, sequential_s, count - warm, error)
    kept = stacked if chosen == "stacked" else alone
    return kept + (
        run_clients(algorithm, payload, states[count:], datas[count:], round_idx, seed)
        if count < len(datas)
        else []
    )


def _now(device) -> float:
    """The wall clock once `device` has finished its queued work (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
