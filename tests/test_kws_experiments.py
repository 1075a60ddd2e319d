"""FedKWS-UI's experiments from the CLI (reproduce.py fedkws*, compare preset fedkws): each method
resolves to the intended settings, and a reduced `fedac reproduce` writes its accuracy and FA / FR tables."""

from __future__ import annotations

import csv

import pytest

from fedac.cli import main
from fedac.compare import PRESETS, parse_method
from fedac.config import load_config
from fedac.reproduce import KWS_EXPERIMENTS as EXPERIMENTS, KWS_PROTOCOL
from helpers import tiny_run

pytestmark = pytest.mark.usefixtures("one_thread")


def resolved(experiment: str, label: str):
    method = next(parse_method(m) for m in EXPERIMENTS[experiment].methods if parse_method(m).label == label)
    return load_config(overrides=EXPERIMENTS[experiment].protocol + method.overrides, algorithm=method.algorithm)


def test_fedkws_methods_resolve_to_their_ablations():
    assert EXPERIMENTS["fedkws12"].methods == PRESETS["fedkws"]
    full, alt, control = (resolved("fedkws12", m) for m in ("FedKWS-UI", "ALT only", "Two-head FedAvg"))
    assert (full.fedkwsui.ls_mu, full.fedkwsui.adv_lambda, full.fedkwsui.alt) == (0.2, 0.001, True)
    assert (alt.fedkwsui.ls_mu, alt.fedkwsui.adv_lambda, alt.fedkwsui.alt) == (0.0, 0.0, True)
    assert (control.fedkwsui.ls_mu, control.fedkwsui.adv_lambda, control.fedkwsui.alt) == (0.0, 0.0, False)
    assert resolved("fedkws12", "FedMMD").algorithm == "fedmmd" and full.data.task == "12"
    prox = resolved("fedkws12", "FedProx")
    assert (prox.fedprox.form, prox.fedprox.mu) == ("smooth_l1", 1e-4)
    assert [resolved("fedkws-mu", f"mu {m}").fedkwsui.ls_mu for m in (0.0, 0.1, 0.2, 0.3, 0.5)] == [0, 0.1, 0.2, 0.3, 0.5]
    assert resolved("fedkws-lambda", "lambda 0.1").fedkwsui.adv_lambda == 0.1
    assert resolved("fedkws-alt", "ALT only").data.task == "35"
    assert "train.batch_size=32" in KWS_PROTOCOL and "fedkwsui.local_steps=50" in KWS_PROTOCOL


def test_reduced_fedkws_lambda_reproduction_writes_fa_fr_tables(gsc_root, tmp_path, capsys):
    out = tmp_path / "repro"
    args = ["reproduce", "fedkws-lambda", "--seeds", "0", "--rounds", "1", "--out", str(out), "--quiet",
            "--methods", "lambda 0.001"]
    small = {**tiny_run(gsc_root, None), "train.local_steps": 2, "fedkwsui.local_steps": 2, "data.task": 12}
    for key, value in small.items():  # the user's settings come last: a tiny model instead of the networks
        args += ["--set", f"{key}={value}"]
    assert main(args) == 0
    table = (out / "table.md").read_text()
    assert "false accepts (% of clips)" in table and "false rejects (% of clips)" in table
    with open(out / "results.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2  # 2 networks x 1 method x 1 seed
    assert all(0 <= float(r["fa"]) <= 1 and 0 <= float(r["fr"]) <= 1 for r in rows)
    assert all(0 <= float(r["test_last5_mean"]) <= 1 for r in rows)  # the protocol's train.test_curve
