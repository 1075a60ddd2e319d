"""The old import path of the plug-in API: `from fedac.algorithms.cohort import LocalObjective`
keeps working for plug-ins written against it (it lives in algorithms/objective.py)."""

from fedac.algorithms.objective import LocalObjective

__all__ = ["LocalObjective"]
