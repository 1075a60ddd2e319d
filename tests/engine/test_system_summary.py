"""A run on the virtual clock closes with its virtual time, its time to the target accuracy and the
clients never heard from (results.json's `system`, explained by its `legend`)."""

from __future__ import annotations

import json

import pytest

from fedac.cli import main
from fedac.engine.report import system_rows
from helpers import tiny_run

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.slow
def test_the_closing_table_of_a_virtual_clock_run_names_its_system_figures(
    gsc_root, tmp_path, capsys
):
    settings = {
        **tiny_run(gsc_root, tmp_path / "cache"),
        "train.rounds": 2,
        "system.devices": "synthetic",
        "system.availability": "synthetic",
        "system.target_accuracy": 0.01,  # (35 classes: reached at an early evaluation)
    }
    out = tmp_path / "run"
    assert (
        main(
            ["run", "--quiet", "--out", str(out), *[f"--set={k}={v}" for k, v in settings.items()]]
        )
        == 0
    )
    table = capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    system = results["system"]
    assert "virtual_time_s" in results["legend"]["system"]
    first = next(r["virtual_time_s"] for r in results["history"] if r["val_accuracy"] >= 0.01)
    assert system["time_to_target_s"] == first
    lines = {line.split("  ")[0]: line for line in table.splitlines()}
    assert lines["virtual time"].endswith(f"{system['virtual_time_s']:.1f} s (sync)")
    assert lines["virtual time to val accuracy 0.01"].endswith(f"{first:.1f} s")
    silent = system["clients_never_contributed"]
    assert lines["clients never heard from"].endswith(
        f"{silent} of {results['clients']} ({system['never_contributed_fraction']:.1%})"
    )


def test_a_target_not_reached_and_a_run_off_the_clock():
    system = {
        "mode": "fedbuff",
        "virtual_time_s": 12.345,
        "target_accuracy": 0.9,
        "time_to_target_s": None,
        "clients_never_contributed": 3,
        "never_contributed_fraction": 0.25,
    }
    assert system_rows({"system": system, "clients": 12}) == [
        ("virtual time", "12.3 s (fedbuff)"),
        ("virtual time to val accuracy 0.90", "not reached"),
        ("clients never heard from", "3 of 12 (25.0%)"),
    ]
    assert system_rows({"system": {**system, "target_accuracy": None}})[1:] == [
        ("clients never heard from", "3 (25.0%)")
    ]
    assert system_rows({}) == []
