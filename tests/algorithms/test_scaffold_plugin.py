"""The SCAFFOLD plug-in of tests/plugin_example (docs/extending.md, issue 56): a method stated once
as a local objective trains stacked, and its rounds equal an independent plain loop of SCAFFOLD
option II (Karimireddy et al. 2020, Alg. 1) written here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedac.algorithms.base import ClientData, Task
from fedac.config import load_config
from fedac.engine.execution import ExecutionPlan, run_clients
from fedac.seeding import torch_generator
from fedac.training.local import client_batches

sys.path.insert(0, str(Path(__file__).parents[1] / "plugin_example"))
from fedac_example.scaffold import Scaffold  # noqa: E402

FEATURES, FRAMES, CLASSES = 6, 9, 3
SIZES = [11, 7, 4]
LR = 0.05


def setup(model: str, execution: str, *overrides: str):
    g = torch.Generator().manual_seed(3)
    clients = [
        ClientData(
            f"c{i}",
            torch.randn(n, FEATURES, FRAMES, generator=g),
            torch.randint(0, CLASSES, (n,), generator=g),
            torch.zeros(0, FEATURES, FRAMES),
            torch.zeros(0, dtype=torch.long),
        )
        for i, n in enumerate(SIZES)
    ]
    cfg = load_config(
        overrides=[
            f"model.name={model}",
            "train.batch_size=4",
            "train.local_epochs=2",
            f"train.lr={LR}",
            "train.momentum=0",
            "train.device=cpu",
            f"train.execution={execution}",
            *overrides,
        ]
    )
    # one client of the task holds no data: the server's control step is |S| / N with N = 4
    return Scaffold(cfg, Task(FEATURES, CLASSES, [c.name for c in clients] + ["empty"])), clients


def federate(algo, clients, rounds=2):
    server = algo.init_server()
    states = {c.name: algo.init_client_state(c.name) for c in clients}
    for r in range(1, rounds + 1):
        results = run_clients(
            algo, algo.broadcast(server), [states[c.name] for c in clients], clients, r, 0
        )
        for c, res in zip(clients, results):
            states[c.name] = res.state
        server, _ = algo.server_update(
            server, [(res.upload, c.num_samples) for c, res in zip(clients, results)], r
        )
    return server, states


def reference(algo, clients, rounds=2):
    """SCAFFOLD option II by hand: y <- y - lr (g(y) - c_i + c) per batch; c_i+ = c_i - c + (x - y)
    / (K lr); x <- mean y_i; c <- c + |S| / N mean(c_i+ - c_i)."""
    model = algo.scratch_model(algo.cfg.model.name)
    x = {n: v.clone() for n, v in algo.init_server()["params"].items()}
    c = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    ci = {cl.name: {n: torch.zeros_like(v) for n, v in c.items()} for cl in clients}
    for r in range(1, rounds + 1):
        ys, deltas = [], []
        for cl in clients:
            y = {n: v.clone() for n, v in x.items()}
            steps = 0
            for idx in client_batches(
                cl.num_samples, algo.cfg.train, torch_generator(0, "batches", r, cl.name)
            ):
                leaves = {n: y[n].requires_grad_() for n in c}
                loss = F.cross_entropy(
                    functional_call(model, {**y, **leaves}, (cl.x[idx],)), cl.y[idx]
                )
                grads = torch.autograd.grad(loss, list(leaves.values()))
                y = {
                    **y,
                    **{
                        n: (leaves[n] - LR * (g - ci[cl.name][n] + c[n])).detach()
                        for n, g in zip(c, grads)
                    },
                }
                steps += 1
            new = {n: ci[cl.name][n] - c[n] + (x[n] - y[n]) / (steps * LR) for n in c}
            deltas.append({n: new[n] - ci[cl.name][n] for n in c})
            ci[cl.name] = new
            ys.append(y)
        x = {n: torch.stack([y[n] for y in ys]).mean(0) for n in x}
        c = {n: c[n] + len(clients) / 4 * torch.stack([d[n] for d in deltas]).mean(0) for n in c}
    return x, c, ci


def max_diff(a, b):
    return max(float((a[n] - b[n]).abs().max()) for n in a)


@pytest.mark.parametrize("execution", ["cohort", "sequential"])
@pytest.mark.parametrize("model", ["cnn1_softmax", "crnn_tiny"])
def test_scaffold_plugin_matches_a_plain_loop_of_option_ii(model, execution):
    algo, clients = setup(model, execution, "model.dropout=0")
    assert ExecutionPlan(algo).path == (
        "stacked" if execution == "cohort" else "sequential: train.execution=sequential"
    )
    server, states = federate(algo, clients)
    x, c, ci = reference(algo, clients)
    assert max_diff(x, server["params"]) <= 1e-5
    assert max_diff(c, server["control"]) <= 1e-4  # (x - y) / (K lr) divides rounding by K lr
    for cl in clients:
        assert max_diff(ci[cl.name], states[cl.name]) <= 1e-4


def test_scaffold_with_dropout_trains_stacked_as_it_trains_alone():
    a = federate(*setup("crnn_tiny", "cohort", "model.dropout=0.3"))
    b = federate(*setup("crnn_tiny", "sequential", "model.dropout=0.3"))
    assert (
        max_diff(a[0]["params"], b[0]["params"]) <= 1e-5
        and max_diff(a[0]["control"], b[0]["control"]) <= 1e-4
    )


def test_overriding_client_update_sends_the_plugin_sequential_and_says_why():
    class Patched(Scaffold):
        def client_update(self, *args):
            return super().client_update(*args)

    algo, _ = setup("cnn1_softmax", "auto")
    assert (
        ExecutionPlan(Patched(algo.cfg, algo.task)).path
        == "sequential: Patched overrides client_update"
    )
