"""Every random choice derives from (seed, purpose, ids), so runs are reproducible and resumable.

A round's client sampling, a client's batch order and dropout masks depend only on the run seed, the
round and the client id, never on how many random numbers were drawn before. A resumed run therefore
replays exactly what an uninterrupted one would have done.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


def derive_seed(seed: int, purpose: str, *ids: object) -> int:
    """A 63-bit seed that is a stable function of the run seed, a purpose label and ids."""
    text = "\x1f".join([str(int(seed)), purpose, *map(str, ids)])
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def numpy_rng(seed: int, purpose: str, *ids: object) -> np.random.Generator:
    return np.random.default_rng(derive_seed(seed, purpose, *ids))


def torch_generator(
    seed: int, purpose: str, *ids: object, device: torch.device | str = "cpu"
) -> torch.Generator:
    """A generator seeded by (seed, purpose, ids), on the CPU unless `device` names another: draws
    that fill a tensor on a GPU need a generator there (its stream differs from the CPU's)."""
    import torch  # imported here so data-generation workers that only need numpy_rng start fast

    gen = torch.Generator(device=device)
    gen.manual_seed(derive_seed(seed, purpose, *ids))
    return gen
