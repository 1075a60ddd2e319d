"""Who is asked to train: the cohort's size from `train.fraction`, and the one function that draws
clients uniformly (`sample_clients`): the `random` selection rule's body (selection.py), which the
ideal federation, the sync clock and the async dispatch reach through `RoundSchedule.choose`, and
Flower's strategy through `sample_cohort`."""

from __future__ import annotations

import numpy as np

from fedac.errors import ConfigError
from fedac.seeding import numpy_rng


def cohort_size(clients: int, fraction: float) -> int:
    """max(1, round(fraction * N)) clients a round (no ceiling)."""
    if not 0 < fraction <= 1:
        raise ConfigError(f"train.fraction must lie in (0, 1], got {fraction}")
    return max(1, int(round(fraction * clients)))


def cohort_rng(seed: int, round_idx: object) -> np.random.Generator:
    """The seeded stream of round `round_idx`'s cohort (the same with and without the clock)."""
    return numpy_rng(seed, "cohort", round_idx)


def sample_clients(candidates: list[str], k: int, rng: np.random.Generator) -> list[str]:
    """`k` of `candidates` drawn uniformly without replacement from `rng`, in the candidates'
    order."""
    picked = rng.choice(len(candidates), k, replace=False)
    return [candidates[i] for i in sorted(picked)]


def sample_cohort(clients: list[str], fraction: float, seed: int, round_idx: int) -> list[str]:
    """The ideal federation's round: `cohort_size` clients drawn from (seed, round)."""
    size = cohort_size(len(clients), fraction)
    return sample_clients(clients, size, cohort_rng(seed, round_idx))
