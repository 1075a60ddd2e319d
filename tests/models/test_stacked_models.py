"""The stacked path for any network (training/functional.py, issue 56): every registered feature
model (the CRNNs' hand-written forward included) trains stacked under SGD, Adam and AdamW, with
per-client gradient clipping, padded steps (BatchNorm's statistics over a client's real samples),
FedKWS-UI's augmentation drawn per client (data/augment.py) and per-client dropout, and gives the
sequential numbers to float tolerance; the stacked optimizers and clipping against torch's own on
each client."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedac.algorithms import build_algorithm
from fedac.algorithms.base import ClientData, Task
from fedac.config import load_config
from fedac.data.augment import AugmentedWindows
from fedac.engine.execution import ExecutionPlan, run_clients
from fedac.models import KWS_CNN_SPECS, KWS_MODELS
from fedac.models.crnn import CRNN_SPECS
from fedac.seeding import torch_generator
from fedac.training.functional import StackedAdam, clip_stacked

FEATURES, FRAMES, CLASSES = 8, 21, 4
# unequal clients and batch 4: steps of widths 4, 4 and 3 pad the short clients (BatchNorm masks
# them)
SIZES = [7, 5, 3]
#: float32 sums in another order (vmapped convolutions, the written-out GRU, masked BatchNorm) after
#: two optimiser steps; Adam divides by sqrt(v) ~ |g|, so a relative error of the gradient stays
#: relative.
TOL = 2e-4

MODELS = [*CRNN_SPECS, *KWS_MODELS, *KWS_CNN_SPECS]


class _Frames:
    """A stand-in feature extractor for augmentation: a clip of features x frames samples read as
    its (features, frames) matrix, so time shift and noise reach the model and SpecAugment masks
    it."""

    def __init__(self, frames: int):
        self.num_features, self.frames = FEATURES, frames
        # the shift pads round(0.1 rate) samples
        self.cfg = type("cfg", (), {"sample_rate": FEATURES * frames})()

    def __call__(self, wave: torch.Tensor) -> torch.Tensor:
        return wave.reshape(wave.shape[0], FEATURES, self.frames)


def clients_for(model: str, sizes=SIZES, seed=0, augment: bool = False) -> list[ClientData]:
    frames = 101 if model == "kwt" else FRAMES  # KWT's learned positions fix the frame count
    g = torch.Generator().manual_seed(seed)
    noise = (
        torch.randn(3 * FEATURES * frames, generator=g).numpy(),
        torch.randn(FEATURES * frames // 2, generator=g).numpy(),
    )
    out = []
    for i, n in enumerate(sizes):
        x = torch.randn(n, FEATURES, frames, generator=g)
        if augment:  # the windows as waveforms, augmented afresh at every batch (features.augment)
            x = AugmentedWindows(x.flatten(1), _Frames(frames), lambda f: f, noise)
        out.append(
            ClientData(
                f"c{i}",
                x,
                torch.randint(0, CLASSES, (n,), generator=g),
                torch.zeros(0, FEATURES, frames),
                torch.zeros(0, dtype=torch.long),
            )
        )
    return out


def algorithm(model: str, *overrides: str, algo: str = "fedavg"):
    cfg = load_config(
        overrides=[
            f"algorithm={algo}",
            f"model.name={model}",
            "train.batch_size=4",
            "train.local_epochs=1",
            "train.lr=0.01",
            "runtime.device=cpu",
            "model.dropout=0",
            *overrides,
        ]
    )
    clients = clients_for(model, augment=cfg.features.augment)
    return build_algorithm(cfg, Task(FEATURES, CLASSES, [c.name for c in clients])), clients


def one_round(model: str, execution: str, *overrides: str, algo: str = "fedavg"):
    alg, clients = algorithm(model, f"runtime.execution={execution}", *overrides, algo=algo)
    assert ExecutionPlan(alg).path == (
        "stacked" if execution == "cohort" else "sequential: runtime.execution=sequential"
    )
    payload = alg.broadcast(alg.init_server())
    states = [alg.init_client_state(c.name) for c in clients]
    return run_clients(alg, payload, states, clients, 1, 0)


def assert_close(a, b, tol=TOL, free=(), free_tol=0.0):
    """Uploads and losses equal to `tol` (relative to each tensor's size); entries named in `free`
    to `free_tol`."""
    for ra, rb in zip(a, b):
        for name, value in ra.upload.items():
            other = rb.upload[name]
            if value.is_floating_point():
                scale = max(1.0, float(value.abs().max()))
                assert (
                    float((value - other).abs().max())
                    <= (free_tol if name in free else tol) * scale
                ), name
            else:
                assert torch.equal(value, other), name
        assert ra.metrics["loss"] == pytest.approx(rb.metrics["loss"], rel=tol, abs=tol)


def zero_gradient_entries(model: str, *settings: str) -> set[str]:
    """Parameters whose exact gradient is zero (a convolution's bias right before BatchNorm, which
    the batch mean cancels): SGD leaves them where they were, to float noise."""
    alg, clients = algorithm(
        model, "runtime.execution=sequential", "train.optimizer=sgd", *settings
    )
    start = alg.init_server()["params"]
    moved = one_round(model, "sequential", "train.optimizer=sgd", *settings)[0].upload
    return {
        n
        for n, _ in alg.scratch_model(model).named_parameters()
        if float((moved[n] - start[n]).abs().max()) < 1e-8
    }


@pytest.mark.parametrize("augment", [False, True], ids=["clean", "augmented"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
@pytest.mark.parametrize("model", MODELS)
def test_every_feature_model_trains_stacked_as_it_trains_alone(model, optimizer, augment):
    settings = [
        f"train.optimizer={optimizer}",
        "train.max_grad_norm=0.5",
        "train.weight_decay=0.01",
        f"features.augment={str(augment).lower()}",
    ]
    free, free_tol = set(), 0.0
    if optimizer != "sgd":
        # Adam moves every parameter by about lr a step whatever the gradient's size, so a gradient
        # that is float noise (zero in exact arithmetic) moves it by a noise-signed lr on either
        # path: those entries agree to 2 lr per step, the rest (and what the noise feeds downstream,
        # at this small lr) to TOL.
        settings.append("train.lr=0.0001")
        free, free_tol = zero_gradient_entries(model, "train.lr=0.0001"), 2 * 2 * 1e-4
    assert_close(
        one_round(model, "cohort", *settings),
        one_round(model, "sequential", *settings),
        free=free,
        free_tol=free_tol,
    )


class _DropoutNet(nn.Module):
    """A plug-in-like network with dropout between two layers (no zoo model of the vmap path has
    any)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Flatten(), nn.Linear(FEATURES * FRAMES, 16), nn.ReLU(), nn.Dropout(0.5)
        )
        self.head = nn.Linear(16, CLASSES)

    def forward(self, x):
        return self.head(self.body(x))


@pytest.mark.parametrize("augment", ["false", "true"])
def test_dropout_masks_are_each_clients_own_and_repeat_with_the_seed(monkeypatch, augment):
    """Alone on the CPU a client draws its augmentation and then its masks from one stream (the
    global RNG): the stacked path keeps that order per client."""
    from fedac.algorithms.fedavg import FedAvg

    monkeypatch.setattr(FedAvg, "build_network", lambda self, name: _DropoutNet())
    settings = ("train.lr=0.1", f"features.augment={augment}")
    stacked = one_round("dscnn", "cohort", *settings)
    # the masks a lone client draws
    assert_close(stacked, one_round("dscnn", "sequential", *settings))
    assert_close(stacked, one_round("dscnn", "cohort", *settings), tol=0.0)  # repeat with the seed
    if augment == "true":  # augmentation reached the model
        clean = one_round("dscnn", "cohort", "train.lr=0.1")
        assert (
            float((stacked[0].upload["head.weight"] - clean[0].upload["head.weight"]).abs().max())
            > 1e-4
        )
        return
    # Two clients with the same data and batch order would end equal without dropout; their own
    # masks part them.
    alg, clients = algorithm(
        "dscnn", "runtime.execution=cohort", "train.lr=0.1", "train.batch_size=8"
    )
    twins = [
        ClientData(name, clients[0].x, clients[0].y, clients[0].holdout_x, clients[0].holdout_y)
        for name in ("a", "b")
    ]
    monkeypatch.setattr("fedac.training.stacking.torch_generator", _same_batches(torch_generator))
    a, b = run_clients(alg, alg.broadcast(alg.init_server()), [None, None], twins, 1, 0)
    assert float((a.upload["head.weight"] - b.upload["head.weight"]).abs().max()) > 1e-4


def _same_batches(real):
    """torch_generator with one batch order for every client (dropout streams stay per client)."""
    return lambda seed, purpose, *ids, **kw: real(
        seed, purpose, *(ids[:1] if purpose == "batches" else ids), **kw
    )


@pytest.mark.parametrize("decoupled", [False, True])
def test_stacked_adam_is_torchs_adam_on_each_client(decoupled):
    cfg = load_config(overrides=["train.lr=0.01", "train.weight_decay=0.1"]).train
    g = torch.Generator().manual_seed(0)
    params = {"w": torch.randn(3, 4, generator=g)}
    start = params["w"].clone()
    grads = [torch.randn(3, 4, generator=g) for _ in range(3)]
    opt = StackedAdam(params, cfg, decoupled)
    for step, grad in enumerate(grads):
        # the last client stops after 2 steps
        opt.step({"w": grad[: 3 - step // 2].clone()}, active=3 - step // 2)
    for k in range(3):
        w = nn.Parameter(start[k].clone())
        torch_opt = (torch.optim.AdamW if decoupled else torch.optim.Adam)(
            [w], lr=0.01, weight_decay=0.1
        )
        for step, grad in enumerate(grads):
            if k < 3 - step // 2:
                w.grad = grad[k].clone()
                torch_opt.step()
        assert torch.allclose(params["w"][k], w.detach(), atol=1e-7, rtol=0)


def test_clipping_is_clip_grad_norm_on_each_client():
    g = torch.Generator().manual_seed(0)
    grads = {
        "a": torch.randn(3, 5, generator=g) * torch.tensor([[0.01], [1.0], [10.0]]),
        "b": torch.randn(3, 2, 2, generator=g),
        "unused": None,
    }
    expected = []
    for k in range(3):
        ps = [nn.Parameter(torch.zeros(5)), nn.Parameter(torch.zeros(2, 2))]
        ps[0].grad, ps[1].grad = grads["a"][k].clone(), grads["b"][k].clone()
        nn.utils.clip_grad_norm_(ps, 1.5)
        expected.append([p.grad for p in ps])
    clip_stacked(grads, 1.5)
    for k in range(3):
        assert torch.allclose(grads["a"][k], expected[k][0], atol=1e-7) and torch.allclose(
            grads["b"][k], expected[k][1], atol=1e-7
        )
    assert float(grads["a"][0].norm()) < 1.5 * 0.1  # the small client is not scaled up


@pytest.mark.parametrize(
    "model, overrides",
    [
        ("dscnn", []),
        ("mhattrnn", ["fedkwsui.private=persistent"]),
        ("kwt", ["train.optimizer=adamw", "train.lr=0.0001"]),
        ("resnet15", ["fedkwsui.adv_lambda=0"]),
        ("dscnn", ["features.augment=true"]),
        ("kwt", ["train.optimizer=adamw", "train.lr=0.0001", "features.augment=true"]),
    ],
)
def test_fedkwsui_trains_stacked_as_it_trains_alone(model, overrides):
    """FedKWS-UI's protocol (clipping, private phase, ALT's per-client step counts, per-client mu_k,
    its augmentation) stacked."""
    sizes = [9, 6, 3, 7]

    def run(execution):
        clients = clients_for(model, sizes, augment="features.augment=true" in overrides)
        counts = [torch.bincount(c.y, minlength=CLASSES).tolist() for c in clients]
        cfg = load_config(
            overrides=[
                "algorithm=fedkwsui",
                f"model.name={model}",
                "train.batch_size=4",
                "runtime.device=cpu",
                "fedkwsui.local_steps=3",
                "fedkwsui.size_cap=8",
                "fedkwsui.r0=1.5",
                "train.max_grad_norm=0.5",
                "train.lr=0.01",
                f"runtime.execution={execution}",
                *overrides,
            ]
        )
        alg = build_algorithm(cfg, Task(FEATURES, CLASSES, [c.name for c in clients], counts))
        if execution == "cohort":
            assert ExecutionPlan(alg).path == "stacked"
            # ALT: unequal step counts
            assert len({alg.client_plan(c.name)["steps"] for c in clients}) > 1
        return run_clients(
            alg,
            alg.broadcast(alg.init_server()),
            [alg.init_client_state(c.name) for c in clients],
            clients,
            1,
            0,
        )

    stacked, alone = run("cohort"), run("sequential")
    adam = "train.optimizer=adamw" in overrides
    free = zero_gradient_entries(model, "train.lr=0.0001") if adam else set()
    assert_close(stacked, alone, free={f"encoder.{n}" for n in free}, free_tol=2 * 4 * 1e-4)
    for a, b in zip(stacked, alone):
        assert (
            a.metrics["steps"] == b.metrics["steps"]
            and a.metrics["private_steps"] == b.metrics["private_steps"]
        )
        assert (a.state is None) == (b.state is None)
        if a.state is not None:
            assert a.state.keys() == b.state.keys()


@pytest.mark.parametrize("chosen", ["stacked", "sequential"])
def test_auto_probe_keeps_the_chosen_paths_results_and_says_which(chosen, monkeypatch):
    alg, clients = algorithm("cnn1_softmax", "runtime.execution=probe")
    plan = ExecutionPlan(alg)
    assert plan.needs_probe and plan.path.startswith("auto: ")
    real = plan.record
    monkeypatch.setattr(
        plan,
        "record",
        lambda s, q, n, error: real(*((0.1, 1.0) if chosen == "stacked" else (1.0, 0.1)), n, error),
    )
    probed = plan.run(alg.broadcast(alg.init_server()), [None] * len(clients), clients, 1, 0)
    reference = one_round("cnn1_softmax", "cohort" if chosen == "stacked" else "sequential")
    assert_close(probed, reference, tol=0.0)  # the kept results are the chosen path's, bit for bit
    assert not plan.needs_probe
    assert (
        plan.path == "stacked"
        if chosen == "stacked"
        else plan.path.startswith("sequential: auto measured model cnn1_softmax")
    )


class _FunctionalDropoutNet(_DropoutNet):
    """Dropout as a function call, which the stacked path cannot replay (vmap refuses the random
    op)."""

    def forward(self, x):
        return self.head(nn.functional.dropout(self.body(x), 0.5, self.training))


def test_a_network_that_cannot_run_under_vmap_leaves_auto_sequential_with_the_error(monkeypatch):
    from fedac.algorithms.fedavg import FedAvg

    monkeypatch.setattr(FedAvg, "build_network", lambda self, name: _FunctionalDropoutNet())
    alg, clients = algorithm("dscnn", "runtime.execution=probe")
    plan = ExecutionPlan(alg)
    probed = plan.run(alg.broadcast(alg.init_server()), [None] * len(clients), clients, 1, 0)
    assert plan.path.startswith(
        "sequential: model dscnn's stacked path (vmap) failed on the probe chunk: "
    )
    # every client trained sequentially
    assert_close(probed, one_round("dscnn", "sequential"), tol=0.0)


@pytest.mark.parametrize("faster", ["stacked", "sequential"])
def test_auto_on_the_cpu_times_a_vmapped_network_once_per_machine(faster, tmp_path, monkeypatch):
    """Under auto on the CPU a vmapped network is timed on the first round's probe chunk (a fake
    clock makes either path the faster); the choice is kept for this machine, so a second run of
    the command reads it, times nothing, and computes the same numbers bit for bit."""
    from fedac.engine import execution

    alg, clients = algorithm("cnn1_softmax", "runtime.execution=auto")
    cache = execution.ProbeCache(tmp_path)
    plan = ExecutionPlan(alg, cache)
    assert plan.needs_probe and plan.path.startswith("auto: ")
    stacked_s, sequential_s = (1.0, 3.0) if faster == "stacked" else (3.0, 1.0)
    # _now is read at the start and end of the timed stacked pass, then of the sequential one
    clock = iter([0.0, stacked_s, 10.0, 10.0 + sequential_s])
    monkeypatch.setattr(execution, "_now", lambda device: next(clock))
    payload = alg.broadcast(alg.init_server())
    probed = plan.run(payload, [None] * len(clients), clients, 1, 0)
    assert (
        plan.path == "stacked"
        if faster == "stacked"
        else plan.path.startswith(
            "sequential: auto measured model cnn1_softmax's stacked path (vmap) slower"
        )
    )
    assert_close(
        probed,
        one_round("cnn1_softmax", "cohort" if faster == "stacked" else "sequential"),
        tol=0.0,
    )
    monkeypatch.setattr(execution, "_now", lambda device: pytest.fail("timed again"))
    again = ExecutionPlan(alg, cache)
    assert not again.needs_probe and again.measured[again.key]["path"] == faster
    assert_close(again.run(payload, [None] * len(clients), clients, 1, 0), probed, tol=0.0)
    # another machine (here: another thread count) measures for itself
    monkeypatch.setattr(execution, "machine_id", lambda device: "another machine")
    assert ExecutionPlan(alg, cache).needs_probe
    # torchrun's other ranks keep nothing: rank 0's measurement is the one every rank follows
    silent = execution.ProbeCache(tmp_path / "rank1", writes=False)
    silent.write("key", {"path": "stacked"})
    assert silent.read("key") is None and cache.read("key") is None


class _AmpleGauge:
    """A GPU's memory as packing reads it (training/packing.py), with room for any chunk."""

    def free(self) -> int:
        return 10**12

    def begin(self) -> int:
        return 0

    def peak(self) -> int:
        return 1_000


def test_probe_on_a_memory_packed_device_times_full_chunks_after_an_untimed_warm_up(monkeypatch):
    """Issue 56's GPU finding: a probe of 16 clients ran stacked as packing's memory probe of 8 plus
    a chunk of 8 (its one-off set-up counted against it). Now each path first trains a few clients
    untimed, and the stacked path is timed on the rest of the round in the chunks it would train
    (one, memory allowing)."""
    from fedac.training.packing import Packing

    sizes = [6, 6, 5, 5, 4, 4, 4, 3, 3, 3, 2, 2]
    clients = clients_for("cnn1_softmax", sizes)

    def build(execution):
        cfg = load_config(
            overrides=[
                "algorithm=fedavg",
                "model.name=cnn1_softmax",
                "train.batch_size=4",
                "runtime.device=cpu",
                "model.dropout=0",
                f"runtime.execution={execution}",
            ]
        )
        return build_algorithm(cfg, Task(FEATURES, CLASSES, [c.name for c in clients]))

    alg = build("probe")
    # chunks sized by (fake) free memory
    alg.packing = Packing(0, torch.device("cpu"), gauge=_AmpleGauge())
    calls, real = [], alg.cohort_update
    monkeypatch.setattr(
        alg,
        "cohort_update",
        lambda p, s, d, r, seed: (calls.append(len(d)), real(p, s, d, r, seed))[1],
    )
    plan = ExecutionPlan(alg)
    record, timed_sizes = plan.record, []

    def stacked_wins(s, q, n, error):
        timed_sizes.extend(alg.packing.last_sizes)
        return record(0.1, 1.0, n, error)

    monkeypatch.setattr(plan, "record", stacked_wins)
    probed = plan.run(alg.broadcast(alg.init_server()), [None] * len(clients), clients, 1, 0)
    # the warm-up (packing's memory probe), the timed rest of the round, then the round stacked
    assert calls == [6, 6, 12]
    assert timed_sizes == [6]  # timed as one chunk, as the stacked path would train it
    (choice,) = plan.measured.values()
    assert choice["clients"] == 6 and choice["path"] == "stacked"
    seq = build("sequential")
    assert_close(
        probed,
        run_clients(seq, seq.broadcast(seq.init_server()), [None] * len(clients), clients, 1, 0),
    )


def test_a_clients_batch_indices_go_to_its_device_in_one_copy():
    """Indexing device data with a CPU index copies the index every step (a host sync per step on a
    GPU): `on_device` sends a client's whole batch schedule at once; on the CPU it leaves the
    batches alone."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from fedac.training.local import cycling_batches, on_device

    class Copies(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default):
                self.count += 1
            return func(*args, **kwargs)

    batches = list(cycling_batches(10, 4, 5, torch.Generator().manual_seed(0)))
    x = torch.empty(10, 3, device="meta")  # a device other than the CPU
    with Copies() as copies:
        moved = list(on_device(iter(batches), x))
    assert copies.count == 1 and all(m.device == x.device for m in moved)
    assert [len(m) for m in moved] == [len(b) for b in batches]
    cpu = torch.zeros(10, 3)
    assert all(a is b for a, b in zip(on_device(batches, cpu), batches))


@pytest.mark.parametrize("algo", ["fedavg", "fedkwsui"])
def test_the_sequential_paths_index_through_on_device(algo, monkeypatch):
    """The sequential client updates take their batch indices through `on_device` (one copy per
    client on a GPU), and train as before with it."""
    import fedac.algorithms.fedkwsui as fedkwsui_module
    import fedac.training.local as local

    seen, real = [], local.on_device

    def recording(batches, x):
        seen.append(x)
        return real(batches, x)

    monkeypatch.setattr(local, "on_device", recording)
    monkeypatch.setattr(fedkwsui_module, "on_device", recording)
    sizes = [7, 5]
    clients = clients_for("cnn1_softmax", sizes)
    counts = [torch.bincount(c.y, minlength=CLASSES).tolist() for c in clients]
    cfg = load_config(
        overrides=[
            f"algorithm={algo}",
            "model.name=cnn1_softmax",
            "train.batch_size=4",
            "runtime.device=cpu",
            "runtime.execution=sequential",
            "fedkwsui.local_steps=2",
        ]
    )
    alg = build_algorithm(cfg, Task(FEATURES, CLASSES, [c.name for c in clients], counts))
    run_clients(alg, alg.broadcast(alg.init_server()), [None] * 2, clients, 1, 0)
    assert len(seen) >= 2 and all(any(x is c.x for c in clients) for x in seen)


def test_a_sequential_fedavg_update_reads_the_device_once_per_client():
    """A value read to the host (`.item()`, `float(t)`) waits for a GPU's queued work: FedAvg's
    sequential update (the GPU kws workload's path) reads its summed loss once per client, never per
    step."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Reads(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                Reads.count += 1
            return func(*args, **(kwargs or {}))

    alg, clients = algorithm(
        "dscnn", "runtime.execution=sequential", "train.max_grad_norm=0.5", "train.local_epochs=3"
    )
    with Reads():
        results = run_clients(
            alg, alg.broadcast(alg.init_server()), [None] * len(clients), clients, 1, 0
        )
    assert sum(r.metrics["steps"] for r in results) > 2 * len(clients) and Reads.count == len(
        clients
    )
