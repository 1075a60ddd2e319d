"""Ditto (algorithms/ditto.py) against a plain loop of Li et al. 2021, Algorithm 1, written here:
two rounds of three clients, on the stacked and the sequential path; lambda = 0 trains each personal
model on its own data alone, lambda > 0 does not; the personal models are what the clients are
evaluated with."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from algorithm_harness import SIZES, batches, build, call, clients, federate, max_diff, sgd_step
from fedac.algorithms.ditto import Ditto
from fedac.config import load_config
from fedac.errors import ConfigError
from fedac.seeding import derive_seed
from fedac.settings.compatibility import check

LAM = 0.5


def sgd_on(model, names, start, cl, steps, anchor=None, lam=0.0):
    """Plain SGD on the client's CE from `start` over the batches `steps`, each gradient plus
    lam (v - anchor)."""
    v = {n: t.clone() for n, t in start.items()}
    for idx in steps:
        leaves = {n: v[n].detach().requires_grad_() for n in names}
        loss = F.cross_entropy(call(model, {**v, **leaves}, cl.x[idx]), cl.y[idx])
        grads = dict(zip(names, torch.autograd.grad(loss, list(leaves.values()))))
        if anchor is not None:
            grads = {n: g + lam * (v[n] - anchor[n]) for n, g in grads.items()}
        v = sgd_step(v, grads)
    return v


def reference(algo, data, lam: float, rounds: int = 2):
    """w_k: FedAvg's local SGD from w^t; v_k <- v_k - lr (grad F_k(v_k) + lam (v_k - w^t)) over the
    personal batches; w^{t+1}: the n_k-weighted mean of the w_k."""
    model = algo.scratch_model(algo.cfg.model.name).train()
    names = [n for n, _ in model.named_parameters()]
    w = {n: v.clone() for n, v in algo.init_server()["params"].items()}
    personal = {cl.name: {n: v.clone() for n, v in w.items()} for cl in data}  # v_k^0 = w^0
    own_seed = derive_seed(algo.cfg.seed, "ditto-personal")
    for r in range(1, rounds + 1):
        trained = []
        for cl in data:
            trained.append(sgd_on(model, names, w, cl, batches(algo, cl, r)))
            own = batches(algo, cl, r, own_seed)
            personal[cl.name] = sgd_on(model, names, personal[cl.name], cl, own, w, lam)
        share = torch.tensor(SIZES, dtype=torch.float64) / sum(SIZES)
        w = {
            n: sum(float(a) * t[n].double() for a, t in zip(share, trained)).float()
            if v.is_floating_point()
            else trained[0][n]
            for n, v in w.items()
        }
    return w, personal


@pytest.mark.parametrize("execution", ["cohort", "sequential"])
@pytest.mark.parametrize("model", ["cnn1_softmax", "crnn_tiny"])
def test_ditto_matches_a_plain_loop_of_algorithm_1(model, execution):
    algo = build(Ditto, model, execution, f"ditto.lam={LAM}")
    data = clients()
    server, states, _ = federate(algo, data)
    w, personal = reference(algo, data, LAM)
    # tolerance: float32 rounding over 2 rounds of 6 steps per model
    assert max_diff(w, server["params"]) <= 1e-5
    for cl in data:
        assert max_diff(personal[cl.name], states[cl.name]) <= 1e-5
        own = algo.personalized_model(cl.name, states[cl.name])
        assert max_diff(dict(own.state_dict()), states[cl.name]) == 0.0


@pytest.mark.parametrize("execution", ["cohort", "sequential"])
def test_lambda_zero_is_local_training(execution):
    data = clients()
    _, alone, _ = federate(build(Ditto, "crnn_tiny", execution, "ditto.lam=0"), data)
    _, pulled, _ = federate(build(Ditto, "crnn_tiny", execution, f"ditto.lam={LAM}"), data)
    algo = build(Ditto, "crnn_tiny", "sequential")
    model = algo.scratch_model("crnn_tiny").train()
    names = [n for n, _ in model.named_parameters()]
    own_seed = derive_seed(algo.cfg.seed, "ditto-personal")
    for (
        cl
    ) in data:  # local training only: SGD from w^0 on the client's own batches, no global model
        v = algo.init_server()["params"]
        for r in (1, 2):
            v = sgd_on(model, names, v, cl, batches(algo, cl, r, own_seed))
        assert max_diff(v, alone[cl.name]) <= 1e-5
        assert max_diff(v, pulled[cl.name]) > 1e-4


def test_ditto_refuses_heterogeneous_models():
    with pytest.raises(ConfigError, match="model.heterogeneous"):  # (the compatibility matrix)
        check(load_config(overrides=["algorithm=ditto", "model.heterogeneous=true"]))
