"""Which round driver runs an algorithm, chosen by its `streaming` capability, so that no command
names an algorithm: the simulator over a fixed partition, or the zero-shot driver
(engine/zeroshot.py: fresh user data every round). Both run the one skeleton of engine/run.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fedac.algorithms import algorithm_class
from fedac.config import Config
from fedac.engine.report import final_table
from fedac.engine.simulator import Simulator
from fedac.engine.zeroshot import ZeroShotDriver, zeroshot_table
from fedac.settings.compatibility import check as check_combination


def runner_for(cfg: Config) -> tuple[type, Callable[[dict[str, Any]], str]]:
    """(the driver class, the function that renders its closing table) for `cfg.algorithm`. The
    simulator's combination of parts is checked here, before any data (the zero-shot driver checks
    its own)."""
    if algorithm_class(cfg.algorithm).streaming:
        return ZeroShotDriver, zeroshot_table
    check_combination(cfg)
    return Simulator, final_table
