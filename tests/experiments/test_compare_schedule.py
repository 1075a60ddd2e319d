"""`fedac compare --rounds N` evaluates as `fedac run --rounds N` does: at least 5 times where the
rounds allow (config.fit_eval_schedule), every method alike, unless train.eval_every is given."""

from __future__ import annotations

import csv

import pytest

from fedac.cli import main
from fedac.config import load_config

pytestmark = pytest.mark.usefixtures("one_thread")


def evaluated_rounds(run_dir) -> list[int]:
    with open(run_dir / "metrics.csv", newline="") as handle:
        return [int(row["round"]) for row in csv.DictReader(handle)]


@pytest.mark.parametrize("given", [[], ["--set", "train.eval_every=5"]], ids=["fitted", "given"])
def test_a_short_comparison_evaluates_at_least_five_times(gsc_root, tmp_path, capsys, given):
    out = tmp_path / "cmp"
    args = ["compare", "--seeds", "0", "--rounds", "5", "--out", str(out), "--method", "A=fedavg"]
    settings = {"data.root": gsc_root, "model.name": "crnn_tiny", "train.local_epochs": 1}
    for key, value in settings.items():
        args += ["--set", f"{key}={value}"]
    assert main(args + given) == 0
    expected = [5] if given else [1, 2, 3, 4, 5]
    assert evaluated_rounds(out / "A-s0") == expected
    assert load_config(out / "A-s0" / "config.yaml").train.eval_every == (5 if given else 1)
    said = "train.eval_every 5 -> 1: a run of 5 rounds evaluates every 1" in capsys.readouterr().err
    assert said != bool(given)
