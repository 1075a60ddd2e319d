"""Stacked execution (engine/execution.py, training/stacking.py, models/stacked.py, the methods'
stacked steps): the stacked path gives the sequential path's numbers, with padding, chunking and
one stacked group per architecture."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

import fedac.algorithms.fedmlac as fedmlac_module
import fedac.training.stacking as stacking
from fedac.algorithms import build_algorithm
from fedac.algorithms.base import ClientData, Task
from fedac.algorithms.fedavg import FedAvg
from fedac.config import load_config
from fedac.engine.execution import ExecutionPlan, run_clients, stacking_obstacle
from fedac.engine.simulator import Simulator
from fedac.errors import ConfigError
from fedac.models import MODEL_NAMES, build_model
from fedac.models.stacked import stack_params, stacked_model, unstack_params
from fedac.training.device import resolve_device, to_device
from fedac.training.stacking import CohortChunk, StackedSGD
from fedac.training.step import train_client

FEATURES, FRAMES, CLASSES = 8, 21, 5
# unequal clients: two hold fewer samples than one batch (16), one exactly one batch
SIZES = [37, 16, 5, 23, 40, 9]
TOL = 1e-5


def make_clients(sizes=SIZES, seed=1) -> list[ClientData]:
    """Clients drawn on the CPU, then on the test device (FEDAC_TEST_DEVICE, where
    runtime.device=auto runs)."""
    g = torch.Generator().manual_seed(seed)
    clients = [
        ClientData(
            f"c{i}",
            torch.randn(n, FEATURES, FRAMES, generator=g),
            torch.randint(0, CLASSES, (n,), generator=g),
            torch.zeros(0, FEATURES, FRAMES),
            torch.zeros(0, dtype=torch.long),
        )
        for i, n in enumerate(sizes)
    ]
    return to_device(clients, resolve_device("auto"))


def make_algorithm(*overrides: str):
    clients = make_clients()
    cfg = load_config(
        overrides=[
            "train.lr=0.05",
            "train.local_epochs=2",
            "model.name=crnn_lite",
            "model.client_model=crnn_tiny",
            "fedmlac.plugin_model=crnn_lite",
            *overrides,
        ]
    )
    return build_algorithm(cfg, Task(FEATURES, CLASSES, [c.name for c in clients])), clients


def federate(algo, clients, rounds=3, seed=0):
    """A few rounds of client updates + server updates, every client sampled; returns server, client
    states, last results."""
    server = algo.init_server()
    states = {c.name: algo.init_client_state(c.name) for c in clients}
    results = []
    for round_idx in range(1, rounds + 1):
        payload = algo.broadcast(server)
        results = run_clients(
            algo, payload, [states[c.name] for c in clients], clients, round_idx, seed
        )
        for client, result in zip(clients, results):
            if result.state is not None:
                states[client.name] = result.state
        server, _ = algo.server_update(
            server, [(r.upload, c.num_samples) for c, r in zip(clients, results)], round_idx
        )
    return server, states, results


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def assert_same_run(a, b, tol=TOL):
    (server_a, states_a, results_a), (server_b, states_b, results_b) = a, b
    assert max_diff(server_a["params"], server_b["params"]) <= tol
    for name, state in states_a.items():
        if state is not None:
            assert max_diff(state, states_b[name]) <= tol, name
    for ra, rb in zip(results_a, results_b):
        assert ra.metrics.keys() == rb.metrics.keys()
        for key in ra.metrics:
            assert ra.metrics[key] == pytest.approx(rb.metrics[key], rel=1e-5, abs=1e-6), key


# --- the stacked model ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_stacked_forward_and_gradients_match_the_modules(name):
    torch.manual_seed(0)
    models = [build_model(name, FEATURES, CLASSES) for _ in range(3)]
    for m in models:
        m.eval()
    params = {
        k: v.detach().requires_grad_()
        for k, v in stack_params([dict(m.named_parameters()) for m in models]).items()
    }
    x = torch.randn(3, 4, FEATURES, FRAMES)
    out = stacked_model(name, 0.1)(params, x)
    expected = torch.stack([m(x[i]) for i, m in enumerate(models)])
    assert out.shape == (3, 4, CLASSES)
    assert torch.allclose(out, expected, atol=1e-6)
    grads = torch.autograd.grad(out.square().sum(), list(params.values()))
    for i, m in enumerate(models):
        ref = torch.autograd.grad(m(x[i]).square().sum(), list(m.parameters()))
        for g, r in zip(grads, ref):
            assert torch.allclose(g[i], r, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("frames", [101, 26, 1])
def test_fused_relu_max_pool_equals_relu_then_max_pool_exactly(frames):
    """Values and gradients bit for bit, ties included (ReLU zeros, equal pairs), and NaNs
    propagate."""
    from fedac.models.stacked import _ReluMaxPool2

    x = torch.randn(2, 3, 4, frames)
    # positive ties
    x[0, 0, 0, : frames - frames % 2] = torch.tensor([0.5, 0.5]).repeat(frames // 2)
    x[1, 0, 0] = 0.0  # ties at zero
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    expected = nn.functional.max_pool1d(torch.relu(a).view(-1, 4, frames), 2, ceil_mode=True).view(
        2, 3, 4, -1
    )
    # it pools channels-last (..., T, C)
    out = _ReluMaxPool2.apply(b.transpose(2, 3)).transpose(2, 3)
    assert torch.equal(out, expected)
    grad = torch.randn_like(out)
    expected.backward(grad)
    out.backward(grad)
    assert torch.equal(b.grad, a.grad)
    x[0, 1, 2, 0] = float("nan")
    assert torch.isnan(_ReluMaxPool2.apply(x.transpose(2, 3))[0, 1, 0, 2])


@pytest.mark.parametrize("time_last", [True, False])
def test_stacked_conv_equals_each_clients_conv1d(time_last):
    """The im2col convolution against F.conv1d per client: values and all gradients, input's
    included."""
    from fedac.models.stacked import _Conv1d

    x, w, bias = torch.randn(3, 4, 6, 11), torch.randn(3, 5, 6, 5), torch.randn(3, 5)
    a = [t.clone().requires_grad_() for t in (x, w, bias)]
    expected = torch.stack(
        [nn.functional.conv1d(a[0][k], a[1][k], a[2][k], padding=2) for k in range(3)]
    )
    b = [t.clone().requires_grad_() for t in (x, w, bias)]
    out = _Conv1d.apply(
        b[0] if time_last else b[0].transpose(2, 3), b[1], b[2], time_last
    ).transpose(2, 3)
    assert torch.allclose(out, expected, atol=1e-5)
    grad = torch.randn_like(out)
    for got, ref in zip(
        torch.autograd.grad((out * grad).sum(), b), torch.autograd.grad((expected * grad).sum(), a)
    ):
        assert torch.allclose(got, ref, atol=1e-4, rtol=1e-5)


def test_cohort_dropout_masks_are_the_ones_a_lone_client_draws():
    """Masks drawn per client from its own generator equal nn.Dropout's under the same seed."""
    model = build_model("crnn_lite", FEATURES, CLASSES, dropout=0.3)
    model.train()
    data = make_clients([7])[0]
    cfg = load_config(overrides=["train.batch_size=7"]).train
    chunk = CohortChunk([0], [data], cfg, round_idx=4, seed=9)
    x, _ = chunk.batch(chunk.steps[0])
    out = stacked_model("crnn_lite", 0.3)(
        stack_params([model.state_dict()]), x, chunk.dropout(chunk.steps[0])
    )
    from fedac.seeding import derive_seed

    torch.manual_seed(derive_seed(9, "dropout", 4, data.name))
    assert torch.allclose(out[0], model(x[0]), atol=1e-6)
    # the next draw differs, so masks were live
    assert not torch.allclose(out[0], model(x[0]), atol=1e-3)


def test_stack_unstack_roundtrip_and_independent_storage():
    states = [build_model("crnn_tiny", FEATURES, CLASSES).state_dict() for _ in range(3)]
    stacked = stack_params(states)
    back = unstack_params(stacked, 3)
    assert all(torch.equal(back[i][k], states[i][k]) for i in range(3) for k in states[i])
    back[0]["head.bias"].add_(1.0)
    assert not torch.equal(back[0]["head.bias"], stacked["head.bias"][0])
    assert stacked_model("not_a_model", 0.1) is None


# --- path equality --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithm=fedavg"],
        ["algorithm=fedprox", "fedprox.mu=0.5", "train.weight_decay=0.01"],
        ["algorithm=fedadam", "train.momentum=0.0"],
        ["algorithm=fedmlac"],
        [
            "algorithm=fedmlac",
            "model.heterogeneous=true",
            "model.zoo=[crnn_tiny,crnn_lite,crnn_base]",
            "fedmlac.teacher=post_update",
            "fedmlac.plugin_ce_weight=0.5",
            "fedmlac.temperature=2.0",
        ],
        ["algorithm=fedmlac", "fedmlac.ml=false"],
    ],
    ids=["fedavg", "fedprox", "fedadam", "fedmlac", "fedmlac-heterogeneous", "fedmlac-no-ml"],
)
@pytest.mark.parametrize("kernel", ["fused", "torch"])
@pytest.mark.slow
def test_cohort_and_sequential_paths_give_the_same_parameters(overrides, kernel, monkeypatch):
    """Both GRU recurrences of the stacked model (fedac/kernels' fused one and the pure-torch
    one)."""
    from fedac import kernels

    if kernel == "fused" and torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip("the fused GRU is built for AVX2 CPUs")
    monkeypatch.setitem(kernels._state, "mode", kernel)
    assert (kernels.fused_gru() is not None) == (kernel == "fused")
    seq_algo, clients = make_algorithm("runtime.execution=sequential", *overrides)
    coh_algo, _ = make_algorithm("runtime.execution=cohort", *overrides)
    calls = []
    original = type(coh_algo).cohort_update

    def spy(self, *args, **kwargs):
        calls.append(len(args[2]))
        return original(self, *args, **kwargs)

    spy.reproduces = original.reproduces
    monkeypatch.setattr(type(coh_algo), "cohort_update", spy)
    cohort_run = federate(coh_algo, clients)
    assert calls == [len(clients)] * 3  # the stacked path ran, once per round for the whole cohort
    assert_same_run(federate(seq_algo, clients), cohort_run)


@pytest.mark.parametrize("algorithm", ["fedmlac", "fedprox"])
def test_chunking_and_worker_threads_give_the_numbers_of_one_chunk(algorithm):
    one = make_algorithm(
        f"algorithm={algorithm}",
        "runtime.cohort_chunk=64",
        "runtime.cohort_workers=1",
        "runtime.execution=cohort",
    )
    expected = federate(*one, rounds=2)
    for workers in (1, 3):
        algo, clients = make_algorithm(
            f"algorithm={algorithm}",
            "runtime.cohort_chunk=2",
            f"runtime.cohort_workers={workers}",
            "runtime.execution=cohort",
        )
        assert_same_run(expected, federate(algo, clients, rounds=2), tol=1e-6)


def test_cohort_workers_setting():
    from fedac.training.stacking import cohort_workers

    cfg = load_config(overrides=["runtime.cohort_workers=3"]).runtime
    assert cohort_workers(cfg) == 3
    cfg.cohort_workers = 0  # auto: at least one, at most one per core
    assert 1 <= cohort_workers(cfg) <= (os.cpu_count() or 1)
    cfg.cohort_workers = -1
    with pytest.raises(ConfigError, match="runtime.cohort_workers"):
        cohort_workers(cfg)


def test_heterogeneous_cohort_runs_one_stacked_group_per_architecture(monkeypatch):
    algo, clients = make_algorithm(
        "algorithm=fedmlac",
        "model.heterogeneous=true",
        "model.zoo=[crnn_tiny,crnn_lite]",
        "runtime.execution=cohort",
    )
    groups = []
    real = stacking.plan_chunks

    def spy(datas, positions, *args):
        groups.append(sorted(algo.client_architecture(d.name) for d in datas))
        return real(datas, positions, *args)

    monkeypatch.setattr(stacking, "plan_chunks", spy)
    federate(algo, clients, rounds=1)
    archs = sorted(algo.client_architecture(c.name) for c in clients)
    assert len(set(archs)) == 2  # the seeded draw gives both architectures
    assert len(groups) == 2 and all(len(set(g)) == 1 for g in groups)
    assert sorted(a for g in groups for a in g) == archs


class _WithLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(FEATURES, 4, batch_first=True)
        self.head = nn.Linear(4, CLASSES)

    def forward(self, x):
        return self.head(self.rnn(x.transpose(1, 2))[0].mean(1))


def test_architecture_without_stacked_forward_is_named_and_cohort_mode_refuses_it(monkeypatch):
    """Issue 56: no silent fallback. A network vmap cannot batch (an LSTM) trains one client at a
    time under auto, with the reason in the path; runtime.execution=cohort refuses it."""
    algo, clients = make_algorithm("algorithm=fedavg", "model.name=crnn_tiny")
    monkeypatch.setattr(algo, "build_network", lambda name: _WithLSTM())
    reason = "model crnn_tiny has no stacked forward (holds an LSTM, which vmap cannot batch)"
    assert ExecutionPlan(algo).path == f"sequential: {reason}" and stacking_obstacle(algo)
    federate(algo, clients, rounds=1)  # auto: sequential, and it trains
    algo.cfg.runtime.execution = "cohort"
    with pytest.raises(ConfigError, match=r"runtime.execution=cohort.*holds an LSTM"):
        run_clients(algo, algo.broadcast(algo.init_server()), [None] * len(clients), clients, 1, 0)


# --- padding, masks and the step schedule ---------------------------------------------------------


def test_schedule_pads_short_clients_and_keeps_active_clients_a_prefix():
    clients = make_clients()
    cfg = load_config(overrides=["train.batch_size=16", "train.local_epochs=1"]).train
    # as plan_chunks sorts
    order = sorted(range(len(clients)), key=lambda i: -clients[i].num_samples)
    chunk = CohortChunk(order, [clients[i] for i in order], cfg, round_idx=1, seed=0)
    # largest first; ceil(n / 16) steps each
    assert [d.num_samples for d in chunk.datas] == [40, 37, 23, 16, 9, 5]
    assert chunk.positions == [4, 0, 3, 1, 5, 2]
    assert chunk.client_steps == [3, 3, 2, 1, 1, 1]
    assert [s.active for s in chunk.steps] == [6, 3, 2]
    first = chunk.steps[0]
    assert first.width == 16 and first.sizes == [16, 16, 16, 16, 9, 5]
    # weights: 1 / b on real samples, 0 on padding; each client's weights sum to one
    assert torch.allclose(first.weight.sum(1), torch.ones(6))
    assert (
        float(first.weight[5, 0]) == pytest.approx(1 / 5)
        and float(first.weight[5, 5:].abs().sum()) == 0.0
    )
    assert [s.sizes for s in chunk.steps[1:]] == [[16, 16, 7], [8, 5]]
    # each client's rows are a permutation of its own samples, drawn from its batch generator
    offsets = {4: 0, 0: 40, 3: 77, 1: 100, 5: 116, 2: 125}
    for k, position in enumerate(chunk.positions):
        rows = (
            torch.cat([s.index[k, : s.sizes[k]] for s in chunk.steps if s.active > k])
            - offsets[position]
        )
        assert sorted(rows.tolist()) == list(range(clients[position].num_samples))
    x, y = chunk.batch(first)
    assert x.shape == (6, 16, FEATURES, FRAMES) and y.shape == (6, 16)
    assert torch.equal(x[5, 7], clients[2].x[0])  # padding repeats the client's own first sample


def test_padding_and_finished_clients_do_not_move_parameters():
    """A client past its last step keeps its parameters and momentum, exactly."""
    cfg = load_config(
        overrides=["train.momentum=0.9", "train.weight_decay=0.1", "train.lr=0.1"]
    ).train
    params = {"w": torch.ones(3, 2)}
    opt = StackedSGD(params, cfg)
    opt.step({"w": torch.ones(3, 2)}, active=3)
    after_first = params["w"].clone()
    opt.step({"w": torch.full((2, 2), 2.0)}, active=2)
    assert torch.equal(params["w"][2], after_first[2])
    # torch.optim.SGD on client 0 alone gives the same two steps
    w = nn.Parameter(torch.ones(2))
    sgd = torch.optim.SGD([w], lr=0.1, momentum=0.9, weight_decay=0.1)
    for g in (1.0, 2.0):
        w.grad = torch.full((2,), g)
        sgd.step()
    assert torch.allclose(params["w"][0], w.detach(), atol=1e-7)


# --- dispatch -------------------------------------------------------------------------------------


def test_auto_uses_the_cohort_path_unless_client_update_was_replaced(monkeypatch):
    algo, clients = make_algorithm("algorithm=fedavg")
    assert algo.cfg.runtime.execution == "auto" and stacking_obstacle(algo) is None
    calls = []
    real = FedAvg.client_update

    def patched(self, *args):
        calls.append(args[2].name)
        return real(self, *args)

    monkeypatch.setattr(FedAvg, "client_update", patched)
    assert stacking_obstacle(algo) is not None
    assert ExecutionPlan(algo).path == "sequential: FedAvg overrides client_update"
    federate(algo, clients, rounds=1)
    assert calls == [c.name for c in clients]  # sequential, so the patch is honoured


def test_fedkad_has_no_cohort_path_auto_says_so_and_cohort_mode_fails():
    algo, clients = make_algorithm("algorithm=fedkad")
    assert stacking_obstacle(algo) is not None
    assert ExecutionPlan(algo).path == "sequential: FedKAD has no stacked cohort_update"
    results = federate(algo, clients, rounds=1)[2]
    payload = algo.broadcast(algo.init_server())
    alone = train_client(algo, payload, algo.init_client_state(clients[0].name), clients[0], 1, 0)
    assert len(results) == len(clients) and alone.upload.keys() == results[0].upload.keys()
    algo.cfg.runtime.execution = "cohort"
    with pytest.raises(ConfigError, match="FedKAD has no stacked cohort_update"):
        federate(algo, clients, rounds=1)


def test_bad_execution_settings_are_named():
    # a choice setting: refused when the config loads, naming the choices
    for bad in ("vectorised", "fast"):
        with pytest.raises(ConfigError, match="runtime.execution.*sequential"):
            load_config(overrides=[f"runtime.execution={bad}"])
    algo, clients = make_algorithm("runtime.execution=cohort")
    algo.packing.chunk = -1  # load_config refuses it; the runtime's own guard still holds
    with pytest.raises(ConfigError, match="runtime.cohort_chunk"):
        run_clients(algo, algo.broadcast(algo.init_server()), [None] * len(clients), clients, 1, 0)


@pytest.mark.slow
def test_simulator_default_run_takes_the_cohort_path_and_matches_sequential(
    gsc_root, tmp_path, monkeypatch
):
    base = [
        f"data.root={gsc_root}",
        f"data.cache_dir={tmp_path / 'cache'}",
        "algorithm=fedmlac",
        "model.client_model=crnn_tiny",
        "fedmlac.plugin_model=crnn_tiny",
        "train.rounds=2",
        "train.fraction=0.5",
        "train.eval_every=1",
        "train.lr=0.05",
    ]
    seq = Simulator(
        load_config(overrides=[*base, "runtime.execution=sequential"]),
        tmp_path / "seq",
        progress=False,
    )
    seq.run()
    calls = []
    real = fedmlac_module.train_chunks  # (the stacked update's chunks: once a round here)
    monkeypatch.setattr(
        "fedac.algorithms.fedmlac.train_chunks", lambda *a: calls.append(1) or real(*a)
    )
    auto = Simulator(load_config(overrides=base), tmp_path / "auto", seq.data, progress=False)
    auto.run()
    assert calls == [1, 1]
    assert max_diff(seq.state.server["params"], auto.state.server["params"]) <= TOL
    for name, state in seq.state.clients.items():
        assert max_diff(state, auto.state.clients[name]) <= TOL
    # parameters agree to ~1e-7; at most a tie could flip one clip
    one_clip = 1.0 / seq.data.val.num_clips
    for a, b in zip(seq.state.history, auto.state.history):
        assert abs(a["val_accuracy"] - b["val_accuracy"]) <= one_clip + 1e-12
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)
