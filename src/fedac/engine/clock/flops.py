"""What a client's device computes: the model it trains and that model's training FLOPs per
sample under the run's method, counted once per architecture on one real local update
(model.py `count_flops`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fedac.algorithms.base import Algorithm
from fedac.config import Config
from fedac.engine.clock.model import count_flops
from fedac.training.schedule import step_sizes
from fedac.training.stacking import client_progress
from fedac.training.step import train_client
from fedac.training.types import ClientData


class FlopCount:
    """Training FLOPs per sample by architecture (`known`: those counted so far; counted again on
    resume, a count does not vary). `client_data`: a client's data on the run's device; `homed`:
    a client state where client states live."""

    def __init__(
        self,
        cfg: Config,
        algorithm: Algorithm,
        sizes: dict[str, int],
        client_data: Callable[[str], ClientData],
        homed: Callable[[Any], Any],
    ):
        self.cfg, self.algorithm, self.sizes = cfg, algorithm, sizes
        self.client_data, self.homed = client_data, homed
        self.known: dict[str, float] = {}

    def trained_model(self, client: str) -> str:
        """The model a client trains (its own for personalized methods, else the shared one): what
        its FLOPs are counted for."""
        if type(self.algorithm).personalized:
            return self.algorithm.client_architecture(client)
        return self.cfg.model.name

    def per_sample(self, arch: str) -> float:
        """Training FLOPs per sample of one local step of `arch` under this run's method, counted
        once on one real local update of the smallest client of that architecture."""
        if arch not in self.known:
            name = min(
                (c for c in self.sizes if self.trained_model(c) == arch),
                key=lambda c: (self.sizes[c], c),
            )
            data = self.client_data(name)
            algorithm = self.algorithm
            # (any model's values do: a count depends on the shapes; the global RNG is restored)
            with client_progress(lambda done: None):  # (not one of the round's clients)
                flops = count_flops(
                    lambda: train_client(
                        algorithm,
                        algorithm.broadcast(algorithm.init_server()),
                        self.homed(algorithm.init_client_state(name)),
                        data,
                        0,
                        self.cfg.seed,
                    )
                )
            samples = sum(step_sizes(data.num_samples, self.cfg.train))
            self.known[arch] = flops / max(1, samples)
        return self.known[arch]
