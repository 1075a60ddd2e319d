"""docs/extending.md's reference for a `LocalObjective`, row by row: what it may call and what its
hooks and `server_update` receive, checked on the sequential and the stacked path and through the
simulator. The tables' rows must be exactly the ones checked here, so a row added to the page
without a check (or a check without its row) fails."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fedac.algorithms.base import ClientData, Task
from fedac.algorithms.objective import LocalObjective
from fedac.config import load_config
from fedac.seeding import torch_generator
from fedac.settings.algorithms import ALGORITHMS
from fedac.training.local import client_batches
from helpers import tiny_run

pytestmark = pytest.mark.usefixtures("one_thread")
DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
FEATURES, FRAMES, CLASSES = 10, 21, 3
SIZES = [11, 7, 4]  # batches of 4: the stacked path pads the shorter clients' last batches
MODEL = "dscnn"  # a network with BatchNorm buffers

HELPERS = {
    "`self.cfg`",
    "`self.task.clients`",
    "`self.task.num_features`, `self.task.num_classes`",
    "`self.initial_params(name, purpose, *ids)`",
    "`self.scratch_model(name, params=None)`",
    "`self.combine(server, uploads)`",
}
ARGUMENTS = {
    "`local_loss`'s `params`",
    "`forward(x)`",
    "`x`, `y`",
    "`weight`",
    "`state`",
    "`payload`",
    "`transform_grads`'s `grads`",
    "`finish_local`'s `params`",
    "`finish_local`'s `steps`",
    "`start_params`'s result",
    "`server_update`'s `uploads`",
}


def reference_tables() -> list[dict[str, str]]:
    """The two tables of the page's reference section: first cell -> second."""
    text = DOC.read_text()
    section = text.split("### Reference: what a `LocalObjective` may call and what it receives")[1]
    section = section.split("\n## ")[0]
    tables, rows = [], {}
    for line in section.splitlines() + [""]:
        if line.startswith("|---"):
            continue
        if line.startswith("| "):
            first, second = (cell.strip() for cell in line.strip("|").split(" | ", 1))
            rows[first] = second
        elif rows:
            tables.append(rows)
            rows = {}
    return tables


def test_the_reference_rows_are_the_checked_ones():
    helpers, arguments = reference_tables()
    assert set(helpers) - {"helper"} == HELPERS
    assert set(arguments) - {"argument"} == ARGUMENTS
    assert "parameters and its buffers (BatchNorm's" in arguments["`finish_local`'s `params`"]
    assert "no buffers" in arguments["`local_loss`'s `params`"]
    assert "count of training windows (n_k)" in arguments["`server_update`'s `uploads`"]


class Probe(LocalObjective):
    """A local objective that records what it is given (cross-entropy, the plain mean server)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: dict[str, list] = defaultdict(list)

    def init_server(self):
        params = self.initial_params(self.cfg.model.name, "global-init")
        return {"params": params, "round": torch.zeros(())}

    def broadcast(self, server):
        return {"params": server["params"], "tag": server["round"] + 1}

    def start_params(self, payload):
        return payload["params"]

    def init_client_state(self, client):
        return {"visits": torch.zeros(()), "index": torch.tensor(self.task.clients.index(client))}

    def local_loss(self, forward, params, x, y, weight, state, payload):
        logits = forward(x)
        self.seen["loss"].append(
            (sorted(params), tuple(x.shape), tuple(y.shape), y.dtype, tuple(logits.shape))
        )
        if "tag" in payload:
            self.seen["tag"].append(float(payload["tag"]))
        self.seen["state keys"].append(sorted(state))
        if not torch._C._functorch.is_batchedtensor(weight):  # (the sequential path)
            self.seen["weight"].append(float(weight.sum()))
        return (F.cross_entropy(logits, y, reduction="none") * weight).sum()

    def transform_grads(self, grads, params, state, payload):
        self.seen["grads"].append(sorted(grads))
        return grads

    def finish_local(self, params, state, payload, steps):
        self.seen["finish"].append((params, steps, int(state["index"]), float(state["visits"])))
        return params, {**state, "visits": state["visits"] + 1}

    def server_update(self, server, uploads, round_idx):
        self.seen["uploads"].append(uploads)
        self.seen["clients"].append(list(self.task.clients))
        mean, metrics = self.combine(server, uploads)
        self.seen["combined"].append(mean)
        return {"params": mean, "round": server["round"] + 1}, {}


class ModelPayload(Probe):
    """The broadcast is the model itself, the shape a model-poisoning attack needs."""

    def broadcast(self, server):
        return server["params"]

    def start_params(self, payload):
        return payload


def synthetic(*overrides: str) -> tuple[Probe, list[ClientData]]:
    g = torch.Generator().manual_seed(5)
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
            f"model.name={MODEL}",
            "train.batch_size=4",
            "train.local_epochs=2",
            "train.momentum=0",
            "runtime.device=cpu",
            *overrides,
        ]
    )
    return Probe(cfg, Task(FEATURES, CLASSES, [c.name for c in clients])), clients


def test_the_helpers_give_what_the_reference_says():
    algo, clients = synthetic("train.lr=0.2")
    assert algo.cfg.train.lr == 0.2 and algo.cfg.model.name == MODEL
    assert algo.task.clients == [c.name for c in clients]
    assert (algo.task.num_features, algo.task.num_classes) == (FEATURES, CLASSES)
    rng = torch.get_rng_state()
    first = algo.initial_params(MODEL, "mine", 3)
    assert torch.equal(torch.get_rng_state(), rng)  # the global RNG left as it was
    model = algo.scratch_model(MODEL)
    assert list(first) == list(model.state_dict())  # parameters and buffers
    assert {"cnn.1.running_mean", "cnn.1.running_var", "cnn.1.num_batches_tracked"} <= set(first)
    again, other = algo.initial_params(MODEL, "mine", 3), algo.initial_params(MODEL, "mine", 4)
    assert all(torch.equal(first[n], again[n]) for n in first)  # seeded by (seed, purpose, ids)
    assert not all(torch.equal(first[n], other[n]) for n in first)
    # one reused model on self.device, loaded when given params
    assert algo.scratch_model(MODEL, first) is model and next(model.parameters()).device == (
        torch.device(algo.device)
    )
    assert all(torch.equal(model.state_dict()[n], first[n]) for n in first)


def hooks_on(path: str) -> tuple[Probe, list[ClientData], list]:
    algo, clients = synthetic()
    payload = algo.broadcast(algo.init_server())
    states = [algo.init_client_state(c.name) for c in clients]
    if path == "sequential":
        results = [
            algo.client_update(payload, s, c, 1, torch_generator(0, "batches", 1, c.name))
            for s, c in zip(states, clients)
        ]
    else:
        results = algo.cohort_update(payload, states, clients, 1, 0)
    return algo, clients, results


@pytest.mark.parametrize("path", ["sequential", "stacked"])
def test_the_hooks_receive_what_the_reference_says(path):
    algo, clients, _ = hooks_on(path)
    model = algo.scratch_model(MODEL)
    trainable = sorted(name for name, _ in model.named_parameters())
    assert not any("running" in name for name in trainable)
    for names, x, y, dtype, logits in algo.seen["loss"]:
        assert names == trainable  # local_loss's params: trainable parameters only
        assert x[1:] == (FEATURES, FRAMES) and y == x[:1] and dtype == torch.long
        assert logits == (x[0], CLASSES)  # forward(x): the logits
    assert all(grads == trainable for grads in algo.seen["grads"])
    assert set(algo.seen["tag"]) == {1.0}  # the round's payload, the same for every client
    assert all(keys == ["index", "visits"] for keys in algo.seen["state keys"])
    batches = [
        len(list(client_batches(n, algo.cfg.train, torch_generator(0, "batches", 1, c.name))))
        for n, c in zip(SIZES, clients)
    ]
    finished = sorted(algo.seen["finish"], key=lambda f: f[2])
    assert [f[1] for f in finished] == batches == [6, 4, 2]  # steps: batches over 2 epochs
    for params, _, _, visits in finished:
        assert list(params) == list(model.state_dict())  # parameters and BatchNorm buffers
        assert visits == 0.0  # state: init_client_state's before the client's first round
    if path == "sequential":
        assert algo.seen["weight"] == pytest.approx([1.0] * sum(batches))


def test_weight_gives_both_paths_the_same_numbers():
    """The stacked path pads the shorter clients' batches with weight 0: a loss written as
    (per_sample * weight).sum() trains the same model on both paths (float rounding)."""
    _, _, sequential = hooks_on("sequential")
    _, _, stacked = hooks_on("stacked")
    for one, other in zip(sequential, stacked):
        assert max(float((one.upload[n] - other.upload[n]).abs().max()) for n in one.upload) < 1e-5


@pytest.mark.parametrize("attack", ["", "sign_flip"])
def test_server_update_receives_each_upload_with_its_clients_training_windows(
    gsc_root, tmp_path, monkeypatch, attack
):
    """Through the simulator: `uploads` are finish_local's uploads (replaced by a model-poisoning
    attack's), each with its client's n_k under aggregation.weighting=uniform too, which `combine`
    applies; the state a client's hooks see in its second round is its last finish_local's."""
    from fedac.engine.simulator import Simulator

    monkeypatch.setitem(ALGORITHMS._values, "objective_probe", ModelPayload if attack else Probe)
    settings = {
        **tiny_run(gsc_root, tmp_path / "cache"),
        "algorithm": "objective_probe",
        "model.name": "crnn_tiny",
        "train.rounds": 2,
        "train.fraction": 1.0,
        "train.local_epochs": 1,
        "runtime.execution": "sequential",
        "aggregation.weighting": "uniform",
        "attack.kind": attack or "none",
        "attack.fraction": 1.0 if attack else 0.0,
    }
    cfg = load_config(overrides=[f"{k}={v}" for k, v in settings.items()])
    sim = Simulator(cfg, tmp_path / "run", progress=False)
    sim.run()
    algo, names = sim.algorithm, [c.name for c in sim.data.clients]
    n_k = {c.name: c.num_samples for c in sim.data.clients}
    assert algo.seen["clients"] == [names, names]  # self.task.clients: the whole population
    if not attack:  # payload: what broadcast returned this round
        assert algo.seen["tag"][0] == 1.0 and algo.seen["tag"][-1] == 2.0
    finished = algo.seen["finish"]
    assert [f[3] for f in finished] == [0.0] * len(names) + [1.0] * len(names)  # the last state
    for round_idx, uploads in enumerate(algo.seen["uploads"]):
        mine = finished[round_idx * len(names) : (round_idx + 1) * len(names)]
        assert [weight for _, weight in uploads] == [n_k[names[f[2]]] for f in mine]
        same = [all(torch.equal(up[n], f[0][n]) for n in up) for (up, _), f in zip(uploads, mine)]
        assert not any(same) if attack else all(same)
        # combine: the configured rule, weighted as aggregation.weighting says (uniform here)
        combined = algo.seen["combined"][round_idx]
        for name, value in combined.items():
            if value.is_floating_point():
                plain = torch.stack([up[name].double() for up, _ in uploads]).mean(0)
                assert torch.allclose(value.double(), plain, atol=1e-6), name
    assert not math.isnan(sim.state.history[-1]["val_accuracy"])
    assert re.match(r"objective_probe on ", sim.first_line())
