"""The benchmark workloads (issue 6), shared by bench_cohort.py and the Flower apps in flower_apps.py.

Both sides build the same data from the same seeds: random 40 x 101 features (the timing does not
depend on their values), so fedac, the plain-torch floor and Flower's simulation train identical clients.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from fedac.algorithms.base import ClientData, Task
from fedac.config import Config, load_config
from fedac.engine.data import EvalSplit, FederatedData

FEATURES, FRAMES, CLASSES = 40, 101, 35
SAMPLES = 40
"""Training windows per client (W and FedMLAC at 500 clients)."""
EVAL_CLIPS = 200
"""Clips of the validation and test splits in end-to-end runs."""

#: Workload W: 1 local epoch, batch 16, plain SGD lr 0.01, dropout 0.1, one torch thread; no periodic
#: evaluation or checkpoints unless a run asks for them.
BASE_SETTINGS = ["train.lr=0.01", "train.momentum=0.0", "train.local_epochs=1", "train.batch_size=16", "train.threads=1",
                 "train.cohort_workers=1", "model.dropout=0.1", "train.checkpoint_every=1000000",
                 "train.eval_every=1000000"]
W_SETTINGS = ["algorithm=fedavg", "model.name=crnn_lite", "train.fraction=0.1"]
W_CLIENTS, W_PER_ROUND = 100, 10
#: FedMLAC: CRNN-Base personalized models, CRNN-Lite Plug-in, 20 % of the clients per round, LPA.
FEDMLAC_SETTINGS = ["algorithm=fedmlac", "model.client_model=crnn_base", "fedmlac.plugin_model=crnn_lite",
                    "train.fraction=0.2"]


def make_clients(count: int, sizes: list[int], holdout: float = 0.0, seed: int = 0) -> list[ClientData]:
    g = torch.Generator().manual_seed(seed)
    clients = []
    for i, n in zip(range(count), sizes):
        n_hold = int(holdout * n)
        x = torch.randn(n, FEATURES, FRAMES, generator=g)
        y = torch.randint(0, CLASSES, (n,), generator=g)
        clients.append(ClientData(f"client{i:04d}", x[n_hold:].contiguous(), y[n_hold:].contiguous(),
                                  x[:n_hold].contiguous(), y[:n_hold].contiguous()))
    return clients


def federated(clients: list[ClientData], eval_clips: int = 0, seed: int = 1) -> FederatedData:
    g = torch.Generator().manual_seed(seed)

    def split() -> EvalSplit:
        return EvalSplit(torch.randn(eval_clips, FEATURES, FRAMES, generator=g), torch.arange(eval_clips),
                         torch.randint(0, CLASSES, (eval_clips,), generator=g))

    return FederatedData(Task(FEATURES, CLASSES, [c.name for c in clients]), None, clients,  # type: ignore[arg-type]
                         split() if eval_clips else None, split() if eval_clips else None)  # type: ignore[arg-type]


@lru_cache(maxsize=4)
def uniform_federation(count: int, eval_clips: int = EVAL_CLIPS) -> FederatedData:
    """`count` clients of SAMPLES windows each, with validation / test splits (cached per process)."""
    return federated(make_clients(count, [SAMPLES] * count), eval_clips)


def config(*overrides: str) -> Config:
    return load_config(overrides=[*BASE_SETTINGS, *overrides])
