"""FedBN, FedPer, FedRep, LG-FedAvg and local training (algorithms/partial.py and one file each):
two rounds of 3 clients on both paths (stacked and sequential) against an independent plain loop of
each paper's algorithm box written here, and the settings that change them.

Tolerance: the plain loop and fedac's paths sum the same float32 terms in different orders (batched
and vmapped convolutions, the stacked CRNN's hand-written backward), so parameters agree to 1e-5
after two rounds, not bit for bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedac.algorithms.base import ClientData, Task
from fedac.algorithms.fedbn import FedBN
from fedac.algorithms.fedper import FedPer
from fedac.algorithms.fedrep import FedRep
from fedac.algorithms.lgfedavg import LGFedAvg
from fedac.algorithms.local_only import Local
from fedac.config import load_config
from fedac.engine.execution import ExecutionPlan, run_clients
from fedac.errors import ConfigError
from fedac.seeding import torch_generator
from fedac.settings.compatibility import check as check_combination
from fedac.training.local import client_batches

FEATURES, FRAMES, CLASSES = 40, 16, 3
SIZES = [11, 7, 4]
LR, MOMENTUM = 0.05, 0.5
TOLERANCE = 1e-5


def clients_of(sizes=SIZES):
    g = torch.Generator().manual_seed(3)
    return [
        ClientData(
            f"c{i}",
            torch.randn(n, FEATURES, FRAMES, generator=g),
            torch.randint(0, CLASSES, (n,), generator=g),
            torch.zeros(0, FEATURES, FRAMES),
            torch.zeros(0, dtype=torch.long),
        )
        for i, n in enumerate(sizes)
    ]


def setup(cls, model: str, execution: str, *overrides: str, clients=None):
    clients = clients or clients_of()
    cfg = load_config(
        overrides=[
            f"model.name={model}",
            "model.dropout=0",
            "train.batch_size=4",
            "train.local_epochs=2",
            f"train.lr={LR}",
            f"train.momentum={MOMENTUM}",
            "train.device=cpu",
            f"train.execution={execution}",
            "fedrep.head_epochs=1",
            *overrides,
        ],
        algorithm=cls.name,
    )
    return cls(cfg, Task(FEATURES, CLASSES, [c.name for c in clients])), clients


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


# --- the plain loop ----------------------------------------------------------------------------
def head(model):
    return {n for n in model.state_dict() if n.startswith("head.")}


def batchnorm(model):
    bn = [
        n
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.BatchNorm2d | torch.nn.BatchNorm1d)
    ]
    return {
        f"{m}.{e}"
        for m in bn
        for e in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
    }


def reference(algo, clients, private, phases, rounds=2, aggregate=True):
    """The algorithm box by hand. Every client starts from the common initial model; each round
    client k loads the server's shared entries over its own private ones, runs `phases` (a list of
    (trainable parameter names, epochs)), each with a fresh SGD with momentum (buf <- m buf + g;
    w <- w - lr buf) over the phase's parameters only, its batches drawn back to back from the
    client's round generator; uploads the shared entries; the server takes their n_k-weighted mean
    (`aggregate`=False: no server at all)."""
    model = algo.scratch_model(algo.cfg.model.name)
    init = {n: v.clone() for n, v in model.state_dict().items()}
    init.update(algo.initial_model())
    names = [n for n, _ in model.named_parameters()]
    shared = [n for n in init if n not in private]
    x = {n: init[n].clone() for n in shared}
    own = {c.name: {n: v.clone() for n, v in init.items()} for c in clients}
    cfg = algo.cfg.train
    for r in range(1, rounds + 1):
        uploads = []
        for c in clients:
            w = {**own[c.name], **{n: x[n].clone() for n in shared}}
            gen = torch_generator(0, "batches", r, c.name)
            for trainable, epochs in phases:
                phase_cfg = type(cfg)(**{**cfg.__dict__, "local_epochs": epochs})
                buf = {n: torch.zeros_like(w[n]) for n in trainable}
                for idx in client_batches(c.num_samples, phase_cfg, gen):
                    leaves = {n: w[n].detach().requires_grad_() for n in trainable}
                    loss = F.cross_entropy(
                        functional_call(model, {**w, **leaves}, (c.x[idx],)), c.y[idx]
                    )
                    grads = torch.autograd.grad(loss, list(leaves.values()))
                    for n, g in zip(trainable, grads):
                        # torch.optim.SGD's arithmetic (an FMA-like add), so the rounding
                        # matches: BatchNorm over a few windows amplifies it step by step
                        buf[n] = torch.add(g, buf[n], alpha=cfg.momentum)
                        w[n] = torch.add(leaves[n].detach(), buf[n], alpha=-cfg.lr)
            own[c.name] = w
            uploads.append(({n: w[n] for n in shared}, c.num_samples))
        if aggregate and shared:
            total = sum(n for _, n in uploads)
            x = {
                n: sum(u[n].double() * (k / total) for u, k in uploads).to(x[n].dtype)
                if x[n].is_floating_point()
                else uploads[0][0][n]
                for n in shared
            }
    return x, own, names


def max_diff(a, b):
    return max((float((a[n].double() - b[n].double()).abs().max()) for n in a), default=0.0)


def check(algo, clients, x, own):
    server, states = federate(algo, clients)
    assert set(server["params"]) == set(x)
    assert max_diff(x, server["params"]) <= TOLERANCE
    for c in clients:
        assert max_diff(own[c.name], states[c.name]) <= TOLERANCE


EXECUTIONS = ["cohort", "sequential"]


@pytest.mark.parametrize("execution", EXECUTIONS)
@pytest.mark.parametrize("model", ["cnn1_softmax", "crnn_tiny"])
def test_fedper_matches_its_algorithm_box(model, execution):
    """Arivazhagan et al. 2019, Alg. 1: base and personalization layers trained together, the base
    averaged."""
    algo, clients = setup(FedPer, model, execution)
    assert ExecutionPlan(algo).path.startswith("stacked" if execution == "cohort" else "sequential")
    m = algo.scratch_model(model)
    names = [n for n, _ in m.named_parameters()]
    x, own, _ = reference(algo, clients, head(m), [(names, 2)])
    check(algo, clients, x, own)


@pytest.mark.parametrize("execution", EXECUTIONS)
@pytest.mark.parametrize("model", ["cnn1_softmax", "crnn_tiny"])
def test_lgfedavg_matches_its_algorithm_box(model, execution):
    """Liang et al. 2020, Alg. 1: local representation and global head trained together, the head
    averaged."""
    algo, clients = setup(LGFedAvg, model, execution)
    m = algo.scratch_model(model)
    names = [n for n, _ in m.named_parameters()]
    x, own, _ = reference(algo, clients, set(m.state_dict()) - head(m), [(names, 2)])
    assert set(x) == head(m)
    check(algo, clients, x, own)


@pytest.mark.parametrize("execution", EXECUTIONS)
@pytest.mark.parametrize("model", ["cnn1_softmax", "crnn_tiny"])
def test_fedrep_matches_its_algorithm_box(model, execution):
    """Collins et al. 2021, Alg. 1: tau_h epochs of the head (body fixed), then tau_phi of the body
    (head fixed), the body averaged."""
    algo, clients = setup(FedRep, model, execution, "fedrep.head_epochs=3")
    m = algo.scratch_model(model)
    body = [n for n, _ in m.named_parameters() if not n.startswith("head.")]
    heads = [n for n, _ in m.named_parameters() if n.startswith("head.")]
    x, own, _ = reference(algo, clients, head(m), [(heads, 3), (body, 2)])
    check(algo, clients, x, own)


@pytest.mark.parametrize("execution", EXECUTIONS)
def test_fedbn_matches_its_algorithm_box(execution):
    """Li et al. 2021, Alg. 1: every entry but the BatchNorm layers' averaged (dscnn has six)."""
    # (a small step: BatchNorm over a few windows of noise amplifies rounding, step by step)
    algo, clients = setup(FedBN, "dscnn", execution, "train.lr=0.01")
    m = algo.scratch_model("dscnn")
    names = [n for n, _ in m.named_parameters()]
    bn = batchnorm(m)
    assert len(bn) == 30 and algo.private == bn
    x, own, _ = reference(algo, clients, bn, [(names, 2)])
    assert not set(x) & bn
    check(algo, clients, x, own)
    # each client's BatchNorm statistics are its own
    _, states = federate(algo, clients)
    means = [states[c.name]["cnn.1.running_mean"] for c in clients]
    assert not torch.equal(means[0], means[1])


@pytest.mark.parametrize("execution", EXECUTIONS)
@pytest.mark.parametrize("model", ["cnn1_softmax", "crnn_tiny"])
def test_local_matches_training_alone(model, execution):
    """No aggregation: each client's model is its own 2 x 2 epochs of SGD from the common initial
    model, whoever else trains."""
    algo, clients = setup(Local, model, execution)
    m = algo.scratch_model(model)
    names = [n for n, _ in m.named_parameters()]
    x, own, _ = reference(algo, clients, set(m.state_dict()), [(names, 2)], aggregate=False)
    assert x == {}
    check(algo, clients, x, own)
    # a client trained in the cohort or alone ends with the same model
    alone, alone_clients = setup(Local, model, execution, clients=clients[:1])
    _, states = federate(algo, clients)
    _, states_alone = federate(alone, alone_clients)
    assert max_diff(states["c0"], states_alone["c0"]) == 0.0


def test_fedrep_head_epochs_change_the_result():
    a = federate(*setup(FedRep, "cnn1_softmax", "cohort", "fedrep.head_epochs=1"))
    b = federate(*setup(FedRep, "cnn1_softmax", "cohort", "fedrep.head_epochs=3"))
    assert max_diff(a[0]["params"], b[0]["params"]) > 10 * TOLERANCE
    assert max_diff(a[1]["c0"], b[1]["c0"]) > 10 * TOLERANCE


@pytest.mark.parametrize("cls", [FedRep, FedPer])
def test_stacked_equals_sequential_with_dropout(cls):
    """Dropout masks come from each client's generator on both paths, across FedRep's two
    phases too."""
    a = federate(*setup(cls, "crnn_tiny", "cohort", "model.dropout=0.3"))
    b = federate(*setup(cls, "crnn_tiny", "sequential", "model.dropout=0.3"))
    assert max_diff(a[0]["params"], b[0]["params"]) <= TOLERANCE
    for name in a[1]:
        assert max_diff(a[1][name], b[1][name]) <= TOLERANCE


def test_fedrep_with_adam_trains_sequential_and_says_why():
    algo, _ = setup(FedRep, "cnn1_softmax", "sequential", "train.optimizer=adam")
    assert "train.optimizer=sgd and train.weight_decay=0" in algo.no_stacked_form
    with pytest.raises(ConfigError, match="train.optimizer=sgd and train.weight_decay=0"):
        ExecutionPlan(setup(FedRep, "cnn1_softmax", "cohort", "train.optimizer=adam")[0])
    algo, _ = setup(FedPer, "cnn1_softmax", "cohort", "train.optimizer=adam")
    assert algo.no_stacked_form is None and ExecutionPlan(algo).path == "stacked"


def test_fedbn_without_batchnorm_is_fedavg_or_refused():
    algo, _ = setup(FedBN, "crnn_tiny", "cohort")
    assert algo.private == set() and set(algo.shared) == set(algo.initial_model())
    # the aggregate is the whole network: tested as FedAvg's shared model
    assert algo.global_model(algo.init_server()) is not None
    assert setup(FedBN, "dscnn", "cohort")[0].global_model(algo.init_server()) is None
    assert setup(Local, "crnn_tiny", "cohort")[0].global_model({"params": {}}) is None
    with pytest.raises(ConfigError, match="no BatchNorm"):
        setup(FedBN, "crnn_tiny", "cohort", "fedbn.require_batchnorm=true")


def test_refusals():
    with pytest.raises(ConfigError, match="local_steps=0"):
        setup(FedRep, "cnn1_softmax", "cohort", "train.local_steps=3")
    with pytest.raises(ConfigError, match="heterogeneous"):  # (the compatibility matrix)
        check_combination(load_config(overrides=["algorithm=fedper", "model.heterogeneous=true"]))
    with pytest.raises(ConfigError, match="aggregation.method"):
        setup(Local, "cnn1_softmax", "cohort", "aggregation.method=median")
