"""`fedac reproduce pfl` (experiments/pfl.py): the clients' figures it reads from a run's
clients.csv (last and best round: mean, 10th percentile, worst-10 % mean), against values worked
out by hand, and the spec's methods and datasets."""

from __future__ import annotations

import json

import pytest

from fedac.config import load_config
from fedac.experiments.catalog import experiment_named
from fedac.experiments.compare import parse_method
from fedac.experiments.pfl import client_figures, write_pfl
from fedac.experiments.spec import Cell, Request


def write_clients(path, rows, column):
    lines = [f"round,client,n_k,holdout,{column}"]
    lines += [f"{r},c{k},10,5,{v}" for r, values in rows.items() for k, v in enumerate(values)]
    (path / "clients.csv").write_text("\n".join(lines) + "\n")


def test_last_and_best_round_of_the_clients_own_models(tmp_path):
    # round 1 has the best mean (0.55), round 3 is the last (0.5)
    rounds = {
        1: [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0],
        2: [0.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5],
        3: [0.2] + [0.5] * 8 + [0.8],
    }
    write_clients(tmp_path, rounds, "own_accuracy")
    out = client_figures(tmp_path)
    assert out["clients_model"] == "own" and out["best_round"] == 1.0
    assert out["clients_best_mean"] == pytest.approx(0.55)
    assert out["clients_best_p10"] == pytest.approx(0.19)  # linear: 0.1 + 0.9 * (0.2 - 0.1)
    assert out["clients_best_worst10"] == pytest.approx(0.1)  # ceil(0.1 * 10) = 1 client
    assert out["clients_last_mean"] == pytest.approx(0.5)
    assert out["clients_last_p10"] == pytest.approx(0.47)  # 0.2 + 0.9 * 0.3
    assert out["clients_last_worst10"] == pytest.approx(0.2)


def test_a_method_without_own_models_reports_the_shared_model(tmp_path):
    write_clients(tmp_path, {5: [0.25, 0.75], 10: [0.5, 0.5]}, "accuracy")
    out = client_figures(tmp_path)
    assert out["clients_model"] == "shared" and out["best_round"] == 5.0
    assert out["clients_last_mean"] == pytest.approx(0.5)
    assert out["clients_best_worst10"] == pytest.approx(0.25)


def test_the_spec_runs_every_method_on_both_stand_ins():
    spec = experiment_named("pfl")
    algorithms = {m.split("=", 1)[1].split(":")[0] for m in spec.methods}
    assert {"fedavg", "fedprox", "fedmlac", "fedbn", "fedper", "fedrep", "lgfedavg", "local"} <= (
        algorithms
    )
    assert {"ditto", "apfl", "scaffold", "feddyn", "moon"} <= algorithms
    assert spec.datasets == ("speech_commands", "cremad")
    assert "train.eval_every=1" in spec.protocol  # every round's clients, for the best round


def test_the_writer_reports_each_figure_over_seeds(tmp_path):
    spec = experiment_named("pfl")
    runs = []
    for seed, values in enumerate(([0.2, 0.4], [0.4, 0.6])):
        run_dir = tmp_path / f"FedPer-s{seed}"
        run_dir.mkdir()
        write_clients(run_dir, {10: values}, "own_accuracy")
        runs.append({"seed": seed, "run_dir": str(run_dir), "wall_seconds": 1.0})
    methods = [parse_method("FedPer=fedper")]
    cell = Cell("cremad", "cremad", tmp_path, load_config(), [], methods)
    request = Request(out=tmp_path, seeds=[0, 1])
    write_pfl(spec, request, [cell], {"cremad": {"FedPer": runs}})
    summary = json.loads((tmp_path / "summary.json").read_text())["cremad"]["FedPer"]
    assert summary["clients_last_mean"]["mean"] == pytest.approx(0.4)  # seeds' means 0.3, 0.5
    assert summary["clients_last_worst10"]["mean"] == pytest.approx(0.3)  # 0.2 and 0.4
    assert "accuracy" not in summary  # FedPer has no shared model
    table = (tmp_path / "table.md").read_text()
    assert "| FedPer | 40.00 ± 10.00 |" in table
