"""`fedac reproduce pfl-tuned` (experiments/pfl.py): every method swept on validation with one
budget, then run tuned and untuned over the seeds; tuned.md gives the tuned settings (the best
finished trial of each sweep) beside both rankings."""

from __future__ import annotations

import csv
import json

import pytest

from fedac.cli import main
from fedac.experiments import pfl
from fedac.experiments.catalog import experiment_named

pytest.importorskip("optuna")
pytestmark = pytest.mark.usefixtures("one_thread")


def test_every_tuned_method_searches_the_lr_and_a_setting_it_reads():
    from fedac.experiments.catalog import experiment_named
    from fedac.experiments.sweep import SweepSpec, check_searches

    spec = experiment_named("pfl-tuned")
    labels = [m.split("=")[0] for m in spec.methods]
    assert set(labels) == set(pfl.TUNED) and "FedMLAC" not in labels
    for text in spec.methods:
        label, rest = text.split("=", 1)
        algorithm = rest.split(":")[0]
        searches = pfl.searches_of(label)
        assert searches[0].key == "train.lr" and searches[0].text() == "train.lr in [0.01, 1] (log)"
        quick = pfl.searches_of(label, pfl.QUICK_TUNING)[0]  # (the committed quick grid's range)
        assert quick.text() == "train.lr in [0.003, 0.3] (log)"
        # the config's own checks: every searched setting is one the algorithm reads
        check_searches(SweepSpec(None, searches, 1, algorithm=algorithm))  # type: ignore[arg-type]


@pytest.mark.slow
def test_each_dataset_runs_the_schedule_its_flattening_was_measured_on(tmp_path, caplog):
    """CREMA-D: 24 actors, all every round, 1 local epoch, 60 rounds; Speech Commands: the default
    task's 240 speakers, 10 % a round, its 5 local epochs (not pfl-quick's 1, under which FedAvg
    was far from flat), 150 rounds; the dataset's epochs replace the protocol's without a
    warning of a repeated --set (which is for a user's)."""
    from fedac.experiments.catalog import experiment_named
    from fedac.experiments.runner import grid_cells
    from fedac.experiments.spec import Request

    spec = experiment_named("pfl-tuned")
    request = Request(out=tmp_path, seeds=[0], datasets=list(spec.datasets))
    cells = {c.dataset: c.base.train for c in grid_cells(spec, request)}
    assert (cells["cremad"].rounds, cells["cremad"].local_epochs) == (60, 1)
    assert cells["cremad"].fraction == 1.0
    speech = cells["speech_commands"]
    assert (speech.rounds, speech.local_epochs, speech.fraction) == (pfl.SC_ROUNDS, 5, 0.1)
    assert speech.eval_every == 5
    assert "is given 2 times" not in caplog.text


def test_speech_commands_sweeps_keep_their_150_round_budget_under_the_250_round_table(
    tmp_path, monkeypatch
):
    """The table runs 250 rounds on Speech Commands; its sweeps' trials run the first 150 (the
    settings and pruner their studies were made with, so those studies open again), CREMA-D's the
    table's own 60."""
    import copy
    from dataclasses import replace

    from fedac.experiments import sweep as sweep_module
    from fedac.experiments.spec import Request

    specs = {}
    monkeypatch.setattr(
        sweep_module, "sweep", lambda spec: specs.setdefault(spec.dataset, []).append(spec)
    )
    spec = experiment_named("pfl-tuned")
    request = Request(out=tmp_path, seeds=[0], datasets=list(spec.datasets))
    cells = {c.dataset: c for c in pfl.tuned_cells(spec, request)}
    assert cells["speech_commands"].base.train.rounds == pfl.SC_ROUNDS == 250
    assert [pfl.sweep_rounds(cells[d]) for d in ("speech_commands", "cremad")] == [150, 60]
    shorter = replace(cells["speech_commands"], base=copy.deepcopy(cells["speech_commands"].base))
    shorter.base.train.rounds = 100  # (a user's --rounds below the sweeps' budget)
    assert pfl.sweep_rounds(shorter) == 100
    for dataset, rounds, pruner in (
        ("speech_commands", 150, "median:2:50"),
        ("cremad", 60, "median:2:20"),
    ):
        for sweep_spec in specs[dataset]:
            assert sweep_spec.config_for({}).train.rounds == rounds
            assert f"train.rounds={rounds}" in sweep_spec.overrides
            assert sweep_spec.pruner == pruner


def test_a_tuned_setting_replaces_the_protocols_and_a_users_set_replaces_both(tmp_path, caplog):
    """FedRep's sweep draws its head epochs, which the protocol also sets (2): the tuned value is
    the run's without a repeated --set warning (that warning is for a user's own); a user's --set
    still comes last and wins."""
    from fedac.experiments.compare import Method, method_config
    from fedac.experiments.runner import grid_cells
    from fedac.experiments.spec import Request

    spec = experiment_named("pfl-tuned")
    request = Request(out=tmp_path, seeds=[0], datasets=["cremad"])
    cell = grid_cells(spec, request)[0]
    tuned = Method("FedRep", "fedrep", ["fedrep.head_epochs=3"])
    cfg = method_config(cell.base, tuned, 0, tmp_path / "r", None, cell.settings, [])
    assert cfg.fedrep.head_epochs == 3 and "is given" not in caplog.text
    user = method_config(
        cell.base, tuned, 0, tmp_path / "r", None, cell.settings, ["fedrep.head_epochs=4"]
    )
    assert user.fedrep.head_epochs == 4


def test_a_tiny_tuned_table(gsc_root, tmp_path, monkeypatch):
    from dataclasses import replace

    monkeypatch.setattr(pfl, "TUNING", replace(pfl.TUNING, trials=2, seed=7))
    out = tmp_path / "tuned"
    args = [
        "reproduce",
        "pfl-tuned",
        "--quiet",
        "--datasets",
        "speech_commands",
        "--methods",
        "FedAvg",
        "Local",
        "--seeds",
        "0",
        "--rounds",
        "1",
        "--out",
        str(out),
    ]
    for setting in (f"data.root={gsc_root}", "model.name=crnn_tiny", "data.max_clients=8"):
        args += ["--set", setting]
    assert main(args) == 0
    for label in ("FedAvg", "Local"):
        sweep = out / "sweeps" / "speech_commands" / label
        with open(sweep / "trials.csv") as handle:
            rows = list(csv.DictReader(handle))
        assert [r["state"] for r in rows] == ["COMPLETE", "COMPLETE"]
        # FedAvg tuned on the shared model's validation accuracy, local training (own models
        # only) on its clients' held-out accuracy; both at the tuning seed, not a reported one
        metric = "val_accuracy" if label == "FedAvg" else "local_accuracy"
        assert {r["metric"] for r in rows} == {metric}
        assert "seed: 7" in (sweep / "trials" / "0000" / "config.yaml").read_text()
        assert rows[0]["train.lr"] == "0.1"  # trial 0: the untuned settings (--baseline)
        best = max(rows, key=lambda r: float(r["score"]))
        # the tuned run carries the best trial's settings; the untuned one the defaults, run
        # apart only where another trial won (else the tuned runs are the untuned ones)
        tuned = (out / "speech_commands" / f"{label}-s0" / "config.yaml").read_text()
        assert f"lr: {float(best['train.lr'])}" in tuned
        untuned = out / "speech_commands" / f"{label}_(untuned)-s0" / "config.yaml"
        if best["trial"] == "0":
            assert not untuned.exists() and "lr: 0.1\n" in tuned
        else:
            assert "lr: 0.1\n" in untuned.read_text()
    table = (out / "tuned.md").read_text()
    assert "| FedAvg | train.lr=" in table and "The ranking" in table
    # --rounds 1 made the sweeps as long as the table: no shorter sweep budget to name
    assert "of the table's schedule, scored" in table and "where shorter" not in table
    # tuned.json: the table's rows as the README quotes them, and the code of every run
    kept = json.loads((out / "tuned.json").read_text())
    rows = kept["datasets"]["speech_commands"]
    assert [r["method"] for r in rows] and all(pfl.tuned_row(r) in table for r in rows)
    hashes = [r["source_sha256"] for rs in kept["runs"].values() for r in rs]
    assert len(hashes) >= 2 and all(hashes)
    from fedac.experiments.figures import quotes_of, recorded_code

    assert recorded_code(kept) == hashes
    entry = {"table": "tuned", "file": "tuned.json", "dataset": "speech_commands"}
    assert quotes_of(entry, out) == [pfl.tuned_row(r) for r in rows]
    assert (out / "tuned.png").read_bytes()[:4] == b"\x89PNG"
    # the sweeps pruned with the table's pruner: after 2 finished trials, from a third of the
    # rounds (here 1 round: from round 0)
    import optuna
    from optuna.storages.journal import JournalFileBackend

    journal = str(out / "sweeps" / "speech_commands" / "FedAvg" / "study.journal")
    storage = optuna.storages.JournalStorage(JournalFileBackend(journal))
    study = optuna.load_study(study_name=None, storage=storage)
    assert study.user_attrs["definition"]["pruner"] == "median:2:0"


def test_flattening_compares_the_last_evaluations_with_the_ones_before(tmp_path):
    """tuned.md's check that the schedule is long enough: the mean of the last 5 validation
    accuracies against the 5 before, flat within 1 point; rounds without an evaluation skipped."""
    runs = []
    for name, curve in (
        ("rising", [0.1 * k for k in range(10)]),
        ("flat", [0.5] * 5 + [0.509] * 5),
    ):
        run_dir = tmp_path / name
        run_dir.mkdir()
        rows = ["round,val_accuracy"]
        for k, value in enumerate(curve):
            rows += [f"{2 * k + 1},", f"{2 * k + 2},{value}"]
        (run_dir / "metrics.csv").write_text("\n".join(rows) + "\n")
        runs.append({"run_dir": str(run_dir)})
    rising, flat = pfl.flattening(runs)[-2:]
    assert "+50.00 points" in rising and "NOT flat" in rising
    assert "+0.90 points" in flat and "(flat by" in flat
    # too short for the longer span: no drift figure
    assert "earlier" not in rising + flat
    # A slow climb (0.19 points an evaluation) passes the 1-point test, but drifts over 20
    # evaluations: the last 5 of 25 against the first 5.
    run_dir = tmp_path / "slow"
    run_dir.mkdir()
    rows = ["round,val_accuracy"] + [f"{k + 1},{0.5 + 0.0019 * k}" for k in range(25)]
    (run_dir / "metrics.csv").write_text("\n".join(rows) + "\n")
    (slow,) = pfl.flattening([{"run_dir": str(run_dir)}])[-1:]
    assert "+0.95 points on the 5 before (flat by" in slow
    assert "+3.80 points on the 5 evaluations 20 earlier" in slow
    assert pfl.flattening([{"run_dir": str(tmp_path / "missing")}]) == []


def test_tuned_md_ranks_only_the_methods_with_figures(tmp_path):
    """A table being finished over several sittings: a method without finished runs has no rank
    ('—'), the reading compares only the methods with both figures and says so; a figure of fewer
    seeds than the table's says how many (one: no spread, and nothing it enters is called clear);
    settings show 4 significant digits; '(same runs)' where the untuned settings won."""
    from types import SimpleNamespace

    from fedac.experiments.compare import Method

    for label, lr in (("A", "0.10350583216411406"), ("B", "0.1"), ("C", "0.2")):
        sweep = tmp_path / "sweeps" / "cremad" / label
        sweep.mkdir(parents=True)
        (sweep / "trials.csv").write_text(
            f"trial,state,score,train.lr\n0,COMPLETE,0.5,0.1\n1,COMPLETE,0.9,{lr}\n"
        )
    methods = [Method(m, "fedavg", []) for m in ("A", "B", "C", "A (untuned)", "B (untuned)")]
    cell = SimpleNamespace(label="cremad", dataset="cremad", methods=methods)

    def runs(*values):
        return [{pfl.RANKED: v, "clients_last_worst10": v / 2, "accuracy": v} for v in values]

    lines, _ = pfl.tuned_section(
        cell,  # type: ignore[arg-type]
        {"A": runs(0.8, 0.6), "B": runs(0.75), "A (untuned)": runs(0.5), "B (untuned)": runs(0.6)},
        tmp_path,
        2,
    )
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in lines if line.startswith("| ")}
    assert rows["A"][1] == "train.lr=0.1035" and rows["A"][2] == "70.00 ± 10.00"  # (std ddof 0)
    assert rows["B"][2] == "75.00 (n=1)" and rows["B"][6] == "60.00 (n=1)"
    assert rows["B"][3] == "1" and rows["A"][3] == "2" and rows["C"][3] == "—"
    assert rows["B"][7] == "1 |" and rows["A"][7] == "2 |" and rows["C"][7] == "— |"
    assert "(same runs)" in rows["C"][6] and "(same runs)" not in rows["A"][6]
    assert lines[-3] == (
        "Tuned, B wins by 5.00 points over A, from one seed so far: whether the lead is clear "
        "waits for the others. The ranking (of the 2 methods with both figures so far) is the "
        "untuned one."
    )
    assert lines[-1] == (
        "What tuning did to each method's held-out mean, in points ('clear': by more than "
        "either's standard deviation over seeds): B +15.00; A +20.00."
    )
    # three seeds in the table: A's two runs are partial too, with their spread
    lines, _ = pfl.tuned_section(cell, {"A": runs(0.8, 0.6)}, tmp_path, 3)  # type: ignore[arg-type]
    assert "| 70.00 ± 10.00 (n=2) |" in next(line for line in lines if line.startswith("| A |"))


def test_the_tuned_figure_draws_methods_with_figures_and_a_table_with_none(tmp_path):
    row = {"method": "A", "tuned": [0.8, 0.01], "untuned": None, "same_runs": False}
    pfl.tuned_figure(tmp_path / "a.png", "t", {"cremad": [row, {**row, "tuned": None}]})
    pfl.tuned_figure(tmp_path / "none.png", "t", {"cremad": []})
    assert all((tmp_path / f).stat().st_size > 1000 for f in ("a.png", "none.png"))


def test_the_reading_says_which_ranks_moved_and_what_tuning_did():
    """X wins clearly; tuning reversed the order (tau -1); Y kept its untuned settings."""
    tuned = {"X": (0.80, 0.01), "Y": (0.70, 0.02), "Z": (0.60, 0.05)}
    untuned = {"X": (0.55, 0.01), "Y": (0.70, 0.02), "Z": (0.72, 0.01)}
    lines = pfl.reading(
        ["X", "Y", "Z"], tuned, untuned, 3, same=lambda m: m + " (untuned)" * (m != "Y")
    )
    assert lines[0] == (
        "Tuned, X wins by 10.00 points over Y, more than either's standard deviation over seeds. "
        "The ranking differs from the untuned one: X 3 → 1, Z 1 → 3 (Kendall's tau between the "
        "two -1.00)."
    )
    assert lines[-1].endswith(
        ": X +25.00 (clear); Z -12.00 (clear); Y kept the untuned settings (the same runs)."
    )
    assert pfl.kendall_tau(["a", "b", "c"], ["a", "b", "c"]) == 1.0
    assert pfl.kendall_tau(["a", "b", "c"], ["b", "a", "c"]) == 1 / 3


def test_the_tables_of_two_datasets_whose_untuned_runs_differ(tmp_path):
    """The sweeps moved FedRep's settings on one dataset only and Ditto's on the other, so each
    dataset's cell runs an untuned method the other does not: table.md lists every method of
    either, `not run` where a column has no such run (a note says why), and the figure draws
    what there is (it raised KeyError on the first dataset's methods before)."""
    from types import SimpleNamespace

    from fedac.experiments.catalog import experiment_named
    from fedac.experiments.compare import Method
    from fedac.experiments.runner import every_method

    spec = experiment_named("pfl-tuned")

    def cell(dataset: str, *labels: str):
        methods = [Method(m, "fedavg", []) for m in labels]
        return SimpleNamespace(label=dataset, dataset=dataset, methods=methods)

    cells = [
        cell("cremad", "FedRep", "Ditto", "FedRep (untuned)"),
        cell("speech_commands", "FedRep", "Ditto", "Ditto (untuned)"),
    ]
    assert [m.label for m in every_method(cells)] == [  # type: ignore[arg-type]
        "FedRep",
        "Ditto",
        "FedRep (untuned)",
        "Ditto (untuned)",
    ]

    def run(value: float) -> dict:
        return {
            "seed": 0,
            pfl.RANKED: value,
            "accuracy": None,
            "wall_seconds": 10.0,
            "clients_model": "own",
            "run_dir": str(tmp_path / "run"),
        }

    runs = {c.label: {m.label: [run(0.5 + i / 10)] for i, m in enumerate(c.methods)} for c in cells}
    request = SimpleNamespace(out=tmp_path, seeds=[0], command="cmd")
    pfl.write_pfl(spec, request, cells, runs)  # type: ignore[arg-type]
    table = (tmp_path / "table.md").read_text()
    assert "| FedRep (untuned) | 70.00 (n=1)" not in table  # (one seed of one: no "(n=")
    assert f"| FedRep (untuned) | 70.00 | {runner_not_run()} |" in table
    assert f"| Ditto (untuned) | {runner_not_run()} | 70.00 |" in table
    assert f"{runner_not_run()}: the column has no such run" in table
    assert (tmp_path / "figure.png").read_bytes()[:4] == b"\x89PNG"


def runner_not_run() -> str:
    from fedac.experiments.runner import NOT_RUN

    return NOT_RUN
