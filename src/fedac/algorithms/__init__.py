"""One file per method; `build_algorithm` maps names to classes through the algorithm registry
(`ALGORITHMS`, in settings/algorithms.py beside each algorithm's settings: built-ins and plug-ins).

Belongs here: a federated method's client and server sides (base.py's Algorithm), one file each,
with its own losses (mutual.py) and its stacked step (in its own file; objective.py's
`LocalObjective` builds one from a local objective), its capabilities as class
attributes (streaming, centralised, personalized, augmentable, ...), and its registry entry and
settings in settings/<name>.py. Must not be here: how a run's clients train (sequential or stacked:
engine/execution.py), the round loop, client sampling, checkpoints or
building data from a config (engine/), a runtime's transport (flower/), and no import of
fedac.engine, flower, the experiment commands or cli; an aggregator or attack that every method can
use belongs in rules/ (aggregation.py, robust.py, attacks.py), not in one method's file.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

from fedac.settings.algorithms import ALGORITHMS

# base imports torch; the registry's names must load without it (`fedac run --help` lists them)
if TYPE_CHECKING:
    from fedac.algorithms.base import Algorithm, Task
    from fedac.config import Config
    from fedac.training.runtime import Runtime

__all__ = ["ALGORITHMS", "algorithm_class", "build_algorithm"]


def algorithm_class(name: str) -> type[Algorithm]:
    """The class registered as `name` (imported now); ConfigError listing the registered names
    otherwise."""
    return ALGORITHMS.load(name)


def build_algorithm(cfg: Config, task: Task, runtime: Runtime | None = None) -> Algorithm:
    """The algorithm `cfg.algorithm` names for `task`, computing where `runtime` says (the driver's;
    None: resolved from `train.*`, training/runtime.py)."""
    cls = algorithm_class(cfg.algorithm)
    if "runtime" not in inspect.signature(cls.__init__).parameters:
        # a plug-in written before the runtime object (`__init__(self, cfg, task)`) still builds;
        # its base class resolves the runtime from `train.*`, which is what a driver resolves too
        return cls(cfg, task)
    return cls(cfg, task, runtime)
