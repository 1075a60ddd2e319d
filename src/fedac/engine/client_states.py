"""Where each client's persistent state (a personal model, a control variate, ...) lives between
rounds: on the run's device or on the host (`runtime.client_memory`), and over several processes
on its owner alone (engine/distributed.py `owner`); and which states a round's server step accepts
(`commit`). The states themselves stay the algorithm's: this moves and stores them only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fedac.algorithms.base import Algorithm
from fedac.engine.distributed import World, owner
from fedac.engine.server_step import Arrival, StepResult
from fedac.engine.state import RunState
from fedac.training.device import nbytes, to_device
from fedac.training.types import ClientData


class ClientStates:
    """The run's client states: `home` the device they live on between rounds, `device` the run's;
    `owner` (over several processes) the rank that alone holds a client's state."""

    def __init__(
        self,
        algorithm: Algorithm,
        clients: list[ClientData],
        world: World,
        device: Any,
        home: Any,
    ):
        self.algorithm, self.world, self.device, self.home = algorithm, world, device, home
        self.owner: Callable[[str], int] | None = None
        if world.distributed and (
            type(algorithm).personalized
            or type(algorithm).init_client_state is not Algorithm.init_client_state
        ):  # a client's persistent state lives on its owner alone (memory / N per rank)
            owners = {c.name: owner(i, world.size) for i, c in enumerate(clients)}
            self.owner = owners.__getitem__

    def holds(self, name: str) -> bool:
        """Whether this process holds (and trains) client `name`'s persistent state."""
        return self.owner is None or self.owner(name) == self.world.rank

    def homed(self, obj: Any) -> Any:
        return to_device(obj, self.home, pin=self.home != self.device)

    def get(self, state: RunState, name: str) -> Any:
        """The client's persistent state where it lives between rounds (made when it has none)."""
        if name not in state.clients:
            state.clients[name] = self.homed(self.algorithm.init_client_state(name))
        return state.clients[name]

    def for_training(self, state: RunState, names: list[str]) -> list[Any]:
        """The states of clients `names` on the run's device (None for those another process
        holds)."""
        return [
            to_device(self.get(state, name), self.device) if self.holds(name) else None
            for name in names
        ]

    def commit(
        self, state: RunState, step: StepResult, arrivals: list[Arrival], round_idx: int
    ) -> None:
        """The round's new global state, and the new persistent states of the clients whose
        uploads the server accepted."""
        state.server = step.server
        accepted = set(step.accepted)
        for arrival in arrivals:
            name, new = arrival.client, arrival.state
            if name not in accepted:
                continue
            if new is not None and self.holds(name):
                state.clients[name] = self.homed(new)
            state.visits[name] = state.visits.get(name, 0) + 1
        if self.world.traffic:  # (benchmarks and tests: the states this process holds)
            self.world.log_held(round_idx, len(state.clients), nbytes(state.clients))
