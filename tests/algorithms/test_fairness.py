"""q-FFL, AFL and TERM (algorithms/qffl.py, afl.py, term.py) against a plain loop of each paper's
server box written here: two rounds of three clients on the stacked and the sequential path
(parameters to 1e-5: float32 local steps, float64 server sums); q = 0 and t = 0 are FedAvg; AFL's
weights stay on the simplex and move toward the worst client; DP and robust rules are refused."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from algorithm_harness import LR, batches, build, call, clients, federate, max_diff, sgd_step
from fedac.algorithms.afl import AFL, project_simplex
from fedac.algorithms.fedavg import FedAvg
from fedac.algorithms.qffl import QFFL
from fedac.algorithms.term import TERM
from fedac.errors import ConfigError

MODEL = "crnn_tiny"


def local_round(algo, data, theta, r):
    """Each client's FedAvg local model from theta and F_k(theta) on its clips (eval mode)."""
    model = algo.scratch_model(MODEL).train()
    judge = algo.scratch_model(MODEL).eval()
    names = [n for n, _ in model.named_parameters()]
    out = []
    for cl in data:
        w = {n: v.clone() for n, v in theta.items()}
        for idx in batches(algo, cl, r):
            leaves = {n: w[n].detach().requires_grad_() for n in names}
            loss = F.cross_entropy(call(model, {**w, **leaves}, cl.x[idx]), cl.y[idx])
            w = sgd_step(w, dict(zip(names, torch.autograd.grad(loss, list(leaves.values())))))
        with torch.no_grad():
            start = float(F.cross_entropy(call(judge, theta, cl.x), cl.y))
        out.append((w, start, cl.num_samples))
    return out


def reference(algo, data, server_box, rounds=2):
    theta = {n: v.clone() for n, v in algo.init_server()["params"].items()}
    extra: dict = {}
    for r in range(1, rounds + 1):
        theta = server_box(theta, local_round(algo, data, theta, r), extra)
    return theta, extra


def qffl_box(q):
    def box(theta, rounds, extra):
        lip = 1 / LR
        num = {n: torch.zeros_like(v, dtype=torch.float64) for n, v in theta.items()}
        den = 0.0
        for w, f, n_k in rounds:
            dw = {n: lip * (theta[n].double() - w[n].double()) for n in theta}
            norm2 = sum(float((d**2).sum()) for d in dw.values())
            for n in theta:
                num[n] += n_k * f**q * dw[n]
            den += n_k * (q * f ** (q - 1) * norm2 + lip * f**q)
        return {n: (theta[n].double() - num[n] / den).float() for n in theta}

    return box


def term_box(t):
    def box(theta, rounds, extra):
        top = max(f for _, f, _ in rounds)
        weights = [n_k * math.exp(t * (f - top)) for _, f, n_k in rounds]
        return {
            n: (
                sum(wt * w[n].double() for wt, (w, _, _) in zip(weights, rounds)) / sum(weights)
            ).float()
            for n in theta
        }

    return box


def afl_box(gamma, clients_total=4):
    def box(theta, rounds, extra):
        lam = extra.setdefault("lambda", [1 / clients_total] * clients_total)
        weights = lam[: len(rounds)]
        new = {
            n: (
                sum(wt * w[n].double() for wt, (w, _, _) in zip(weights, rounds)) / sum(weights)
            ).float()
            for n in theta
        }
        ascended = [lam[k] + gamma * (rounds[k][1] if k < len(rounds) else 0.0) for k in range(4)]
        # the simplex projection by bisection on the threshold (independent of Duchi's sort)
        lo, hi = min(ascended) - 1, max(ascended)
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if sum(max(a - mid, 0) for a in ascended) > 1 else (lo, mid)
        extra["lambda"] = [max(a - (lo + hi) / 2, 0) for a in ascended]
        return new

    return box


CASES = {
    "qffl": (QFFL, "qffl.q=1", qffl_box(1.0)),
    "term": (TERM, "term.t=2", term_box(2.0)),
    "afl": (AFL, "afl.lambda_lr=0.5", afl_box(0.5)),
}


@pytest.mark.parametrize("execution", ["cohort", "sequential"])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_a_plain_loop_of_its_box(name, execution):
    cls, setting, box = CASES[name]
    algo = build(cls, MODEL, execution, setting)
    data = clients()
    server, _, _ = federate(algo, data)
    theta, extra = reference(algo, data, box)
    assert max_diff(theta, server["params"]) <= 1e-5
    if name == "afl":
        assert server["lambda"].tolist() == pytest.approx(extra["lambda"], abs=1e-6)


@pytest.mark.parametrize("execution", ["cohort", "sequential"])
def test_q_zero_and_t_zero_are_fedavg(execution):
    data = clients()
    fedavg = federate(build(FedAvg, MODEL, execution), data)[0]["params"]
    for cls, setting in ((QFFL, "qffl.q=0"), (TERM, "term.t=0")):
        assert (
            max_diff(fedavg, federate(build(cls, MODEL, execution, setting), data)[0]["params"])
            <= 1e-6
        )
    fair = federate(build(QFFL, MODEL, execution, "qffl.q=5"), data)[0]["params"]
    assert max_diff(fedavg, fair) > 1e-4


def test_afl_weights_stay_on_the_simplex_and_move_toward_the_worst_client():
    algo = build(AFL, MODEL, "sequential", "afl.lambda_lr=0.2")
    data = clients()
    server, _, results = federate(algo, data)
    lam = server["lambda"]
    assert float(lam.sum()) == pytest.approx(1.0, abs=1e-12) and bool((lam >= 0).all())
    losses = [float(r.upload["loss"]) for r in results]
    worst = max(range(3), key=losses.__getitem__)
    assert int(lam.argmax()) == worst and float(lam[3]) < 0.25  # (the empty client lost weight)
    v = torch.tensor([0.5, 2.0, -1.0, 0.2], dtype=torch.float64)
    p = project_simplex(v)
    assert float(p.sum()) == pytest.approx(1.0) and p.tolist() == pytest.approx(
        [0.0, 1.0, 0.0, 0.0]
    )


@pytest.mark.parametrize("cls", [QFFL, AFL, TERM])
def test_dp_and_robust_rules_are_refused(cls):
    with pytest.raises(ConfigError, match="set dp.mode=none"):
        build(cls, MODEL, "sequential", "dp.mode=central")
    with pytest.raises(ConfigError, match="set aggregation.method=mean"):
        build(cls, MODEL, "sequential", "aggregation.method=median")
