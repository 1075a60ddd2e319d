"""One client's update with its randomness fixed: the step every runtime (simulator, Flower
ClientApp, zero-shot driver, an algorithm's sequential cohort fallback) goes through, so they
produce the same numbers."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from fedac.config import Config
from fedac.seeding import derive_seed, torch_generator
from fedac.training.device import autocast
from fedac.training.local import STEP_LIMIT
from fedac.training.stacking import clients_done
from fedac.training.types import ClientData, ClientResult


class ClientUpdater(Protocol):
    """What `train_client` needs of an algorithm (algorithms.base.Algorithm, which sits above this
    layer)."""

    cfg: Config
    device: torch.device

    def client_update(
        self, payload: Any, state: Any, data: ClientData, round_idx: int, generator: torch.Generator
    ) -> ClientResult: ...


def train_client(
    algorithm: ClientUpdater, payload: Any, state: Any, data: ClientData, round_idx: int, seed: int
) -> ClientResult:
    """One client's update with its randomness fixed by (seed, round, client): the batch order comes
    from a derived generator and dropout from the global RNG seeded the same way. Every runtime
    (simulator, zero-shot driver, Flower ClientApp) calls this, so they produce the same numbers, in
    the same arithmetic (`runtime.precision`'s autocast)."""
    torch.manual_seed(derive_seed(seed, "dropout", round_idx, data.name))
    limit = STEP_LIMIT.set(data.step_limit)
    try:
        with autocast(algorithm.cfg.runtime.precision, algorithm.device):
            result = algorithm.client_update(
                payload,
                state,
                data,
                round_idx,
                torch_generator(seed, "batches", round_idx, data.name),
            )
    finally:
        STEP_LIMIT.reset(limit)
    clients_done(1)  # the round's progress bar (engine/rounds.py), whichever path called this
    return result
