"""Every setting the README documents, flipped, changes what it alone should change (issue 15).

EFFECTS maps each documented setting to a check that flips it and asserts an observable effect that
the setting explains: the labels, features and clients the engine builds, the rounds, cohorts,
evaluations and checkpoints of a run, the steps and parameters of a client update (through the
engine's dispatch, so the default stacked path), and which clients shape the server's aggregate.
`test_every_documented_setting_has_an_effect_check` parses the README, so a newly documented setting
fails until it gets a row here.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from fedac.algorithms import build_algorithm
from fedac.algorithms.base import ClientData, Task
from fedac.algorithms.fedopt import server_step
from fedac.config import load_config
from fedac.data.partition import partition
from fedac.data.registry import dataset_spec
from fedac.engine import run as run_mod  # the run skeleton saves the checkpoints
from fedac.engine.data import build_federated_data
from fedac.engine.execution import run_clients
from fedac.engine.simulator import Simulator
from fedac.models import build_model
from fedac.settings.fedopt import FedOptConfig
from fedac.training.device import nbytes
from helpers import tiny_run

pytestmark = pytest.mark.usefixtures("one_thread")
README = Path(__file__).resolve().parents[2] / "README.md"


# --- probes ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def build(gsc_root, tmp_path_factory):
    """FederatedData of the session GSC tree (6 training speakers x 70 clips) under extra
    settings."""
    cache = tmp_path_factory.mktemp("effects_cache")

    @functools.cache
    def built(*overrides: str):
        cfg = load_config(
            overrides=[f"data.root={gsc_root}", f"data.cache_dir={cache}", *overrides]
        )
        return cfg, build_federated_data(cfg, progress=False)

    return built


@pytest.fixture(scope="module")
def run(build, gsc_root, tmp_path_factory):
    """A tiny FedAvg run on the base data: (results, rounds trained, rounds checkpointed)."""
    base = tiny_run(gsc_root, None)

    def go(*overrides: str, rounds: int = 3):
        settings = {**base, "train.rounds": rounds, "train.local_epochs": 1}
        cfg = load_config(overrides=[f"{k}={v}" for k, v in settings.items()] + list(overrides))
        sim = Simulator(cfg, tmp_path_factory.mktemp("effects_run"), build()[1], progress=False)
        trained, saved = [], []
        real_round, real_save = sim.run_round, run_mod.save_checkpoint
        sim.run_round = lambda state, r: trained.append(r) or real_round(state, r)
        run_mod.save_checkpoint = lambda d, state, *rest: (
            saved.append(state.round) or real_save(d, state, *rest)
        )
        try:
            return sim.run(), trained, saved
        finally:
            run_mod.save_checkpoint = real_save

    return go


FEATURES, FRAMES, CLASSES = 8, 12, 3


def clients(sizes=(10, 7)) -> list[ClientData]:
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


# Dropout off so that updates of different algorithms can be compared exactly; one batch per client
# unless a row asks for more.
ALGO_BASE = [
    "model.dropout=0",
    "model.name=crnn_tiny",
    "model.client_model=crnn_tiny",
    "fedmlac.plugin_model=crnn_tiny",
    "train.batch_size=16",
    "train.local_epochs=1",
    "train.momentum=0.0",
    "train.lr=0.1",
]


def algorithm(*overrides: str):
    cfg = load_config(overrides=[*ALGO_BASE, *overrides])
    return build_algorithm(cfg, Task(FEATURES, CLASSES, [c.name for c in clients()]))


def update(*overrides: str, payload: dict | None = None, payload_shift: float = 0.0):
    """One round of client updates through the engine's dispatch (stacked where it can be), from
    `payload` or the algorithm's initial global model moved by `payload_shift`."""
    algo = algorithm(*overrides)
    datas = clients()
    if payload is None:
        payload = {k: v + payload_shift for k, v in algo.broadcast(algo.init_server()).items()}
    states = [algo.init_client_state(d.name) for d in datas]
    return payload, run_clients(algo, payload, states, datas, 1, 0)


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def num_params(params: dict) -> int:
    return sum(v.numel() for v in params.values() if v.is_floating_point())


def arch_size(name: str) -> int:
    return num_params(build_model(name, FEATURES, CLASSES).state_dict())


# Ten clients, one coordinate each: client i is d_i away on its own coordinate of the weight, and on
# its own coordinate of the bias by the reversed offsets, so the outliers of the two tensors differ.
OFFSETS = [0.01, 1, 2, 3, 4, 5, 6, 7, 100, 200]


def outlier_uploads(nudge: int | None = None, name: str | None = None) -> list[tuple[dict, int]]:
    uploads = []
    for i in range(10):
        params = {
            "lin.weight": torch.zeros(10, dtype=torch.float64),
            "lin.bias": torch.zeros(10, dtype=torch.float64),
        }
        params["lin.weight"][i] = OFFSETS[i]
        params["lin.bias"][i] = OFFSETS[9 - i]
        if i == nudge:
            params[name][i] += 1e-3
        uploads.append((params, 5))
    return uploads


def shapers(*overrides: str) -> dict[str, set[int]]:
    """Per tensor, the clients whose upload moves the aggregate (a tiny nudge keeps every ranking).
    LPA prunes per tensor unless a row sets `aggregation.layer_unit`."""
    algo = algorithm("aggregation.layer_unit=tensor", *overrides)
    server = {**algo.init_server(), "params": outlier_uploads()[0][0]}
    base = algo.server_update(server, outlier_uploads(), 1)[0]["params"]
    out: dict[str, set[int]] = {"lin.weight": set(), "lin.bias": set()}
    for name in out:
        for k in range(10):
            nudged = algo.server_update(server, outlier_uploads(k, name), 1)[0]["params"]
            if not torch.equal(nudged[name], base[name]):
                out[name].add(k)
    return out


# --- data: the tensors the engine builds ----------------------------------------------------------


def _truth_by_client(cfg, data):
    splits = partition(
        data.manifest, cfg.data, cfg.seed, dataset_spec(cfg.dataset).default_partition
    )
    labels = [c.label for c in data.manifest.clips]
    return {s.name: ([labels[i] for i in s.train], [labels[i] for i in s.holdout]) for s in splits}


def label_error(build, run):
    cfg, clean = build()
    _, noisy = build("data.label_error=0.3")
    truth = _truth_by_client(cfg, clean)
    flipped = total = 0
    for c_clean, c_noisy in zip(clean.clients, noisy.clients):
        train_truth, holdout_truth = truth[c_clean.name]
        # one 1 s window per clip: labels line up with clips
        assert c_clean.y.tolist() == train_truth
        assert torch.equal(c_noisy.x, c_clean.x)
        flipped += int((c_noisy.y != c_clean.y).sum())
        total += len(train_truth)
        # the local hold-out keeps its true labels
        assert c_noisy.holdout_y.tolist() == c_clean.holdout_y.tolist() == holdout_truth
    # 6 x 56 training labels at rate 0.3: binomial std 0.025
    assert abs(flipped / total - 0.3) < 0.08, flipped / total
    for split in ("val", "test"):
        assert torch.equal(getattr(noisy, split).labels, getattr(clean, split).labels)
    # each client draws its own flips
    assert (
        len({tuple((n.y != c.y).tolist()[:40]) for n, c in zip(noisy.clients, clean.clients)}) > 1
    )


def snr_db(build, run):
    _, clean = build()
    _, noisy = build("data.snr_db=20")
    for c_clean, c_noisy in zip(clean.clients, noisy.clients):
        assert torch.equal(c_noisy.y, c_clean.y) and torch.equal(
            c_noisy.holdout_y, c_clean.holdout_y
        )
        assert not torch.allclose(c_noisy.x, c_clean.x, atol=1e-2)
    for split in ("val", "test"):  # training and test audio both get noise
        assert torch.equal(getattr(noisy, split).labels, getattr(clean, split).labels)
        assert not torch.allclose(getattr(noisy, split).x, getattr(clean, split).x, atol=1e-2)
    # noise at 20 dB moves features less than at 0 dB
    _, louder = build("data.snr_db=0")
    assert (louder.test.x - clean.test.x).abs().mean() > (noisy.test.x - clean.test.x).abs().mean()


def features_kind(build, run):
    _, mfcc = build()
    _, logmel = build("features.kind=logmel")
    assert logmel.test.x.shape == mfcc.test.x.shape
    assert not torch.allclose(logmel.test.x, mfcc.test.x, atol=1e-2)
    assert torch.equal(logmel.test.labels, mfcc.test.labels)


def _sizes(data) -> list[int]:
    return [c.num_samples + len(c.holdout_y) for c in data.clients]


def partition_kind(build, run):
    _, natural = build()
    _, iid = build("data.partition=iid", "data.num_clients=4")
    # one client per training speaker
    assert len(natural.clients) == 6 and _sizes(natural) == [70] * 6
    assert len(iid.clients) == 4 and _sizes(iid) == [105] * 4  # 420 training clips split evenly


def num_clients(build, run):
    _, five = build("data.partition=iid", "data.num_clients=5")
    assert len(five.clients) == 5 and _sizes(five) == [84] * 5


def _label_entropy(data) -> float:
    entropies = []
    for c in data.clients:
        p = torch.bincount(c.y, minlength=35).double() / len(c.y)
        entropies.append(float(-(p[p > 0] * p[p > 0].log()).sum()))
    return float(np.mean(entropies))


def dirichlet_alpha(build, run):
    skewed = build(
        "data.partition=dirichlet", "data.num_clients=4", "data.alpha=0.1", "data.min_client_size=5"
    )[1]
    even = build(
        "data.partition=dirichlet", "data.num_clients=4", "data.alpha=100", "data.min_client_size=5"
    )[1]
    assert _label_entropy(skewed) < _label_entropy(even) - 0.5


def min_client_size(build, run):
    settings = ("data.partition=dirichlet", "data.num_clients=10", "data.alpha=0.1")
    loose = _sizes(build(*settings, "data.min_client_size=1")[1])
    strict = _sizes(build(*settings, "data.min_client_size=30")[1])
    assert min(loose) < 30 <= min(strict)


def local_holdout(build, run):
    _, half = build("data.local_holdout=0.5")
    assert [len(c.holdout_y) for c in build()[1].clients] == [14] * 6  # floor(0.2 * 70)
    assert [len(c.holdout_y) for c in half.clients] == [35] * 6 and [
        c.num_samples for c in half.clients
    ] == [35] * 6


def max_clients(build, run):
    _, three = build("data.max_clients=3")
    names = {c.name for c in build()[1].clients}
    assert len(three.clients) == 3 and {c.name for c in three.clients} < names


# --- the run --------------------------------------------------------------------------------------


def rounds(build, run):
    two, trained2, _ = run(rounds=2)
    three, trained3, _ = run(rounds=3)
    assert (two["rounds"], trained2, three["rounds"], trained3) == (2, [1, 2], 3, [1, 2, 3])


def fraction(build, run):
    half, _, _ = run("train.fraction=0.5")
    full, _, _ = run("train.fraction=1.0")
    assert [row["clients"] for row in half["history"]] == [3.0] * 3
    assert [row["clients"] for row in full["history"]] == [6.0] * 3


def eval_every(build, run):
    results, _, _ = run("train.eval_every=2", rounds=5)
    assert [row["round"] for row in results["history"]] == [2, 4, 5]


def checkpoint_every(build, run):
    _, _, every = run("train.checkpoint_every=1", rounds=4)
    _, _, second = run("train.checkpoint_every=3", rounds=4)
    assert (every, second) == ([1, 2, 3, 4], [3, 4])


# --- the client update ----------------------------------------------------------------------------


def lr(build, run):
    payload, (slow, *_) = update("train.lr=0.1")
    _, (fast, *_) = update("train.lr=0.2")
    for k, start in payload.items():  # one plain SGD step: the step is proportional to lr
        assert torch.allclose(
            fast.upload[k] - start, 2 * (slow.upload[k] - start), atol=1e-6, rtol=1e-4
        ), k


def momentum(build, run):
    def upload(*overrides: str):
        return update(*overrides)[1][0].upload

    # the first step has no history to carry; from the second step on, momentum moves the update
    assert same(upload("train.momentum=0.9"), upload("train.momentum=0.0"))
    assert not same(
        upload("train.batch_size=5", "train.momentum=0.9"),
        upload("train.batch_size=5", "train.momentum=0.0"),
    )


def local_epochs(build, run):
    _, results = update("train.batch_size=4", "train.local_epochs=2")
    assert [r.metrics["steps"] for r in results] == [6.0, 4.0]  # 2 x ceil(10 / 4), 2 x ceil(7 / 4)


def batch_size(build, run):
    _, results = update("train.batch_size=5")
    assert [r.metrics["steps"] for r in results] == [2.0, 2.0]


def fedprox_mu(build, run):
    two = ("train.batch_size=5", "train.momentum=0.9")
    fedavg = update("algorithm=fedavg", *two)[1][0].upload
    assert same(update("algorithm=fedprox", "fedprox.mu=0", *two)[1][0].upload, fedavg)
    payload, (prox, *_) = update("algorithm=fedprox", "fedprox.mu=5", *two)
    # the proximal term pulls the client towards the round's global model
    distance = lambda p: sum(float((p[k] - payload[k]).square().sum()) for k in payload)  # noqa: E731
    assert distance(prox.upload) < distance(fedavg)


def model_name(build, run):
    _, results = update("model.name=crnn_lite")
    assert num_params(results[0].upload) == arch_size("crnn_lite") != arch_size("crnn_tiny")


def client_model(build, run):
    _, results = update("algorithm=fedmlac", "model.client_model=crnn_mid")
    assert [num_params(r.state) for r in results] == [arch_size("crnn_mid")] * 2
    assert num_params(results[0].upload) == arch_size("crnn_tiny")


def heterogeneous(build, run):
    zoo = ("model.zoo=[crnn_tiny,crnn_lite]",)
    names = [f"c{i}" for i in range(12)]
    for flag, expected in (
        ("false", {arch_size("crnn_tiny")}),
        ("true", {arch_size("crnn_tiny"), arch_size("crnn_lite")}),
    ):
        algo = algorithm("algorithm=fedmlac", f"model.heterogeneous={flag}", *zoo)
        assert {num_params(algo.init_client_state(n)) for n in names} == expected, flag


def plugin_model(build, run):
    _, results = update("algorithm=fedmlac", "fedmlac.plugin_model=crnn_lite")
    assert num_params(results[0].upload) == arch_size("crnn_lite")
    assert num_params(results[0].state) == arch_size("crnn_tiny")


def zoo(build, run):
    algo = algorithm("algorithm=fedmlac", "model.heterogeneous=true", "model.zoo=[crnn_mid]")
    assert {num_params(algo.init_client_state(f"c{i}")) for i in range(12)} == {
        arch_size("crnn_mid")
    }


def fedmlac_ml(build, run):
    # without mutual learning the Plug-in trains on CE alone: FedAvg's update of the same model
    payload, (no_ml, *_) = update("algorithm=fedmlac", "fedmlac.ml=false")
    _, (ml, *_) = update("algorithm=fedmlac", "fedmlac.ml=true")
    _, (fedavg, *_) = update("algorithm=fedavg", payload=payload)
    for k in fedavg.upload:
        assert torch.allclose(no_ml.upload[k], fedavg.upload[k], atol=1e-6), k
    assert not same(ml.upload, no_ml.upload)


def fedmlac_alpha(build, run):
    # alpha = 1: the personalized model ignores its teacher, so another Plug-in leaves it unchanged
    def omega(alpha: float, shift: float):
        return update("algorithm=fedmlac", f"fedmlac.alpha={alpha}", payload_shift=shift)[1][
            0
        ].state

    assert same(omega(1.0, 0.0), omega(1.0, 0.01))
    assert not same(omega(0.5, 0.0), omega(0.5, 0.01))


def _one_batch_split(*flip: str) -> tuple[bool, bool]:
    """(omega unchanged, Plug-in unchanged) after one batch when `flip` is set: settings of the
    Plug-in's step leave the personalized step of that batch alone."""
    _, (base, *_) = update("algorithm=fedmlac")
    _, (flipped, *_) = update("algorithm=fedmlac", *flip)
    return same(base.state, flipped.state), same(base.upload, flipped.upload)


def plugin_ce_weight(build, run):
    assert _one_batch_split("fedmlac.plugin_ce_weight=1.0") == (True, False)


def teacher(build, run):
    assert _one_batch_split("fedmlac.teacher=post_update") == (True, False)


def temperature(build, run):
    assert _one_batch_split("fedmlac.temperature=3.0") == (False, False)
    # the temperature acts through distillation only
    _, (ce, *_) = update("algorithm=fedmlac", "fedmlac.ml=false")
    _, (ce_hot, *_) = update("algorithm=fedmlac", "fedmlac.ml=false", "fedmlac.temperature=3.0")
    assert same(ce.upload, ce_hot.upload) and same(ce.state, ce_hot.state)


# --- the server -----------------------------------------------------------------------------------

EVERYONE = {"lin.weight": set(range(10)), "lin.bias": set(range(10))}


def aggregation_method(build, run):
    assert shapers("aggregation.method=mean") == EVERYONE
    # v_l 0.1, v_h 0.2 of 10: per tensor the smallest and the two largest deviations are dropped
    assert shapers("aggregation.method=lpa", "aggregation.v_l=0.1", "aggregation.v_h=0.2") == {
        "lin.weight": set(range(1, 8)),
        "lin.bias": set(range(2, 9)),
    }


def fedmlac_lpa(build, run):
    lpa = ("algorithm=fedmlac", "aggregation.v_l=0.1", "aggregation.v_h=0.2")
    assert shapers(*lpa, "fedmlac.lpa=true") == {
        "lin.weight": set(range(1, 8)),
        "lin.bias": set(range(2, 9)),
    }
    assert shapers(*lpa, "fedmlac.lpa=false") == EVERYONE


def v_l(build, run):
    keep_low = shapers("aggregation.method=lpa", "aggregation.v_l=0.0", "aggregation.v_h=0.2")
    drop_3 = shapers("aggregation.method=lpa", "aggregation.v_l=0.3", "aggregation.v_h=0.2")
    assert keep_low == {"lin.weight": set(range(0, 8)), "lin.bias": set(range(2, 10))}
    assert drop_3 == {"lin.weight": set(range(3, 8)), "lin.bias": set(range(2, 7))}


def v_h(build, run):
    keep_high = shapers("aggregation.method=lpa", "aggregation.v_l=0.1", "aggregation.v_h=0.0")
    assert keep_high == {"lin.weight": set(range(1, 10)), "lin.bias": set(range(0, 9))}


def layer_unit(build, run):
    lpa = ("aggregation.method=lpa", "aggregation.v_l=0.0", "aggregation.v_h=0.2")
    per_tensor = shapers(*lpa, "aggregation.layer_unit=tensor")
    per_module = shapers(*lpa, "aggregation.layer_unit=module")
    assert per_tensor["lin.weight"] != per_tensor["lin.bias"]
    # one trusted set for the module: the two clients with the largest joint deviation (200) go
    assert per_module["lin.weight"] == per_module["lin.bias"] == set(range(1, 9))


def deviation(build, run):
    # Global model 1; client updates +1, -1, +8, the last after 5x the local steps (80 clips against
    # 10). Raw Eq. 11 prunes that data-rich client; per step it moved like the first (and in its
    # direction).
    def aggregate_with(kind: str) -> float:
        algo = algorithm(
            "aggregation.method=lpa",
            "aggregation.v_l=0.0",
            "aggregation.v_h=0.34",
            f"aggregation.deviation={kind}",
        )
        server = {**algo.init_server(), "params": {"lin.weight": torch.tensor([1.0])}}
        uploads = [
            ({"lin.weight": torch.tensor([v])}, n) for v, n in ((2.0, 10), (0.0, 10), (9.0, 80))
        ]
        return algo.server_update(server, uploads, 1)[0]["params"]["lin.weight"].item()

    assert aggregate_with("raw") == pytest.approx((10 * 2 + 10 * 0) / 20)
    assert aggregate_with("per_step") == pytest.approx((10 * 2 + 80 * 9) / 90)
    assert aggregate_with("cosine") == pytest.approx((10 * 2 + 80 * 9) / 90)


def warmup_rounds(build, run):
    # round 1 of a 1-round warm-up trains on CE alone, exactly as `w/o ML`
    _, (warm, *_) = update("algorithm=fedmlac", "fedmlac.warmup_rounds=1")
    _, (ce, *_) = update("algorithm=fedmlac", "fedmlac.ml=false")
    _, (mutual, *_) = update("algorithm=fedmlac", "fedmlac.warmup_rounds=0")
    assert same(warm.upload, ce.upload) and same(warm.state, ce.state)
    assert not same(warm.upload, mutual.upload)


def min_visits(build, run):
    # 4 rounds, one of the 2 clients a round: 2 expected visits per client
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("fedac.algorithms.fedmlac")
    logger.addHandler(handler)
    try:
        algorithm(
            "algorithm=fedmlac", "train.rounds=4", "train.fraction=0.5", "fedmlac.min_visits=2"
        )
        quiet = len(records)
        algorithm(
            "algorithm=fedmlac", "train.rounds=4", "train.fraction=0.5", "fedmlac.min_visits=3"
        )
    finally:
        logger.removeHandler(handler)
    assert quiet == 0 and len(records) == 1 and "visits" in records[0].getMessage()


def _fedopt(rule: str, overrides: tuple[str, ...]):
    """Two server rounds of the algorithm vs `server_step` with the same values (tested by hand in
    test_fedopt.py): the setting reaches the server optimizer."""
    algo = algorithm(f"algorithm=fed{rule}", *overrides)
    opt = dataclasses.replace(
        FedOptConfig(), **{o.split("=")[0].split(".")[1]: float(o.split("=")[1]) for o in overrides}
    )
    server = algo.init_server()
    expected_params, state = server["params"], {"m": {}, "v": {}}
    for r, shift in ((1, 0.3), (2, -0.1)):
        average = {
            k: v + shift if v.is_floating_point() else v for k, v in server["params"].items()
        }
        server, _ = algo.server_update(server, [(average, 4)], r)
        expected_params, state = server_step(
            rule,
            expected_params,
            {k: v + shift if v.is_floating_point() else v for k, v in expected_params.items()},
            state,
            opt,
        )
    assert same(server["params"], expected_params)
    return server["params"]


def fedopt_setting(rule: str, key: str, value: float):
    def check(build, run):
        assert not same(_fedopt(rule, ()), _fedopt(rule, (f"fedopt.{key}={value}",)))

    return check


def covered_by(module: str, *tests: str):
    """A setting whose effect a dedicated test already checks; the row names those tests."""

    def check(build, run):
        import importlib

        mod = importlib.import_module(module)
        assert all(callable(getattr(mod, name, None)) for name in tests), tests

    return check


def compression_method(build, run):
    def uploaded(*overrides: str) -> float:
        return run(*overrides, rounds=2)[0]["history"][-1]["upload_bytes_total"]

    # top-k 1 %: indices and values of 1 % of the entries, against every dense parameter
    assert uploaded("compression.method=topk", "compression.ratio=0.01") < 0.05 * uploaded()


def model_peft(build, run):
    def sent(peft: str) -> int:
        cfg = load_config(overrides=["model.name=w2v2_tiny", f"model.peft={peft}"])
        algo = build_algorithm(cfg, Task(64, 3, ["c0"]))
        return nbytes(algo.broadcast(algo.init_server()))

    # LoRA: the adapters and the head travel, the frozen encoder does not
    assert sent("lora") < 0.2 * sent("none")


def system_devices(build, run):
    assert "virtual_time_s" not in run(rounds=2)[0]["history"][-1]
    times = [
        row["virtual_time_s"] for row in run("system.devices=synthetic", rounds=2)[0]["history"]
    ]
    assert 0 < times[0] < times[1]


def system_mode(build, run):
    rows = run("system.devices=synthetic", "system.mode=fedbuff", "system.buffer=2", rounds=2)[0][
        "history"
    ]
    # one server update per round, each of the buffer's 2 arrivals; sync rounds have no staleness
    assert [row["arrived"] for row in rows] == [2, 2] and "mean_staleness" in rows[-1]
    assert "mean_staleness" not in run("system.devices=synthetic", rounds=2)[0]["history"][-1]


EFFECTS = {
    "data.label_error": label_error,
    "data.snr_db": snr_db,
    "features.kind": features_kind,
    "data.partition": partition_kind,
    "data.num_clients": num_clients,
    "data.alpha": dirichlet_alpha,
    "data.min_client_size": min_client_size,
    "data.local_holdout": local_holdout,
    "data.max_clients": max_clients,
    "train.rounds": rounds,
    "train.fraction": fraction,
    "train.eval_every": eval_every,
    "train.checkpoint_every": checkpoint_every,
    "train.select": covered_by(
        "test_engine", "test_best_val_selection_never_reads_test", "test_select_last"
    ),
    "train.local_epochs": local_epochs,
    "train.batch_size": batch_size,
    "train.lr": lr,
    "train.momentum": momentum,
    "model.name": model_name,
    "model.heterogeneous": heterogeneous,
    "model.client_model": client_model,
    "model.zoo": zoo,
    "fedmlac.plugin_model": plugin_model,
    "fedmlac.ml": fedmlac_ml,
    "fedmlac.alpha": fedmlac_alpha,
    "fedmlac.temperature": temperature,
    "fedmlac.plugin_ce_weight": plugin_ce_weight,
    "fedmlac.teacher": teacher,
    "fedmlac.lpa": fedmlac_lpa,
    "fedprox.mu": fedprox_mu,
    "aggregation.method": aggregation_method,
    "aggregation.v_l": v_l,
    "aggregation.v_h": v_h,
    "aggregation.layer_unit": layer_unit,
    "aggregation.deviation": deviation,
    "fedmlac.warmup_rounds": warmup_rounds,
    "fedmlac.min_visits": min_visits,
    "fedopt.server_lr": fedopt_setting("adam", "server_lr", 0.05),
    "fedopt.beta1": fedopt_setting("adam", "beta1", 0.5),
    "fedopt.beta2": fedopt_setting("yogi", "beta2", 0.5),
    "fedopt.tau": fedopt_setting("adagrad", "tau", 0.1),
    "fedopt.momentum": fedopt_setting("avgm", "momentum", 0.3),
    "compression.method": compression_method,
    "model.peft": model_peft,
    "system.devices": system_devices,
    "system.mode": system_mode,
}


@pytest.mark.parametrize("setting", list(EFFECTS))
@pytest.mark.slow
def test_setting_has_its_effect(setting, build, run):
    EFFECTS[setting](build, run)


def documented_settings(text: str) -> set[str]:
    """Setting names in the README's "Useful settings" paragraph: `a.b/c/d` names a.b, a.c and
    a.d."""
    paragraph = text.split("Useful settings:", 1)[1].split("\n\n", 1)[0]
    names = set()
    for span in re.findall(r"`([^`]+)`", paragraph):
        head = span.split("=", 1)[0]
        if "." not in head:
            continue
        section, keys = head.split(".", 1)
        names |= {f"{section}.{key}" for key in keys.split("/")}
    return names


def test_every_documented_setting_has_an_effect_check():
    documented = documented_settings(README.read_text())
    assert {
        "data.label_error",
        "fedmlac.lpa",
        "train.momentum",
        "aggregation.layer_unit",
    } <= documented  # parser sanity
    assert documented - set(EFFECTS) == set(), "documented settings without an effect check"
    cfg = load_config()
    for name in EFFECTS:  # every row names a real setting
        section, key = name.split(".")
        assert hasattr(getattr(cfg, section), key), name
