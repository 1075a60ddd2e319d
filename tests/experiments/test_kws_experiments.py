"""FedKWS-UI's experiments from the CLI (experiments/fedkws.py, compare preset fedkws): each method
resolves to the intended settings, and a reduced `fedac reproduce` writes its accuracy and FA / FR
tables."""

from __future__ import annotations

import csv

import pytest

from fedac.cli import main
from fedac.config import load_config
from fedac.experiments.compare import PRESETS, parse_method
from fedac.experiments.fedkws import EXPERIMENTS, KWS_PROTOCOL, KWS_SCALED, kws_notes
from fedac.experiments.runner import seed_curve
from helpers import tiny_run

pytestmark = pytest.mark.usefixtures("one_thread")


def resolved(experiment: str, label: str, user: list[str] = ()):
    method = next(
        parse_method(m) for m in EXPERIMENTS[experiment].methods if parse_method(m).label == label
    )
    return load_config(
        overrides=EXPERIMENTS[experiment].protocol + method.overrides + list(user),
        algorithm=method.algorithm,
    )


def test_fedkws_methods_resolve_to_their_ablations():
    assert EXPERIMENTS["fedkws12"].methods == PRESETS["fedkws"]
    full, alt, control = (
        resolved("fedkws12", m) for m in ("FedKWS-UI", "ALT only", "Two-head FedAvg")
    )
    assert (full.fedkwsui.ls_mu, full.fedkwsui.adv_lambda, full.fedkwsui.alt) == (0.2, 0.001, True)
    assert (alt.fedkwsui.ls_mu, alt.fedkwsui.adv_lambda, alt.fedkwsui.alt) == (0.0, 0.0, True)
    assert (control.fedkwsui.ls_mu, control.fedkwsui.adv_lambda, control.fedkwsui.alt) == (
        0.0,
        0.0,
        False,
    )
    kaiming, kaiming_control = (
        resolved("fedkws12", m)
        for m in ("FedKWS-UI (Kaiming heads)", "Two-head FedAvg (Kaiming heads)")
    )
    assert (full.fedkwsui.head_init, control.fedkwsui.head_init) == ("default", "default")
    assert (kaiming.fedkwsui.head_init, kaiming.fedkwsui.ls_mu, kaiming.fedkwsui.alt) == (
        "kaiming",
        0.2,
        True,
    )
    assert (kaiming_control.fedkwsui.head_init, kaiming_control.fedkwsui.alt) == ("kaiming", False)
    assert resolved("fedkws12", "FedMMD").algorithm == "fedmmd" and full.data.task == "12"
    prox = resolved("fedkws12", "FedProx")
    assert (prox.fedprox.form, prox.fedprox.mu) == ("smooth_l1", 1e-4)
    assert [resolved("fedkws-mu", f"mu {m}").fedkwsui.ls_mu for m in (0.0, 0.1, 0.2, 0.3, 0.5)] == [
        0,
        0.1,
        0.2,
        0.3,
        0.5,
    ]
    assert resolved("fedkws-lambda", "lambda 0.1").fedkwsui.adv_lambda == 0.1
    assert resolved("fedkws-alt", "ALT only").data.task == "35"
    assert "train.batch_size=32" in KWS_PROTOCOL and "fedkwsui.local_steps=50" in KWS_PROTOCOL


def test_scaled_protocol_changes_only_the_schedule():
    """fedkws12-scaled is the paper's protocol with fewer speakers, rounds and steps: every other
    setting (data, optimiser, clipping, augmentation) is the paper's, and each key appears once."""
    keys = [s.split("=")[0] for s in KWS_SCALED]
    assert len(keys) == len(set(keys))
    changed = {s for s in KWS_SCALED if s not in KWS_PROTOCOL}
    assert changed == {
        "data.max_clients=100",
        "train.rounds=40",
        "train.local_steps=10",
        "fedkwsui.local_steps=10",
        "train.eval_every=4",
        "train.checkpoint_every=4",
    }
    scaled = EXPERIMENTS["fedkws12-scaled"]
    assert [label for label, _ in scaled.variants] == ["DSCNN", "MHAttRNN"] and scaled.curves
    cfg = resolved("fedkws12-scaled", "FedKWS-UI")
    assert (
        cfg.train.rounds,
        cfg.data.max_clients,
        cfg.fedkwsui.local_steps,
        cfg.train.batch_size,
    ) == (40, 100, 10, 32)
    assert resolved("fedkws12-scaled", "FedAvg").train.local_steps == 10


def weighting(cfg) -> str:
    from fedac.algorithms import algorithm_class

    return algorithm_class(cfg.algorithm).server_weighting(cfg)


@pytest.mark.parametrize("experiment", ["fedkws12", "fedkws12-scaled", "fedkws-alt"])
def test_every_method_of_a_kws_table_takes_one_weighting(experiment):
    """Like for like: the paper's unweighted mean for every method; one `--set` weights them all by
    n_k. ALT's r0 is Sec. 4's rule over the run's clients (the code's 3.5 was fitted to real Speech
    Commands)."""
    labels = [parse_method(m).label for m in EXPERIMENTS[experiment].methods]
    assert {weighting(resolved(experiment, label)) for label in labels} == {"uniform"}
    flipped = {
        weighting(resolved(experiment, label, ["aggregation.weighting=n_k"])) for label in labels
    }
    assert flipped == {"n_k"}
    assert resolved(experiment, "FedKWS-UI").fedkwsui.r0 == "sum"
    methods = [parse_method(m) for m in EXPERIMENTS[experiment].methods]
    notes = kws_notes(EXPERIMENTS[experiment].protocol, methods, "speech_commands")
    assert (
        notes[0] == "Server mean: unweighted (1/|S| per upload) for every method "
        "(aggregation.weighting=uniform)."
    )
    assert "fedkwsui.r0=sum" in notes[1]
    mixed = kws_notes(
        EXPERIMENTS[experiment].protocol
        + ["aggregation.weighting=n_k", "fedkwsui.aggregation=uniform"],
        methods,
        "speech_commands",
    )
    assert "FedAvg n_k-weighted" in mixed[0] and "FedKWS-UI unweighted" in mixed[0]


def test_fedkws_compare_preset_brings_the_uniform_mean(monkeypatch, tmp_path):
    import fedac.experiments.compare as compare

    seen = {}
    monkeypatch.setattr(
        compare,
        "run_comparison",
        lambda base, methods, seeds, out, overrides, *a, **k: (
            seen.update(overrides=overrides) or {"wall_seconds": 0.0}
        ),
    )
    (tmp_path / "table.md").write_text("")  # what cmd_compare prints
    for extra, expected in (([], "uniform"), (["--set", "aggregation.weighting=n_k"], "n_k")):
        assert (
            main(["compare", "--preset", "fedkws", "--out", str(tmp_path), "--quiet", *extra]) == 0
        )
        cfg = load_config(
            overrides=seen["overrides"], algorithm="fedkwsui", algorithm_defaults=False
        )
        assert (
            weighting(cfg) == expected
            and weighting(load_config(overrides=seen["overrides"])) == expected
        )
    assert main(["compare", "--preset", "baselines", "--out", str(tmp_path), "--quiet"]) == 0
    assert seen["overrides"] == []  # other presets keep fedac's n_k-weighted mean


def test_seed_curve_averages_the_rounds_every_seed_evaluated(tmp_path):
    header = "round,val_accuracy,test_accuracy\n"
    runs = []
    for seed, rows in enumerate(["1,0.9,0.2\n2,0.9,0.4\n3,0.9,0.5\n", "1,0.1,0.4\n2,0.1,0.8\n"]):
        (tmp_path / str(seed)).mkdir()
        (tmp_path / str(seed) / "metrics.csv").write_text(header + rows)
        runs.append({"run_dir": str(tmp_path / str(seed))})
    rounds, mean, std = seed_curve(runs, "test_accuracy")
    assert rounds == [1, 2]  # round 3 only one seed reached
    assert mean == pytest.approx([0.3, 0.6]) and std == pytest.approx([0.1, 0.2])
    assert seed_curve(runs, "val_accuracy") == ([1, 2], [0.5, 0.5], [pytest.approx(0.4)] * 2)
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "metrics.csv").write_text(
        "round,val_accuracy,test_accuracy\n5,0.7,\n10,0.75,\n"
    )
    # no test curve
    assert seed_curve([{"run_dir": str(tmp_path / "v")}], "test_accuracy") == ([], [], [])


@pytest.mark.slow
def test_reduced_fedkws_reproduction_writes_fa_fr_tables_and_curves(gsc_root, tmp_path, capsys):
    out = tmp_path / "repro"
    args = [
        "reproduce",
        "fedkws12-scaled",
        "--seeds",
        "0",
        "--rounds",
        "2",
        "--out",
        str(out),
        "--quiet",
        "--methods",
        "FedKWS-UI",
    ]
    small = {
        **tiny_run(gsc_root, None),
        "train.local_steps": 2,
        "fedkwsui.local_steps": 2,
        "data.task": 12,
    }
    # the user's settings come last: a tiny model instead of the networks
    for key, value in small.items():
        args += ["--set", f"{key}={value}"]
    assert main(args) == 0
    table = (out / "table.md").read_text()
    assert "false accepts (% of clips)" in table and "false rejects (% of clips)" in table
    with open(out / "results.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2  # 2 networks x 1 method x 1 seed
    assert all(0 <= float(r["fa"]) <= 1 and 0 <= float(r["fr"]) <= 1 for r in rows)
    # the protocol's train.test_curve
    assert all(0 <= float(r["test_last5_mean"]) <= 1 for r in rows)
    # Fig. 2: accuracy per round
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the protocol line: what ran
    assert "train.rounds=40" in table and "train.rounds=300" not in table
    assert "Server mean: unweighted (1/|S| per upload) for every method" in table
    # ALT's mean steps per client in the notes equal the steps the run's own FedKWS-UI planned for
    # its clients (built here from the engine's data, not from the notes' manifest-and-partition
    # path)
    from fedac.algorithms.fedkwsui import FedKWSUI
    from fedac.engine.data import build_federated_data

    cfg = load_config(rows[0]["run_dir"] + "/config.yaml")
    task = build_federated_data(cfg, progress=False).task
    algo = FedKWSUI(cfg, task)
    planned = [
        algo.client_plan(c)["steps"] for c, n in zip(task.clients, task.class_counts) if sum(n)
    ]
    assert (
        f"ALT steps per client on average {sum(planned) / len(planned):.2f} of E = 2 (seeds 0;"
        in table
    )
