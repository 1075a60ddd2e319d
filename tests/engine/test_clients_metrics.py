"""Every client, not only their mean (issue 57): the per-client metrics (clients.csv), their spreads
and cohort counts in results.json, the bytes each client receives and uploads (metrics.csv), and the
pictures of them (clients.png, confusion.png)."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch
from test_earlyexit import voxceleb_root  # noqa: F401 (a fixture: the synthetic VoxCeleb1 tree)

from fedac.config import load_config
from fedac.engine.clients import ByteLedger, spreads
from fedac.engine.data import build_federated_data
from fedac.engine.evaluation import Evaluator
from fedac.engine.report import plot_clients, plot_confusion
from fedac.engine.simulator import Simulator
from fedac.engine.state import RunState
from fedac.models import build_model
from fedac.training.device import nbytes
from fedac.training.metrics import classification_metrics, confusion, confusion_metrics, spread
from helpers import tiny_run

pytestmark = pytest.mark.usefixtures("one_thread")


# --- the numbers, against independent references --------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_confusion_metrics_equal_scikit_learns(seed):
    rng = np.random.default_rng(seed)
    classes = 7
    # two classes never true: predicted-only classes count in macro-F1
    y_true = rng.integers(0, classes - 2, 40)
    y_pred = np.where(rng.random(40) < 0.5, y_true, rng.integers(0, classes, 40))
    ours = confusion_metrics(confusion(y_true, y_pred, classes))
    reference = classification_metrics(y_true, y_pred)
    assert ours.keys() == reference.keys()
    for key in ours:
        assert ours[key] == pytest.approx(reference[key], rel=1e-12, abs=1e-12), key


def test_confusion_counts_by_hand():
    assert confusion([0, 0, 1, 2], [0, 1, 1, 1], 3).tolist() == [[1, 1, 0], [0, 1, 0], [0, 1, 0]]
    assert all(math.isnan(v) for v in confusion_metrics(np.zeros((3, 3))).values())


def test_spread_by_hand():
    # 11 finite, one NaN skipped
    values = [0.9, 0.1, 0.5, math.nan, 0.3, 0.7, 0.2, 0.8, 0.4, 0.6, 1.0, 0.0]
    weights = [1, 3, 1, 100, 1, 1, 1, 1, 1, 1, 1, 1]
    got = spread(values, weights)
    finite = sorted(v for v in values if not math.isnan(v))
    assert got["mean"] == pytest.approx(sum(finite) / 11)
    assert got["weighted_mean"] == pytest.approx((sum(finite) + 2 * 0.1) / 13)  # 0.1 weighs 3
    assert got["std"] == pytest.approx(
        float(np.sqrt(np.mean((np.array(finite) - sum(finite) / 11) ** 2)))
    )
    # 11 values 0.0, 0.1, ..., 1.0: linear-interpolation percentiles fall on the grid
    assert (got["p10"], got["p50"], got["p90"]) == pytest.approx((0.1, 0.5, 0.9))
    assert got["worst10_mean"] == pytest.approx((0.0 + 0.1) / 2)  # ceil(0.1 x 11) = 2 lowest
    assert all(math.isnan(v) for v in spread([math.nan]).values())


def test_percentiles_and_worst_clients_rank_only_clients_with_enough_held_out_clips():
    """eval.min_client_clips: the mean and std over every scored client, the percentiles and the
    worst-10 % mean over those holding at least that many held-out clips (by hand: numpy over the
    kept values); at 1 every client counts."""
    holdout = [1, 1, 2, 3, 4, 4, 5, 8, 9, 12, 20, 30]
    accuracy = [0.0, 0.0, 0.5, 1 / 3, 0.25, 0.5, 0.6, 0.75, 2 / 3, 0.5, 0.85, 0.9]
    rows = [
        {"round": 1, "client": f"c{k}", "n_k": 5 * h, "holdout": h, "accuracy": a}
        for k, (h, a) in enumerate(zip(holdout, accuracy))
    ]
    kept = sorted(a for h, a in zip(holdout, accuracy) if h >= 4)
    out = spreads(rows, min_clips=4)["accuracy"]
    assert (out["clients"], out["ranked_clients"]) == (12, 8)
    assert out["mean"] == pytest.approx(np.mean(accuracy))  # every client
    assert out["std"] == pytest.approx(np.std(accuracy))
    assert [out["p10"], out["p50"], out["p90"]] == pytest.approx(np.percentile(kept, [10, 50, 90]))
    assert out["worst10_mean"] == pytest.approx(kept[0])  # ceil(0.1 x 8) = 1 client
    every = spreads(rows, min_clips=1)["accuracy"]
    assert every["ranked_clients"] == 12 and every["worst10_mean"] == pytest.approx(0.0)
    assert every["mean"] == out["mean"] and every["p50"] != out["p50"]


def test_byte_ledger_counts_the_tensors_it_is_given():
    state = RunState("fedavg", None)
    ledger = ByteLedger(state)
    payload = {"w": torch.zeros(10, 3), "b": torch.zeros(3, dtype=torch.float64)}  # 120 + 24 bytes
    row = ledger.round(
        payload, {"a": [torch.zeros(5, dtype=torch.int8)], "b": {"x": torch.zeros(2, 2)}}
    )
    assert row == {
        "download_bytes": 288.0,
        "upload_bytes": 21.0,
        "upload_bytes_per_client": 10.5,
        "download_bytes_total": 288.0,
        "upload_bytes_total": 21.0,
    }
    # kept in the state
    row = ByteLedger(state).round(payload, {"a": [torch.zeros(1, dtype=torch.int8)]})
    assert (row["download_bytes_total"], row["upload_bytes_total"]) == (432.0, 22.0)
    assert state.bytes.clients == {"a": [288, 6], "b": [144, 16]}
    # a checkpoint made before the ledger existed: its earlier rounds' bytes are unknown, not zero
    assert math.isnan(
        ByteLedger(RunState("fedavg", None, round=3)).round(payload, {"a": payload})[
            "upload_bytes_total"
        ]
    )


# --- a run ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("clients_cache")


@pytest.fixture
def cfg_for(gsc_root, cache_dir):
    def make(**settings):
        base = {
            **tiny_run(gsc_root, cache_dir),
            "train.rounds": 2,
            "train.lr": 0.1,
            "train.batch_size": 16,
        }
        return load_config(None, [f"{k}={v}" for k, v in {**base, **settings}.items()])

    return make


def rows_of(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_a_run_writes_every_clients_scores_spreads_and_bytes(cfg_for, tmp_path):
    cfg = cfg_for(**{"train.select": "last"})
    sim = Simulator(cfg, tmp_path, progress=False)
    results = sim.run()
    held = [c for c in sim.data.clients if len(c.holdout_y)]
    assert held, "the fixture's clients hold back clips"
    rows = rows_of(tmp_path / "clients.csv")
    # one row per client with held-out windows per evaluation (every round here)
    assert [(int(r["round"]), r["client"]) for r in rows] == [
        (t, c.name) for t in (1, 2) for c in held
    ]
    assert {r["client"]: int(r["n_k"]) for r in rows} == {c.name: c.num_samples for c in held}
    assert {r["client"]: int(r["holdout"]) for r in rows} == {
        c.name: len(c.holdout_y) for c in held
    }
    # the last evaluation's rows are the final (select=last) model's: the same mean as results' own
    # figure (computed client by client there, in batches across clients here: equal unless float
    # rounding of the logits flips an arg-max, which these runs never do)
    last = [float(r["accuracy"]) for r in rows if r["round"] == "2"]
    assert np.mean(last) == pytest.approx(results["final"]["client_accuracy_mean"], abs=1e-12)
    spreads = json.loads((tmp_path / "results.json").read_text())["per_client"]
    acc = spreads["spreads"]["accuracy"]
    assert acc["mean"] == pytest.approx(np.mean(last), abs=1e-12)
    assert acc["weighted_mean"] == pytest.approx(
        np.average(last, weights=[c.num_samples for c in held]), abs=1e-12
    )
    assert acc["worst10_mean"] == pytest.approx(min(last), abs=1e-12)  # < 10 clients: the worst one
    assert acc["p10"] <= acc["p50"] <= acc["p90"]
    assert (spreads["evaluated"], spreads["without_holdout"]) == (
        len(held),
        len(sim.data.clients) - len(held),
    )
    # bytes: each cohort client received the model and uploaded it (FedAvg), counted per round and
    # in total
    model_bytes = nbytes(
        dict(
            build_model(
                "crnn_tiny", sim.data.task.num_features, sim.data.task.num_classes
            ).state_dict()
        )
    )
    history = rows_of(tmp_path / "metrics.csv")
    for row in history:
        assert float(row["upload_bytes_per_client"]) == model_bytes
        assert (
            float(row["upload_bytes"])
            == float(row["download_bytes"])
            == model_bytes * float(row["clients"])
        )
    assert float(history[-1]["upload_bytes_total"]) == sum(
        float(r["upload_bytes"]) for r in history
    )
    trained = {c: up for c, (down, up) in sim.state.bytes.clients.items()}
    assert {r["client"]: int(r["bytes_up"]) for r in rows if r["round"] == "2"} == {
        c.name: trained.get(c.name, 0) for c in held
    }
    assert sum(trained.values()) == float(history[-1]["upload_bytes_total"])
    for picture in ("clients.png", "confusion.png"):
        assert (tmp_path / picture).stat().st_size > 10_000


def test_fedmlac_uploads_only_its_plugin(cfg_for, tmp_path, monkeypatch):
    """FedMLAC's clients train CRNN-Lite but send only the CRNN-Tiny Plug-in: fewer bytes than
    FedAvg's CRNN-Lite per client, and exactly the Plug-in's. Its round's local_accuracy comes from
    the clients.csv rows: each own model is scored once an evaluation, and the figure equals scoring
    them anew."""
    per_client, memory = {}, {}
    own_models = []
    real = Evaluator.personalized_models
    monkeypatch.setattr(
        Evaluator,
        "personalized_models",
        lambda ev, *a: (own_models.append(1) or pair for pair in real(ev, *a)),
    )
    for name, settings in {
        "fedavg": {"model.name": "crnn_lite"},
        "fedmlac": {
            "algorithm": "fedmlac",
            "model.client_model": "crnn_lite",
            "fedmlac.plugin_model": "crnn_tiny",
        },
    }.items():
        sim = Simulator(cfg_for(**{"train.rounds": 1, **settings}), tmp_path / name, progress=False)
        own_models.clear()
        results = sim.run()
        if name == "fedmlac":
            trained = len(sim.state.visits)
            # round 1's evaluation, then results' own-model test scores and local figure, then
            # per_client
            assert len(own_models) == 4 * trained
            # scored anew, client by client
            local = sim.evaluator.personalized_local_accuracy(sim.state)
            history = rows_of(tmp_path / name / "metrics.csv")
            assert float(history[0]["local_accuracy"]) == pytest.approx(np.mean(local), abs=1e-12)
            assert results["final"]["personalized_local_accuracy_mean"] == pytest.approx(
                np.mean(local), abs=1e-12
            )
        per_client[name] = float(
            rows_of(tmp_path / name / "metrics.csv")[0]["upload_bytes_per_client"]
        )
        memory[name] = results["client_state"]
        task = sim.data.task
    tiny = nbytes(dict(build_model("crnn_tiny", task.num_features, task.num_classes).state_dict()))
    assert per_client["fedmlac"] == tiny < per_client["fedavg"]
    # the clients' own states: a CRNN-Lite per trained FedMLAC client, none for FedAvg
    lite = nbytes(dict(build_model("crnn_lite", task.num_features, task.num_classes).state_dict()))
    assert memory["fedavg"]["bytes_total"] == 0
    assert memory["fedmlac"]["bytes_per_client"] == lite
    assert memory["fedmlac"]["bytes_total"] == lite * memory["fedmlac"]["clients_holding"] > 0
    # a personalized method's clients.csv has the clients' own models next to the shared model
    header = rows_of(tmp_path / "fedmlac" / "clients.csv")[0]
    assert {"accuracy", "own_accuracy", "own_macro_f1", "own_uar"} <= header.keys()


def test_resumed_run_writes_the_uninterrupted_runs_clients_csv(cfg_for, tmp_path):
    cfg = cfg_for(**{"train.rounds": 4, "train.checkpoint_every": 2})
    data = build_federated_data(cfg, progress=False)
    Simulator(cfg, tmp_path / "straight", data, progress=False).run()
    # killed after round 3
    Simulator(cfg, tmp_path / "resumed", data, progress=False).run(stop_after=3)
    assert {r["round"] for r in rows_of(tmp_path / "resumed" / "clients.csv")} == {"1", "2", "3"}
    # from round 2's checkpoint
    Simulator(cfg, tmp_path / "resumed", data, progress=False).run(resume=True)
    straight, resumed = (
        rows_of(tmp_path / "straight" / "clients.csv"),
        rows_of(tmp_path / "resumed" / "clients.csv"),
    )
    assert resumed == straight  # round 3's rows written once, not twice
    assert {r["round"] for r in resumed} == {"1", "2", "3", "4"}
    history = [
        {k: v for k, v in r.items() if k != "wall_seconds"}
        for r in rows_of(tmp_path / "straight" / "metrics.csv")
    ]
    again = [
        {k: v for k, v in r.items() if k != "wall_seconds"}
        for r in rows_of(tmp_path / "resumed" / "metrics.csv")
    ]
    assert again == history  # the byte totals continue from the checkpoint


def test_no_holdout_is_counted_with_its_reason(cfg_for, tmp_path):
    results = Simulator(
        cfg_for(**{"train.rounds": 1, "data.local_holdout": 0}), tmp_path, progress=False
    ).run()
    counts = results["per_client"]
    assert counts["evaluated"] == 0 and counts["without_holdout"] == results["clients"] > 0
    assert "data.local_holdout=0" in counts["without_holdout_reason"]
    assert not (tmp_path / "clients.csv").exists()
    assert (tmp_path / "clients.png").stat().st_size > 5_000  # says why there is nothing to draw


# --- the pictures ---------------------------------------------------------------------------------


def _pixels(path):
    import matplotlib.image

    return matplotlib.image.imread(path)


def test_pictures_are_drawn_and_follow_their_numbers(tmp_path):
    rows = [
        {"round": t, "client": f"c{k}", "n_k": 10, "accuracy": (k + t) / 12, "own_accuracy": k / 12}
        for t in (1, 2, 3)
        for k in range(8)
    ]
    plot_clients(tmp_path, rows, "title")
    first = _pixels(tmp_path / "clients.png")
    assert first.std() > 0.01  # not blank
    plot_clients(tmp_path, [{**r, "accuracy": r["accuracy"] / 2} for r in rows], "title")
    assert not np.array_equal(first, _pixels(tmp_path / "clients.png"))
    counts = [[5, 1, 0], [0, 6, 0], [2, 0, 4]]
    plot_confusion(tmp_path, counts, ["yes", "no", "up"], "title")
    first = _pixels(tmp_path / "confusion.png")
    assert first.std() > 0.01
    plot_confusion(tmp_path, [[0, 6, 0], [0, 6, 0], [2, 0, 4]], ["yes", "no", "up"], "title")
    assert not np.array_equal(first, _pixels(tmp_path / "confusion.png"))


def test_an_early_exit_client_at_layer_3_uploads_fewer_bytes_than_one_at_12(
    voxceleb_root, tmp_path
):
    """Early exit, hetero: half the clients stop at exit 3, half at 12; each uploads only what it
    trained."""
    settings = {
        "algorithm": "earlyexit",
        "dataset": "voxceleb1",
        "data.root": voxceleb_root,
        "data.cache_dir": tmp_path / "cache",
        "data.num_clients": 4,
        "model.name": "w2v2_tiny",
        "train.local_epochs": 1,
        "train.batch_size": 4,
        "train.fraction": 1.0,
        "train.rounds": 1,
        "earlyexit.mode": "hetero",
        "earlyexit.low_depth": 3,
        "earlyexit.high_depth": 12,
        "data.local_holdout": 0.5,
    }
    sim = Simulator(
        load_config(overrides=[f"{k}={v}" for k, v in settings.items()]),
        tmp_path / "run",
        progress=False,
    )
    sim.run()
    depths = sim.algorithm.depths  # layers of w2v2_tiny: exit 3 -> 1, exit 12 -> 4
    uploaded = {client: up for client, (down, up) in sim.state.bytes.clients.items()}
    shallow = {uploaded[c] for c, d in depths.items() if d == 1 and c in uploaded}
    deep = {uploaded[c] for c, d in depths.items() if d == 4 and c in uploaded}
    assert shallow and deep and max(shallow) < min(deep)
    received = {down for down, up in sim.state.bytes.clients.values()}
    # every client received the whole model
    assert len(received) == 1 and received.pop() > min(deep)
    # clients.csv: each client's own exit and the shared model at every exit ("accuracy": at
    # eval_exit)
    rows = rows_of(tmp_path / "run" / "clients.csv")
    assert rows and {r["client"]: int(r["depth"]) for r in rows} == {
        r["client"]: depths[r["client"]] for r in rows
    }
    exits = sim.algorithm.exits
    for r in rows:
        assert all(f"exit{d}_accuracy" in r for d in exits)
        assert r["accuracy"] == r[f"exit{sim.algorithm.eval_exit}_accuracy"]


def test_compare_adds_the_worst_clients_column_and_plots_accuracy_against_upload(
    gsc_root, tmp_path, capsys
):
    from fedac.cli import main

    out = tmp_path / "cmp"
    assert (
        main(
            [
                "compare",
                "--quiet",
                "--seeds",
                "0",
                "--rounds",
                "2",
                "--out",
                str(out),
                "--worst",
                "--plot-bytes",
                "--method",
                "A=fedavg",
                "--method",
                "B=fedmlac:fedmlac.plugin_model=crnn_tiny,model.client_model=crnn_tiny",
                "--set",
                f"data.root={gsc_root}",
                "--set",
                "model.name=crnn_tiny",
                "--set",
                "train.local_epochs=1",
            ]
        )
        == 0
    )
    table = (out / "table.md").read_text().splitlines()
    header = [c.strip() for c in table[0].strip("|").split("|")]
    assert header[-2:] == [
        "Shared model: worst 10 % clients' held-out acc.",
        "Own models: worst 10 % clients' held-out acc.",
    ]
    for line, label in zip(table[2:], ("A", "B")):
        results = json.loads((out / f"{label}-s0" / "results.json").read_text())
        spreads = results["per_client"]["spreads"]
        cells = [c.strip() for c in line.strip("|").split("|")]
        # one seed: the mean alone, no spread
        assert cells[-2] == f"{100 * spreads['accuracy']['worst10_mean']:.2f}"
        assert cells[-1] == (
            "n/a (fedavg keeps no own model per client)"
            if label == "A"
            else f"{100 * spreads['own_accuracy']['worst10_mean']:.2f}"
        )
    assert _pixels(out / "accuracy_vs_upload.png").std() > 0.01
    assert "accuracy_vs_upload.png" in capsys.readouterr().out
    assert not (out / "accuracy_curves.png").exists()  # off the clock, drawn only when asked


@pytest.fixture(scope="module")
def tones(tmp_path_factory):
    """Speech Commands tones for the zero-shot driver: every word one clip per speaker, the 10 task
    words six."""
    from fedac.data.gsc import WORDS_10
    from gsc_fixture import make_gsc_tree

    root = tmp_path_factory.mktemp("zs_gsc")
    make_gsc_tree(root, speakers=8, clips=1)
    return make_gsc_tree(root, speakers=8, words=WORDS_10, clips=6)


def test_zeroshot_writes_one_row_per_user_and_round_with_its_bytes(tones, tmp_path):
    from fedac.engine.zeroshot import ZeroShotDriver

    cfg = load_config(
        overrides=[
            "algorithm=zeroshot",
            f"data.root={tones}",
            f"data.cache_dir={tmp_path / 'cache'}",
            "zeroshot.scale=0.05",
            "zeroshot.rounds=2",
            "zeroshot.di_steps=20",
            "zeroshot.di_per_class=10",
            "train.local_epochs=1",
        ]
    )
    runner = ZeroShotDriver(cfg, tmp_path / "run", progress=False)
    results = runner.run()
    rows = rows_of(tmp_path / "run" / "clients.csv")
    users = list(runner.scenario.users)
    assert [(int(r["round"]), r["client"]) for r in rows] == [(t, u) for t in (1, 2) for u in users]
    for r in rows:
        history = results["history"][int(r["round"]) - 1]
        for key in ("local_acc", "global_acc", "increase"):
            assert float(r[key]) == pytest.approx(history[f"{key}/{r['client']}"])
        assert int(r["bytes_up"]) > 0 and int(r["bytes_down"]) >= 0
    last = [float(r["global_acc"]) for r in rows if r["round"] == "2"]
    assert results["per_client"]["spreads"]["global_acc"]["mean"] == pytest.approx(np.mean(last))
    assert results["history"][-1]["upload_bytes_total"] == sum(
        int(r["bytes_up"]) for r in rows if r["round"] == "2"
    )
    assert _pixels(tmp_path / "run" / "clients.png").std() > 0.01


def test_batched_scoring_across_clients_equals_scoring_each_client_alone():
    from fedac.engine.clients import batched_holdout_metrics, holdout_metrics
    from fedac.training.types import ClientData

    torch.manual_seed(0)
    model = build_model("crnn_tiny", 40, 5)
    clients = [
        ClientData(
            f"c{k}",
            torch.zeros(0, 40, 101),
            torch.zeros(0, dtype=torch.long),
            torch.randn(n, 40, 101),
            torch.randint(0, 5, (n,)),
        )
        for k, n in enumerate((3, 0, 7, 1, 4))
    ]
    alone = {c.name: holdout_metrics(model, c, 5, 512) for c in clients if len(c.holdout_y)}
    for batch in (2, 4, 512):  # flushes inside a client group, between groups, and once at the end
        batched = batched_holdout_metrics(model, clients, 5, batch, "cpu")
        assert batched.keys() == alone.keys()
        for name, scores in alone.items():
            assert batched[name] == pytest.approx(scores, abs=1e-12), (batch, name)


def test_the_final_table_shows_the_clients_percentiles():
    from fedac.engine.report import final_table

    spreads = {"accuracy": {**spread([0.1, 0.5, 0.9, 0.7]), "clients": 4}}
    results = {
        "algorithm": "fedavg",
        "dataset": "d",
        "rounds": 1,
        "wall_seconds": 1.0,
        "final": {
            "has_global_model": True,
            "accuracy": 0.5,
            "macro_f1": 0.4,
            "uar": 0.5,
            "selected_round": 1,
            "client_accuracy_mean": 0.55,
            "client_accuracy_std": 0.3,
        },
        "per_client": {"spreads": spreads},
    }
    row = next(line for line in final_table(results).splitlines() if "worst 10 %" in line)
    assert row.split("  ")[-1].strip() == "0.2200 / 0.6000 / 0.1000 (4 clients)"
    del results["per_client"]  # a run written before per-client spreads: no row, no NaN
    assert "worst 10 %" not in final_table(results)
