"""One file per method; `build_algorithm` maps CLI names to classes."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from fedac.config import Config
from fedac.errors import ConfigError

if TYPE_CHECKING:  # base imports torch; the registry's names must load without it (`fedac run --help` lists them)
    from fedac.algorithms.base import Algorithm, Task

ALGORITHMS: dict[str, str] = {
    "fedavg": "fedac.algorithms.fedavg:FedAvg",
    "fedprox": "fedac.algorithms.fedprox:FedProx",
    "fedadam": "fedac.algorithms.fedopt:FedAdam",
    "fedyogi": "fedac.algorithms.fedopt:FedYogi",
    "fedadagrad": "fedac.algorithms.fedopt:FedAdagrad",
    "fedavgm": "fedac.algorithms.fedopt:FedAvgM",
    "fedmlac": "fedac.algorithms.fedmlac:FedMLAC",
    "fedkad": "fedac.algorithms.fedkad:FedKAD",
    "fedkwsui": "fedac.algorithms.fedkwsui:FedKWSUI",
    "fedmmd": "fedac.algorithms.fedmmd:FedMMD",
    "zeroshot": "fedac.algorithms.zeroshot:ZeroShotFL",
    "earlyexit": "fedac.algorithms.earlyexit:EarlyExitFL",
    "central": "fedac.algorithms.central:Central",
}


def algorithm_class(name: str) -> type[Algorithm]:
    if name not in ALGORITHMS:
        raise ConfigError(f"unknown algorithm '{name}'. Known algorithms: {', '.join(ALGORITHMS)}")
    module, attr = ALGORITHMS[name].split(":")
    return getattr(importlib.import_module(module), attr)


def build_algorithm(cfg: Config, task: Task) -> Algorithm:
    cls = algorithm_class(cfg.algorithm)
    if cfg.model.heterogeneous and not cls.personalized:
        raise ConfigError(
            f"algorithm '{cfg.algorithm}' trains one shared model and cannot run heterogeneous clients; "
            f"set model.heterogeneous=false or use fedmlac / fedkad"
        )
    return cls(cfg, task)
