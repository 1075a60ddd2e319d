"""Model families, one file each; `build_model` is the single way algorithms create models.

The package face is light: `MODELS`, `build_model` and the rest live in models/registry.py and load
on first use (module `__getattr__` below), so torch-free modules such as `ssl_sizes` (the SSL
encoders' named sizes, read by `fedac memory --help` and `fedac pretrain`) import without loading
torch.

`MODELS` is the model registry (fedac/registry.py): each name -> a builder ("module:function",
imported when the model is built) and a one-line description (`fedac list`); plug-ins add models
through the `fedac.models` entry-point group (docs/extending.md).

Belongs here: a network family in its own file with its builder and registry entries below, the
stacked forms of the CRNNs for cohort training, the SSL encoders with their heads, and the shipped
pretrained encoder (pretrained/, package data). Must not be here: training loops, a method's losses
or federated logic (training/, algorithms/), and no import of fedac.training, algorithms, engine or
flower; never a download (the SSL encoders load local checkpoints only).
"""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    # lazy: start-up time (the registry imports torch through the model families)
    registry = importlib.import_module("fedac.models.registry")
    try:
        return getattr(registry, name)
    except AttributeError:
        raise AttributeError(f"module 'fedac.models' has no attribute {name!r}") from None
