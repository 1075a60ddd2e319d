"""A small federation for the algorithm tests (tests/ is on sys.path, see conftest.py): three
clients of random windows plus one without data (so a server step scaled by |S| / N sees N = 4),
an algorithm built on them, its rounds through fedac's execution (the stacked or the sequential
path), and what a plain loop written in a test needs: each client's batches in fedac's order and a
functional forward."""

from __future__ import annotations

import torch
from torch.func import functional_call

from fedac.algorithms.base import ClientData, Task
from fedac.config import load_config
from fedac.engine.execution import run_clients
from fedac.seeding import torch_generator
from fedac.training.local import client_batches

FEATURES, FRAMES, CLASSES = 6, 9, 3
SIZES = [11, 7, 4]
LR = 0.05


def clients(seed: int = 3) -> list[ClientData]:
    g = torch.Generator().manual_seed(seed)
    return [
        ClientData(
            f"c{i}",
            torch.randn(n, FEATURES, FRAMES, generator=g),
            torch.randint(0, CLASSES, (n,), generator=g),
            torch.randn(2, FEATURES, FRAMES, generator=g),
            torch.randint(0, CLASSES, (2,), generator=g),
        )
        for i, n in enumerate(SIZES)
    ]


def build(cls, model: str, execution: str, *overrides: str):
    """`cls` on the test clients: plain SGD at LR, batches of 4, two local epochs, no dropout unless
    `overrides` say otherwise."""
    cfg = load_config(
        overrides=[
            f"algorithm={cls.name}",
            f"model.name={model}",
            "model.dropout=0",
            "train.batch_size=4",
            "train.local_epochs=2",
            f"train.lr={LR}",
            "train.momentum=0",
            "train.device=cpu",
            f"train.execution={execution}",
            *overrides,
        ]
    )
    return cls(cfg, Task(FEATURES, CLASSES, [c.name for c in clients()] + ["empty"]))


def federate(algo, data: list[ClientData], rounds: int = 2, late: int = 0):
    """`rounds` rounds of every client in `data` (the last `late` of them from round 2 on):
    (server state, {client: state}, last results)."""
    server = algo.init_server()
    states = {c.name: algo.init_client_state(c.name) for c in data}
    results = []
    for r in range(1, rounds + 1):
        cohort = data[: len(data) - late] if r == 1 else data
        results = run_clients(
            algo, algo.broadcast(server), [states[c.name] for c in cohort], cohort, r, algo.cfg.seed
        )
        for c, res in zip(cohort, results):
            states[c.name] = res.state
        server, _ = algo.server_update(
            server, [(res.upload, c.num_samples) for c, res in zip(cohort, results)], r
        )
    return server, states, results


def batches(algo, client: ClientData, round_idx: int, seed: int | None = None):
    """The client's batch indices of a round, in fedac's order (its seeded generator)."""
    seed = algo.cfg.seed if seed is None else seed
    generator = torch_generator(seed, "batches", round_idx, client.name)
    return client_batches(client.num_samples, algo.cfg.train, generator)


class _Method(torch.nn.Module):
    """functional_call calls `forward`: this one calls the wrapped model's `method`."""

    def __init__(self, model, method: str):
        super().__init__()
        self.m, self.method = model, method

    def forward(self, inputs):
        return getattr(self.m, self.method)(inputs)


def call(model, entries: dict[str, torch.Tensor], x: torch.Tensor, method: str = "forward"):
    """`model`'s `method` on `x` with `entries` as its parameters and buffers."""
    bound = {"m." + n: v for n, v in entries.items()}
    return functional_call(_Method(model, method), bound, (x,), strict=False)


def sgd_step(params: dict, grads: dict, lr: float = LR) -> dict:
    """params - lr * grads for the entries `grads` holds (detached); the others as they are."""
    return {n: (v - lr * grads[n]).detach() if n in grads else v for n, v in params.items()}


def max_diff(a: dict, b: dict) -> float:
    return max(float((a[n] - b[n]).abs().max()) for n in a)
