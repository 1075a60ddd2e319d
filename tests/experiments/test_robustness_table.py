"""`fedac reproduce robustness` (issue 13): the grid, its outputs and its resumption."""

from __future__ import annotations

import csv
import json

import pytest

from fedac.cli import main
from fedac.engine import simulator
from fedac.experiments import robustness
from fedac.experiments.robustness import grid_methods, server_f, write_outputs

pytestmark = pytest.mark.usefixtures("one_thread")


def test_server_f_is_the_row_attacker_count_capped_for_bulyan():
    # (24 - 3) // 4
    assert server_f(0.3, 24, "Multi-Krum") == 7 and server_f(0.3, 24, "Bulyan") == 5
    assert server_f(0.0, 24, "Multi-Krum") == 1 and server_f(0.1, 24, "median") == 2
    methods = {m.label: m for m in grid_methods(["FedAvg", "FedMLAC"], ["mean", "LPA"], 0.2, 24)}
    assert "fedmlac.lpa=false" in methods["FedMLAC mean"].overrides
    assert "aggregation.method=lpa" in methods["FedAvg LPA"].overrides


@pytest.mark.slow
def test_reproduce_robustness_writes_table_csv_heatmap_and_resumes(
    gsc_root, tmp_path, capsys, monkeypatch
):
    out = tmp_path / "rob"
    argv = [
        "reproduce",
        "robustness",
        "--seeds",
        "0",
        "--rounds",
        "1",
        "--methods",
        "FedAvg",
        "--attacks",
        "backdoor",
        "--fractions",
        "0.3",
        "--aggregators",
        "mean",
        "median",
        f"--set=data.root={gsc_root}",
        "--set=model.name=crnn_tiny",
        "--set=train.local_epochs=1",
        "--out",
        str(out),
        "--quiet",
    ]
    assert main(argv) == 0
    table = (out / "table.md").read_text()
    assert (
        "| clean |" in table and "| backdoor 30% |" in table and "| Row | mean | median |" in table
    )
    assert (
        "## FedAvg: Backdoor attack success rate" in table
        and "Command: `fedac reproduce robustness" in table
    )
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert [(r["row"], r["aggregator"]) for r in rows] == [
        ("clean", "mean"),
        ("clean", "median"),
        ("backdoor 30%", "mean"),
        ("backdoor 30%", "median"),
    ]
    assert rows[2]["malicious_clients"] == "2" and rows[2]["attack_success_rate"] != ""
    assert (out / "heatmap.png").stat().st_size > 1000
    summary = json.loads((out / "summary.json").read_text())
    mean, std, n = summary["cells"]["backdoor 30%"]["FedAvg"]["median"]["attack_success_rate"]
    assert n == 1 and std == 0 and mean == pytest.approx(float(rows[3]["attack_success_rate"]))
    assert summary["runs"] == {"FedAvg": 4}
    assert summary["run_seconds"]["FedAvg"] == pytest.approx(
        sum(float(r["wall_seconds"]) for r in rows)
    )
    # The clean row measures the trigger's baseline rate (no client poisoned).
    assert rows[0]["malicious_clients"] == "0" and rows[0]["attack_success_rate"] != ""
    success_rows = table.split("success rate")[1]
    assert "| clean |" in success_rows and "| backdoor 30% |" in success_rows
    # A second call reads every finished run back instead of training again, and writes the outputs
    # once (not after each run read back: the heat-map alone takes about a second), as does
    # --finished-only.
    monkeypatch.setattr(simulator.Simulator, "run", lambda *a, **k: pytest.fail("trained again"))
    writes = []
    monkeypatch.setattr(
        robustness, "write_outputs", lambda *a, **k: writes.append(write_outputs(*a, **k))
    )
    assert main(argv) == 0 and (out / "table.md").read_text() == table and len(writes) == 1
    assert main(argv + ["--finished-only"]) == 0 and len(writes) == 2
    assert (
        main(["reproduce", "robustness", "--attacks", "nosuch", "--out", str(out), "--quiet"]) == 2
    )
    assert "unknown attack(s) nosuch" in capsys.readouterr().err
