"""Atomic checkpoints: write to a temporary file in the run directory, fsync, then rename over the old one.

A run killed at any moment leaves either the previous checkpoint or the new one, never a torn file.
In a run over several processes (engine/distributed.py) rank 0 alone writes and reads it: every rank holds
the whole run state, and rank 0 sends the state a run starts from to the others.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from fedac.config import save_config
from fedac.engine.distributed import current_world
from fedac.errors import CheckpointError, FedacError

CHECKPOINT = "checkpoint.pt"


def save_checkpoint(run_dir: Path, payload: dict[str, Any]) -> None:
    if not current_world().writes:
        return  # (rank 0 writes the run's checkpoint; every rank holds the same state)
    path = Path(run_dir) / CHECKPOINT
    tmp = path.with_name(f".{CHECKPOINT}.tmp{os.getpid()}")
    with open(tmp, "wb") as handle:
        torch.save(payload, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def load_checkpoint(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / CHECKPOINT
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}: the run stopped before its first checkpoint; start it again")
    try:
        return torch.load(path, weights_only=False)
    except Exception as exc:  # a foreign or damaged file: say so instead of a pickle traceback
        raise CheckpointError(f"checkpoint {path} cannot be read ({exc}); start the run again") from None


def open_run(run_dir: Path, cfg, resume: bool, fresh) -> dict[str, Any]:
    """The state a run starts from: its checkpoint (resume; refused when it is another algorithm's), or
    `fresh()` after writing the resolved config.yaml into a new run directory. Over several processes,
    rank 0's state (or its error) on every rank, whatever the world size that wrote the checkpoint."""
    world = current_world()
    if not world.distributed:
        return _open_run(run_dir, cfg, resume, fresh)
    outcome: tuple[dict[str, Any] | None, FedacError | None] = (None, None)
    if world.writes:
        try:
            outcome = (_open_run(run_dir, cfg, resume, fresh), None)
        except FedacError as exc:  # sent on, so every rank stops with rank 0's reason
            outcome = (None, exc)
    state, error = world.from_rank0(outcome, "sharing the run's starting state")
    if error is not None:
        raise error
    if not world.writes:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        if not resume:
            fresh()  # (whatever building it sets up in the algorithm, as on rank 0; the state is rank 0's)
    return state


def _open_run(run_dir: Path, cfg, resume: bool, fresh) -> dict[str, Any]:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        save_config(cfg, run_dir / "config.yaml")
        return {**fresh(), "algorithm": cfg.algorithm}
    state = load_checkpoint(run_dir)
    if state.get("algorithm") != cfg.algorithm:
        raise CheckpointError(f"checkpoint in {run_dir} is for '{state.get('algorithm')}', not '{cfg.algorithm}'")
    return state
