"""`train.local_steps` (step-based local training with a cycling loader, FedKWS-UI's protocol): the
batches by hand, its effect on the step count, and the stacked cohort path equal to the sequential one."""

from __future__ import annotations

import torch

from fedac.algorithms.local import cycling_batches, local_steps
from fedac.config import load_config
from test_cohort import assert_same_run, federate, make_algorithm

import pytest

pytestmark = pytest.mark.usefixtures("one_thread")


def test_cycling_batches_by_hand():
    gen = torch.Generator().manual_seed(0)
    batches = list(cycling_batches(5, 2, 4, gen))
    assert [len(b) for b in batches] == [2, 2, 1, 2]  # a pass keeps its partial batch, then a reshuffle
    assert sorted(torch.cat(batches[:3]).tolist()) == [0, 1, 2, 3, 4]
    assert list(cycling_batches(0, 2, 4, gen)) == []  # no data, no steps (never an endless loop)


def test_local_steps_fixes_every_clients_step_count():
    assert local_steps(37, load_config(overrides=["train.local_steps=7"]).train) == 7
    assert local_steps(37, load_config(overrides=["train.batch_size=16", "train.local_epochs=2"]).train) == 6
    algo, clients = make_algorithm("train.local_steps=3", "train.execution=sequential", "model.name=crnn_tiny")
    _, _, results = federate(algo, clients, rounds=1)
    assert [r.metrics["steps"] for r in results] == [3.0] * len(clients)  # clients of 37 and of 5 samples alike


def test_cohort_path_equals_sequential_with_local_steps():
    runs = []
    for mode in ("cohort", "sequential"):
        algo, clients = make_algorithm("train.local_steps=4", f"train.execution={mode}", "model.name=crnn_tiny")
        runs.append(federate(algo, clients, rounds=2))
    assert_same_run(*runs)
