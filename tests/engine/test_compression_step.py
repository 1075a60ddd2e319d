"""Compression inside the one server step (engine/server_step.py): the ledger counts the wire size,
poisoning comes before compression, dp.mode=client clips before it and dp.mode=central after
decompression, the residuals live in the run state; and a short run through the simulator uploads at
most 5 % of FedAvg's bytes with topk at 1 %, trains, and resumes exactly with error feedback."""

from __future__ import annotations

import math

import pytest
import torch

from fedac.algorithms.base import Algorithm
from fedac.config import load_config
from fedac.engine.checkpoint import load_checkpoint
from fedac.engine.data import build_federated_data
from fedac.engine.server_step import Arrival, ServerStep
from fedac.engine.simulator import Simulator
from fedac.engine.state import RunState
from fedac.errors import ConfigError
from fedac.rules.attacks import Attack
from fedac.rules.compression import Compressor
from fedac.rules.privacy import Privacy
from fedac.settings.compatibility import check
from helpers import tiny_run

NAMES = ["a", "b"]
D = 20  # entries of the hand-made model


class RecordingMean(Algorithm):
    """The plain mean of the uploads' one tensor; records what it was given."""

    def __init__(self):  # only the server side is exercised
        self.seen: list[list[tuple[dict, int]]] = []

    def init_server(self):
        return {"params": {"x": torch.zeros(D)}}

    def client_update(self, payload, state, data, round_idx, generator):
        raise AssertionError("not called")

    def server_update(self, server, uploads, round_idx):
        self.seen.append(uploads)
        x = sum(u["x"] for u, _ in uploads) / len(uploads)
        return {"params": {"x": x}}, {}


def step_with(*overrides: str) -> tuple[ServerStep, RecordingMean]:
    cfg = load_config(overrides=list(overrides))
    algo = RecordingMean()
    privacy = Privacy(cfg, num_clients=10, cohort_size=2, dp_compatible=True)
    attack = Attack(cfg, NAMES)
    return ServerStep(algo, attack, privacy, None, Compressor(cfg, True)), algo


def arrivals(scale: float = 1.0) -> list[Arrival]:
    g = torch.Generator().manual_seed(1)
    return [Arrival(n, {"x": torch.randn(D, generator=g) * scale}, 5) for n in NAMES]


def test_the_ledger_counts_the_wire_size_of_every_arrival():
    step, _ = step_with("compression.method=topk", "compression.ratio=0.1")
    state = RunState("mean", {"params": {"x": torch.zeros(D)}})
    sent = arrivals() + [Arrival("nan", {"x": torch.full((D,), math.nan)}, 5)]
    metrics = step(state, {"x": torch.zeros(D)}, sent, 1).metrics
    # k = 2 of 20 entries, each a 1-byte index + a 4-byte float; the rejected upload was sent too
    assert metrics["upload_bytes"] == 3 * 2 * (1 + 4)
    assert metrics["download_bytes"] == 3 * D * 4  # broadcasts travel dense
    # the rejected client's residual is left alone (its NaN would poison its later updates)
    assert set(state.compression_residuals) == set(NAMES)


def test_without_compression_the_server_step_is_unchanged():
    step, algo = step_with()
    state = RunState("mean", {"params": {"x": torch.zeros(D)}})
    sent = arrivals()
    metrics = step(state, {"x": torch.zeros(D)}, sent, 1).metrics
    assert metrics["upload_bytes"] == 2 * D * 4
    assert all(u["x"] is a.upload["x"] for (u, _), a in zip(algo.seen[0], sent))
    assert state.compression_residuals == {}


def test_a_malicious_client_poisons_what_it_then_compresses():
    # Gaussian noise in place of the update: compressed after poisoning, only k entries move
    step, algo = step_with(
        "compression.method=topk",
        "compression.ratio=0.1",
        "attack.kind=gaussian",
        "attack.fraction=1.0",
    )
    state = RunState("mean", {"params": {"x": torch.zeros(D)}})
    step(state, {"x": torch.zeros(D)}, arrivals(), 1)
    for upload, _ in algo.seen[0]:
        assert int((upload["x"] != 0).sum()) == 2


def norms(algo: RecordingMean) -> list[float]:
    return [float(u["x"].norm()) for u, _ in algo.seen[0]]


def test_central_dp_clips_the_decompressed_upload():
    step, algo = step_with(
        "compression.method=topk", "compression.ratio=0.25", "dp.mode=central", "dp.clip=0.5"
    )
    state = RunState("mean", {"params": {"x": torch.zeros(D)}})
    step(state, {"x": torch.zeros(D)}, arrivals(scale=10.0), 1)
    # clipped after decompression: what the server aggregates is exactly at the clip norm (clipped
    # before, its top quarter would be shorter), sparse, and weighted 1 (DP's unweighted mean)
    assert norms(algo) == pytest.approx([0.5, 0.5], rel=1e-5)
    assert all(int((u["x"] != 0).sum()) == 5 and n == 1 for u, n in algo.seen[0])


def test_client_dp_clips_before_compression_and_keeps_the_clipped_residual():
    step, algo = step_with(
        "compression.method=topk", "compression.ratio=0.25", "dp.mode=client", "dp.clip=0.5"
    )
    state = RunState("mean", {"params": {"x": torch.zeros(D)}})
    sent = arrivals(scale=10.0)
    step(state, {"x": torch.zeros(D)}, sent, 1)
    assert all(n < 0.5 - 1e-3 for n in norms(algo))  # the top quarter of a clipped update
    for arrival, (received, _) in zip(sent, algo.seen[0]):
        clipped = arrival.upload["x"] * (0.5 / float(arrival.upload["x"].norm()))
        residual = state.compression_residuals[arrival.client]["x"]
        assert torch.allclose(received["x"] + residual, clipped, atol=1e-6)


def test_quantisers_with_client_dp_are_refused_and_torchrun_gathers_compressed_uploads():
    with pytest.raises(ConfigError, match="dp.mode=client"):  # (the compatibility matrix)
        check(load_config(overrides=["compression.method=bf16", "dp.mode=client"]))
    # over several processes the server step needs every upload: no all-reduced weighted sum
    from types import SimpleNamespace

    from fedac.algorithms.fedavg import FedAvg
    from fedac.engine.distributed import sums_uploads

    fake = FedAvg.__new__(FedAvg)  # (only its class and settings are read)
    plain = SimpleNamespace(poisons="nothing"), SimpleNamespace(on=False)
    fake.cfg = load_config()
    assert sums_uploads(fake, *plain)
    fake.cfg = load_config(overrides=["compression.method=int8"])
    assert not sums_uploads(fake, *plain)


# --- through the simulator ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def settings(gsc_root, tmp_path_factory):
    """The tone chords' 12 classes, every client every round: a task FedAvg visibly learns in a
    few rounds."""
    return {
        **tiny_run(gsc_root, tmp_path_factory.mktemp("compression_cache")),
        "train.rounds": 6,
        "train.local_epochs": 2,
        "train.batch_size": 8,
        "train.fraction": 1.0,
        "data.task": 12,
        "data.gsc12": "fedkws",
    }


def config(settings, **extra):
    return load_config(overrides=[f"{k}={v}" for k, v in {**settings, **extra}.items()])


@pytest.fixture(scope="module")
def data(settings):
    return build_federated_data(config(settings), progress=False)


TOPK_1 = {"compression.method": "topk", "compression.ratio": 0.01}


@pytest.mark.usefixtures("one_thread")
def test_topk_at_one_percent_uploads_at_most_5_percent_of_fedavgs_bytes_and_trains(
    settings, data, tmp_path
):
    dense = Simulator(config(settings), tmp_path / "fedavg", data, progress=False).run()
    sim = Simulator(config(settings, **TOPK_1), tmp_path / "topk", data, progress=False)
    sparse = sim.run()
    up = [row["upload_bytes_total"] for row in sparse["history"]]
    up_dense = [row["upload_bytes_total"] for row in dense["history"]]
    assert up[-1] <= 0.05 * up_dense[-1]
    print(
        f"topk 1 %: {up[-1]:.0f} of FedAvg's {up_dense[-1]:.0f} bytes ({up[-1] / up_dense[-1]:.4f})"
    )
    # it trains: the shared model's loss on every client's training windows falls
    start, end = (
        training_loss(sim, params)
        for params in (sim.algorithm.init_server()["params"], sim.state.server["params"])
    )
    print(f"training loss: {start:.4f} at the start, {end:.4f} after {len(up)} rounds")
    assert end < start - 0.01
    assert sim.state.compression_residuals  # error feedback kept the clients' residuals


def training_loss(sim: Simulator, params) -> float:
    """Cross-entropy of the shared model `params` on the pooled training windows of every client."""
    model = sim.algorithm.scratch_model(sim.cfg.model.name, params).eval()
    x = torch.cat([c.x for c in sim.data.clients])
    y = torch.cat([c.y for c in sim.data.clients])
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(model(x), y))


@pytest.mark.usefixtures("one_thread")
def test_a_run_with_topk_and_error_feedback_resumes_exactly(settings, data, tmp_path):
    cfg = config(settings, **{"compression.method": "topk", "compression.ratio": 0.05})
    straight = Simulator(cfg, tmp_path / "straight", data, progress=False)
    expected = straight.run()
    assert Simulator(cfg, tmp_path / "run", data, progress=False).run(stop_after=2) is None
    saved = load_checkpoint(tmp_path / "run")
    assert saved.round == 2 and saved.compression_residuals  # the residuals are checkpointed
    resumed = Simulator(cfg, tmp_path / "run", data, progress=False)
    results = resumed.run(resume=True)
    final, want = resumed.state.server["params"], straight.state.server["params"]
    assert all(torch.equal(final[k], want[k]) for k in want)
    assert results["final"] == expected["final"]
    got, kept = resumed.state.compression_residuals, straight.state.compression_residuals
    assert got.keys() == kept.keys()
    assert all(torch.equal(got[c][k], kept[c][k]) for c in kept for k in kept[c])


@pytest.mark.usefixtures("one_thread")
def test_with_download_the_clients_train_from_the_quantised_broadcast(
    settings, data, tmp_path, monkeypatch
):
    from fedac.engine import simulator as simulator_module

    received = []
    real = simulator_module.run_shared
    monkeypatch.setattr(
        simulator_module,
        "run_shared",
        lambda world, plan, payload, *rest: (
            received.append(payload) or real(world, plan, payload, *rest)
        ),
    )
    cfg = config(
        settings,
        **{"train.rounds": 2, "compression.method": "int8", "compression.download": True},
    )
    sim = Simulator(cfg, tmp_path, data, progress=False)
    history = sim.run()["history"]
    dense = sim.algorithm.init_server()["params"]
    first = received[0]
    floats = [n for n, v in dense.items() if v.is_floating_point()]
    for n in floats:  # round 1's broadcast: the initial model at its int8 scale per tensor
        scale = float(dense[n].abs().max()) / 127
        assert torch.allclose(first[n] / scale, torch.round(dense[n] / scale), atol=1e-3), n
    assert any(not torch.equal(first[n], dense[n]) for n in floats)
    # each client received a 4-byte scale and one byte per entry per tensor, the rest dense
    per_client = sum(4 + dense[n].numel() for n in floats) + sum(
        v.numel() * v.element_size() for n, v in dense.items() if n not in floats
    )
    clients = len(sim.data.clients)
    assert [row["download_bytes"] for row in history] == [per_client * clients] * 2
