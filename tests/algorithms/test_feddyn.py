"""FedDyn (algorithms/feddyn.py) against a plain loop of Acar et al. 2021, Algorithm 1, written
here: two rounds of three clients (m = 4 with the empty one), on the stacked and the sequential
path; alpha = 0 is FedAvg with the same steps, alpha > 0 is not; DP is refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from algorithm_harness import batches, build, call, clients, federate, max_diff, sgd_step
from fedac.algorithms.fedavg import FedAvg
from fedac.algorithms.feddyn import FedDyn
from fedac.errors import ConfigError
from fedac.rules.privacy import Privacy

ALPHA = 0.3


def reference(algo, data, alpha: float, rounds: int = 2, m: int = 4):
    """theta_k from theta by SGD on L_k(theta) - <g_k, theta> + alpha/2 ||theta - theta^{t-1}||^2;
    g_k <- g_k - alpha (theta_k - theta^{t-1}); h <- h - alpha / m sum_k (theta_k - theta^{t-1});
    theta <- mean_k theta_k - h / alpha (the unweighted mean)."""
    model = algo.scratch_model(algo.cfg.model.name).train()
    names = [n for n, _ in model.named_parameters()]
    theta = {n: v.clone() for n, v in algo.init_server()["params"].items()}
    g = {cl.name: {n: torch.zeros_like(theta[n]) for n in names} for cl in data}
    h = {n: torch.zeros_like(theta[n]) for n in names}
    for r in range(1, rounds + 1):
        trained = []
        for cl in data:
            w = {n: v.clone() for n, v in theta.items()}
            for idx in batches(algo, cl, r):
                leaves = {n: w[n].detach().requires_grad_() for n in names}
                loss = F.cross_entropy(call(model, {**w, **leaves}, cl.x[idx]), cl.y[idx])
                linear = sum((g[cl.name][n] * leaves[n]).sum() for n in names)
                prox = sum((leaves[n] - theta[n]).pow(2).sum() for n in names)
                objective = loss - linear + alpha / 2 * prox
                w = sgd_step(
                    w, dict(zip(names, torch.autograd.grad(objective, list(leaves.values()))))
                )
            g[cl.name] = {n: g[cl.name][n] - alpha * (w[n] - theta[n]) for n in names}
            trained.append(w)
        h = {n: h[n] - alpha / m * sum(w[n] - theta[n] for w in trained) for n in names}
        mean = {
            n: torch.stack([w[n] for w in trained]).mean(0)
            if v.is_floating_point()
            else trained[0][n]
            for n, v in theta.items()
        }
        theta = {n: mean[n] - h[n] / alpha if n in h else mean[n] for n in mean}
    return theta, g


@pytest.mark.parametrize("execution", ["cohort", "sequential"])
@pytest.mark.parametrize("model", ["cnn1_softmax", "crnn_tiny"])
def test_feddyn_matches_a_plain_loop_of_algorithm_1(model, execution):
    algo = build(FedDyn, model, execution, f"feddyn.alpha={ALPHA}", "aggregation.weighting=uniform")
    data = clients()
    server, states, _ = federate(algo, data)
    theta, g = reference(algo, data, ALPHA)
    # tolerances: float32 rounding over 2 rounds of 6 steps, h / alpha scaling it by 1 / alpha
    assert max_diff(theta, server["params"]) <= 1e-4
    for cl in data:
        assert max_diff(g[cl.name], states[cl.name]) <= 1e-5


@pytest.mark.parametrize("execution", ["cohort", "sequential"])
def test_alpha_zero_is_fedavg_with_the_same_steps(execution):
    data = clients()
    fedavg = federate(build(FedAvg, "crnn_tiny", execution, "aggregation.weighting=uniform"), data)
    plain = federate(build(FedDyn, "crnn_tiny", execution, "feddyn.alpha=0"), data)
    dynamic = federate(build(FedDyn, "crnn_tiny", execution, f"feddyn.alpha={ALPHA}"), data)
    # (the stacked FedAvg trains the hand-written CRNN, FedDyn the vmapped module: float rounding)
    assert max_diff(fedavg[0]["params"], plain[0]["params"]) <= 1e-5
    assert max_diff(fedavg[0]["params"], dynamic[0]["params"]) > 1e-3


def test_feddyn_refuses_dp():
    algo = build(FedDyn, "cnn1_softmax", "sequential", "dp.mode=central")
    with pytest.raises(ConfigError, match="feddyn"):
        Privacy(algo.cfg, 3, 3, FedDyn.dp_compatible)


@pytest.mark.parametrize("m, expected", [("all", 4), ("training", 3)])
def test_feddyn_m_counts_every_client_or_only_those_that_train(m, expected):
    algo = build(FedDyn, "cnn1_softmax", "sequential", f"feddyn.alpha={ALPHA}", f"feddyn.m={m}")
    data = clients()
    # the task's class counts: the three clients' windows, none for the empty one
    algo.task.class_counts = [[len(c.y)] for c in data] + [[0]]
    assert algo.clients_m() == expected
    server, _, _ = federate(algo, data)
    theta, _ = reference(algo, data, ALPHA, m=expected)
    assert max_diff(theta, server["params"]) <= 1e-4
    other, _ = reference(algo, data, ALPHA, m=7 - expected)
    assert max_diff(other, server["params"]) > 1e-4
