"""Atomic checkpoints: write to a temporary file in the run directory, fsync, then rename over the
old one.

A run killed at any moment leaves either the previous checkpoint or the new one, never a torn file.
In a run over several processes (engine/distributed.py) rank 0 alone writes and reads it. Where
client states live with their owner (`owner`), a checkpoint gathers them to rank 0 first, so the
file is always one whole run state that one process or any other world size resumes; on resume rank
0 sends the others the global state and each rank only the client states it owns under the new world
size.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from fedac.config import save_config
from fedac.engine.distributed import current_world
from fedac.engine.state import RunState
from fedac.errors import CheckpointError, FedacError

CHECKPOINT = "checkpoint.pt"


def save_checkpoint(run_dir: Path, state: RunState, owned: bool = False) -> None:
    """Write `state` as the run's checkpoint. `owned`: each rank holds only its own clients' states
    (`state.clients`); they are gathered to rank 0 first (every rank calls this then)."""
    world = current_world()
    payload = state.to_checkpoint()
    if owned and world.distributed:
        parts = world.to_rank0(
            state.clients, "gathering the client states for the checkpoint", state.round
        )
        if parts is not None:  # (rank 0: the union, rank by rank)
            payload["clients"] = {name: value for part in parts for name, value in part.items()}
    if not world.writes:
        return  # (rank 0 writes the run's checkpoint)
    path = Path(run_dir) / CHECKPOINT
    tmp = path.with_name(f".{CHECKPOINT}.tmp{os.getpid()}")
    with open(tmp, "wb") as handle:
        torch.save(payload, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def load_checkpoint(run_dir: Path) -> RunState:
    path = Path(run_dir) / CHECKPOINT
    if not path.is_file():
        raise CheckpointError(
            f"no checkpoint at {path}: the run stopped before its first checkpoint; start it again"
        )
    try:
        saved = torch.load(path, weights_only=False)
    except Exception as exc:  # a foreign or damaged file: say so instead of a pickle traceback
        raise CheckpointError(
            f"checkpoint {path} cannot be read ({exc}); start the run again"
        ) from None
    if not isinstance(saved, dict):
        raise CheckpointError(f"checkpoint {path} holds no run state; start the run again")
    return RunState.from_checkpoint(saved, path)


def continue_to(run_dir: Path, cfg) -> None:
    """Make the run in `run_dir` one of `cfg.train.rounds` rounds, more than it was made for (`fedac
    run --resume DIR --rounds N`, a table whose schedule grew): its config.yaml says the new
    schedule, and its results.json, written at the old last round, goes, so whoever reads the
    directory back sees an unfinished run that resumes from its last checkpoint (`open_run`)."""
    save_config(cfg, Path(run_dir) / "config.yaml")
    (Path(run_dir) / "results.json").unlink(missing_ok=True)


def open_run(
    run_dir: Path, cfg, resume: bool, fresh, owner: Callable[[str], int] | None = None
) -> RunState:
    """The state a run starts from: its checkpoint (resume; refused when it is another algorithm's),
    or `fresh()` after writing the resolved config.yaml into a new run directory. Over several
    processes, rank 0's state (or its error) on every rank, whatever the world size that wrote the
    checkpoint; with `owner` (client name -> its rank), a rank receives only the client states it
    owns."""
    world = current_world()
    if not world.distributed:
        return _open_run(run_dir, cfg, resume, fresh)
    outcome: tuple[RunState | None, FedacError | None] = (None, None)
    per_rank: list[dict[str, Any]] | None = None
    if world.writes:
        try:
            outcome = (_open_run(run_dir, cfg, resume, fresh), None)
        except FedacError as exc:  # sent on, so every rank stops with rank 0's reason
            outcome = (None, exc)
        # (the states travel to their owners alone)
        if owner is not None and outcome[0] is not None:
            state = outcome[0]
            per_rank = [{} for _ in range(world.size)]
            for name, value in state.clients.items():
                per_rank[owner(name)][name] = value
            outcome = (replace(state, clients={}), None)
    state, error = world.from_rank0(outcome, "sharing the run's starting state")
    if error is not None:
        raise error
    assert state is not None  # (rank 0 sent a state or an error)
    if owner is not None:
        state.clients = world.from_rank0_each(
            per_rank, "handing each rank the client states it owns"
        )
    if not world.writes:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        if not resume:
            # (whatever building it sets up in the algorithm, as on rank 0; the state is rank 0's)
            fresh()
    return state


def _open_run(run_dir: Path, cfg, resume: bool, fresh) -> RunState:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        save_config(cfg, run_dir / "config.yaml")
        return fresh()
    state = load_checkpoint(run_dir)
    if state.algorithm != cfg.algorithm:
        raise CheckpointError(
            f"checkpoint in {run_dir} is for '{state.algorithm}', not '{cfg.algorithm}'"
        )
    return state
