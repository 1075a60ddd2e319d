"""scripts/probe_rounds.py: a table's runs continued in copies to more rounds (the table's own runs
left as they were), and the before / after figures it writes read from the right runs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from fedac.cli import main as fedac
from helpers import tiny_run

pytestmark = pytest.mark.usefixtures("one_thread")
SCRIPT = Path(__file__).parents[1] / "scripts" / "probe_rounds.py"


def probe_module():
    spec = importlib.util.spec_from_file_location("probe_rounds", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_runs_go_on_in_copies_and_the_figures_compare_before_and_after(gsc_root, tmp_path):
    cell = tmp_path / "cell"
    settings = tiny_run(gsc_root, tmp_path / "cache")
    for seed in (0, 1):
        argv = ["run", "--quiet", "--algorithm", "fedavg", "--rounds", "2", "--seed", str(seed)]
        argv += [f"--set={k}={v}" for k, v in settings.items()]
        assert fedac([*argv, "--out", str(cell / f"FedAvg-s{seed}")]) == 0
    table_run = (cell / "FedAvg-s0" / "results.json").read_bytes()
    out = tmp_path / "probe"
    probe = probe_module()
    assert (
        probe.main(
            [str(cell), "--runs", "FedAvg", "--seeds", "0", "1", "--rounds", "3", "--out", str(out)]
        )
        == 0
    )
    assert (cell / "FedAvg-s0" / "results.json").read_bytes() == table_run
    rows = json.loads((out / "probe.json").read_text())["FedAvg"]
    assert [r["rounds"] for r in rows["before"]] == [2.0, 2.0]
    assert [r["rounds"] for r in rows["after"]] == [3.0, 3.0]
    went_on = json.loads((out / "FedAvg-s1" / "results.json").read_text())
    assert (went_on["resumed_from"], went_on["rounds_trained"]) == (2, 1)
    assert rows["after"][1]["test"] == pytest.approx(100 * went_on["final"]["accuracy"])
    assert "| FedAvg |" in (out / "probe.md").read_text()
    # a second call reads the finished copies back, training nothing
    stamp = (out / "FedAvg-s1" / "results.json").stat().st_mtime_ns
    assert (
        probe.main(
            [str(cell), "--runs", "FedAvg", "--seeds", "0", "1", "--rounds", "3", "--out", str(out)]
        )
        == 0
    )
    assert (out / "FedAvg-s1" / "results.json").stat().st_mtime_ns == stamp
