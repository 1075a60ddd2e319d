"""The built-in SCAFFOLD (algorithms/scaffold.py) against a plain loop of Karimireddy et al. 2020,
Algorithm 1 with option II, written here: two rounds of three clients (N = 4 with the empty one),
on the stacked and the sequential path; its server step eta_g takes effect; DP is refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from algorithm_harness import LR, batches, build, call, clients, federate, max_diff, sgd_step
from fedac.algorithms.scaffold import Scaffold
from fedac.engine.execution import ExecutionPlan
from fedac.errors import ConfigError


def reference(algo, data, eta_g: float, rounds: int = 2):
    """y <- y - lr (g(y) - c_i + c) per batch; c_i+ = c_i - c + (x - y) / (K lr); x <- x + eta_g
    mean(y_i - x); c <- c + |S| / N mean(c_i+ - c_i)."""
    model = algo.scratch_model(algo.cfg.model.name).train()
    names = [n for n, _ in model.named_parameters()]
    x = {n: v.clone() for n, v in algo.init_server()["params"].items()}
    c = {n: torch.zeros_like(x[n]) for n in names}
    ci = {cl.name: {n: torch.zeros_like(x[n]) for n in names} for cl in data}
    for r in range(1, rounds + 1):
        ys, deltas = [], []
        for cl in data:
            y, steps = {n: v.clone() for n, v in x.items()}, 0
            for idx in batches(algo, cl, r):
                leaves = {n: y[n].detach().requires_grad_() for n in names}
                loss = F.cross_entropy(call(model, {**y, **leaves}, cl.x[idx]), cl.y[idx])
                grads = dict(zip(names, torch.autograd.grad(loss, list(leaves.values()))))
                y = sgd_step(y, {n: grads[n] - ci[cl.name][n] + c[n] for n in names})
                steps += 1
            fresh = {n: ci[cl.name][n] - c[n] + (x[n] - y[n]) / (steps * LR) for n in names}
            deltas.append({n: fresh[n] - ci[cl.name][n] for n in names})
            ci[cl.name] = fresh
            ys.append(y)
        x = {
            n: x[n] + eta_g * (torch.stack([y[n] for y in ys]).mean(0) - x[n])
            if v.is_floating_point()
            else ys[0][n]
            for n, v in x.items()
        }
        share = len(data) / 4
        c = {n: c[n] + share * torch.stack([d[n] for d in deltas]).mean(0) for n in names}
    return x, c, ci


@pytest.mark.parametrize("execution", ["cohort", "sequential"])
@pytest.mark.parametrize("model", ["cnn1_softmax", "crnn_tiny"])
def test_scaffold_matches_a_plain_loop_of_option_ii(model, execution):
    algo = build(Scaffold, model, execution, "scaffold.server_lr=0.7")
    assert ExecutionPlan(algo).path == (
        "stacked" if execution == "cohort" else "sequential: train.execution=sequential"
    )
    data = clients()
    server, states, _ = federate(algo, data)
    x, c, ci = reference(algo, data, eta_g=0.7)
    # tolerances: float32 rounding of 2 rounds of 6 steps; the control variates divide the model's
    # rounding by K lr
    assert max_diff(x, server["params"]) <= 1e-5
    assert max_diff(c, server["control"]) <= 1e-4
    for cl in data:
        assert max_diff(ci[cl.name], states[cl.name]) <= 1e-4


def test_the_server_step_takes_effect():
    data = clients()
    full = federate(build(Scaffold, "cnn1_softmax", "sequential"), data)[0]
    half = federate(build(Scaffold, "cnn1_softmax", "sequential", "scaffold.server_lr=0.5"), data)[
        0
    ]
    assert max_diff(full["params"], half["params"]) > 1e-3


def test_scaffold_refuses_dp():
    with pytest.raises(ConfigError, match="control variate"):
        build(Scaffold, "cnn1_softmax", "sequential", "dp.mode=client")
    assert not Scaffold.dp_compatible


def test_scaffold_refuses_model_poisoning_at_start():
    with pytest.raises(ConfigError, match="control variate"):
        build(Scaffold, "cnn1_softmax", "sequential", "attack.kind=sign_flip")
    build(Scaffold, "cnn1_softmax", "sequential", "attack.kind=label_flip")  # a data attack runs
