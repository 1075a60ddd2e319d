"""The catalog of fedac's parts and their settings, torch-free (core layer): one registry per kind,
each in the file named for it (algorithms.py, models.py, datasets.py, aggregation.py, attacks.py),
and one settings dataclass per algorithm (`settings/<name>.py`, named like its class file in
algorithms/). `Config` builds its sections from these tables and checks every setting before torch
loads, so nothing here imports torch or any layer above core; no training code belongs here.
"""

from fedac.settings.algorithms import ALGORITHMS

__all__ = ["ALGORITHMS"]
