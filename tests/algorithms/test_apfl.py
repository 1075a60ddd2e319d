"""APFL (algorithms/apfl.py) against a plain loop of Deng et al. 2020, Algorithm 1 with the adaptive
alpha, written here: two rounds of three clients, on both paths (one client at a time and the
stacked cohort); a learned alpha changes the result and a fixed one stays put; with dropout,
momentum and clipping the stacked path gives the sequential one's numbers, and `auto` takes it."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from algorithm_harness import SIZES, batches, build, call, clients, federate, max_diff, sgd_step
from fedac.algorithms.apfl import APFL
from fedac.engine.execution import ExecutionPlan

ALPHA, ALPHA_LR = 0.4, 0.5


def reference(algo, data, learn: bool, rounds: int = 2):
    """Per batch, from the step's (w_i, v_i, alpha_i): w_i -= lr grad f(w_i); v_bar = alpha v_i +
    (1 - alpha) w_i; v_i -= lr grad_v f(v_bar); alpha -= alpha_lr grad_alpha f(v_bar), in [0, 1].
    The server: the n_k-weighted mean of the w_i. A client with a step limit (the virtual clock's
    partial work) takes its first `step_limit` steps."""
    model = algo.scratch_model(algo.cfg.model.name).train()
    names = [n for n, _ in model.named_parameters()]
    w = {n: v.clone() for n, v in algo.init_server()["params"].items()}
    local = {cl.name: {n: v.clone() for n, v in w.items()} for cl in data}
    alpha = {cl.name: torch.tensor(ALPHA) for cl in data}
    personal = {}
    for r in range(1, rounds + 1):
        trained = []
        for cl in data:
            wk, v, a_k = {n: t.clone() for n, t in w.items()}, local[cl.name], alpha[cl.name]
            for idx in list(batches(algo, cl, r))[: cl.step_limit]:  # (partial work: the first)
                x, y = cl.x[idx], cl.y[idx]
                lw = {n: wk[n].detach().requires_grad_() for n in names}
                gw = torch.autograd.grad(
                    F.cross_entropy(call(model, {**wk, **lw}, x), y), list(lw.values())
                )
                lv = {n: v[n].detach().requires_grad_() for n in names}
                a = a_k.clone().requires_grad_(learn)
                mixed = {n: a * lv[n] + (1 - a) * wk[n] for n in names}
                loss_v = F.cross_entropy(call(model, {**v, **mixed}, x), y)
                leaves = list(lv.values()) + ([a] if learn else [])
                gv = torch.autograd.grad(loss_v, leaves)
                wk = sgd_step(wk, dict(zip(names, gw)))
                v = sgd_step(v, dict(zip(names, gv)))
                if learn:
                    a_k = (a_k - ALPHA_LR * gv[-1]).clamp(0, 1)
            local[cl.name], alpha[cl.name] = v, a_k
            personal[cl.name] = {
                n: a_k * v[n] + (1 - a_k) * wk[n] if n in names else v[n] for n in v
            }
            trained.append(wk)
        share = torch.tensor(SIZES, dtype=torch.float64) / sum(SIZES)
        w = {
            n: sum(float(s) * t[n].double() for s, t in zip(share, trained)).float()
            if t0.is_floating_point()
            else trained[0][n]
            for n, t0 in w.items()
        }
    return w, local, alpha, personal


@pytest.mark.parametrize("execution", ["sequential", "cohort"])
@pytest.mark.parametrize("learn", [True, False])
@pytest.mark.parametrize("model", ["cnn1_softmax", "crnn_tiny"])
def test_apfl_matches_a_plain_loop_of_algorithm_1(model, learn, execution):
    algo = build(
        APFL,
        model,
        execution,
        f"apfl.alpha={ALPHA}",
        f"apfl.alpha_lr={ALPHA_LR}",
        f"apfl.learn_alpha={str(learn).lower()}",
    )
    data = clients()
    server, states, _ = federate(algo, data)
    w, local, alpha, personal = reference(algo, data, learn)
    # tolerance: float32 rounding over 2 rounds of 6 steps of two models
    assert max_diff(w, server["params"]) <= 1e-5
    for cl in data:
        state = states[cl.name]
        assert max_diff(local[cl.name], state["local"]) <= 1e-5
        assert abs(float(alpha[cl.name]) - float(state["alpha"])) <= 1e-5
        assert max_diff(personal[cl.name], state["personal"]) <= 1e-5
        own = algo.personalized_model(cl.name, state)
        assert max_diff(dict(own.state_dict()), state["personal"]) == 0.0
        assert (abs(float(state["alpha"]) - ALPHA) > 1e-4) == learn


@pytest.mark.parametrize("execution", ["sequential", "cohort"])
def test_partial_work_takes_a_clients_first_steps_on_both_paths(execution):
    """The virtual clock's partial work (`ClientData.step_limit`) reaches APFL's w_i, v_i and
    alpha_i alike: 2 of the first client's 6 steps and 1 of the third's 2, each round."""
    algo = build(APFL, "crnn_tiny", execution, f"apfl.alpha={ALPHA}", f"apfl.alpha_lr={ALPHA_LR}")
    data = clients()
    limited = [replace(data[0], step_limit=2), data[1], replace(data[2], step_limit=1)]
    server, states, results = federate(algo, limited)
    w, local, alpha, personal = reference(algo, limited, learn=True)
    assert max_diff(w, server["params"]) <= 1e-5
    for cl, result in zip(limited, results):
        assert max_diff(local[cl.name], states[cl.name]["local"]) <= 1e-5
        assert abs(float(alpha[cl.name]) - float(states[cl.name]["alpha"])) <= 1e-5
        assert max_diff(personal[cl.name], states[cl.name]["personal"]) <= 1e-5
        assert result.metrics["steps"] == len(list(batches(algo, cl, 2))[: cl.step_limit])
    full = federate(algo, data)[0]
    assert max_diff(full["params"], server["params"]) > 1e-4


def test_learning_alpha_changes_the_result():
    data = clients()
    fixed = federate(build(APFL, "crnn_tiny", "sequential", "apfl.learn_alpha=false"), data)[1]
    learned = federate(build(APFL, "crnn_tiny", "sequential", "apfl.alpha_lr=0.5"), data)[1]
    for cl in data:
        assert max_diff(fixed[cl.name]["personal"], learned[cl.name]["personal"]) > 1e-4


@pytest.mark.parametrize("alpha_lr", [ALPHA_LR, 50.0])
@pytest.mark.parametrize("model", ["crnn_tiny", "cnn1_softmax"])
def test_stacked_path_gives_the_sequential_numbers_with_dropout_momentum_and_clipping(
    model, alpha_lr
):
    """The plain loop above runs without dropout, momentum or clipping: here both paths run with
    all three (each client's masks drawn in the sequential order: w_i's forward, then the
    mixture's), a late client (its v_i and alpha_i from its own start) and chunks of two; alpha's
    rate 50 drives some alpha_i to a bound of [0, 1]."""
    settings = (
        "model.dropout=0.3",
        "train.momentum=0.9",
        "train.max_grad_norm=0.1",
        f"apfl.alpha_lr={alpha_lr}",
        "runtime.cohort_chunk=2",
    )
    data = clients()
    sequential = federate(build(APFL, model, "sequential", *settings), data, rounds=3, late=1)
    stacked_algo = build(APFL, model, "cohort", *settings)
    assert ExecutionPlan(stacked_algo).path == "stacked"
    stacked = federate(stacked_algo, data, rounds=3, late=1)
    assert max_diff(sequential[0]["params"], stacked[0]["params"]) <= 1e-5
    for cl in data:
        a, b = sequential[1][cl.name], stacked[1][cl.name]
        for key in ("local", "personal"):
            assert max_diff(a[key], b[key]) <= 1e-5, (cl.name, key)
        assert abs(float(a["alpha"]) - float(b["alpha"])) <= 1e-5
    bounded = [float(s["alpha"]) in (0.0, 1.0) for s in stacked[1].values()]
    assert any(bounded) == (alpha_lr == 50.0)
    for ra, rb in zip(sequential[2], stacked[2]):
        assert ra.metrics.keys() == rb.metrics.keys()
        for key, value in ra.metrics.items():
            assert rb.metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


def test_auto_trains_apfl_stacked():
    assert ExecutionPlan(build(APFL, "crnn_tiny", "auto")).path == "stacked"
