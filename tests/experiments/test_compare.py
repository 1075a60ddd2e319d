"""`fedac compare`: methods x seeds -> per-run directories, summary.json and table.md (mean ± std
over seeds)."""

import json

import numpy as np
import pytest

from fedac.cli import main
from fedac.errors import ConfigError
from fedac.experiments.compare import parse_method


def test_parse_method():
    m = parse_method("FedAvg+LPA=fedavg:aggregation.method=lpa, aggregation.v_h=0.3")
    assert (m.label, m.algorithm, m.overrides) == (
        "FedAvg+LPA",
        "fedavg",
        ["aggregation.method=lpa", "aggregation.v_h=0.3"],
    )
    with pytest.raises(ConfigError, match="LABEL=ALGORITHM"):
        parse_method("fedavg")


def test_compare_runs_every_method_and_seed_and_summarises(gsc_root, tmp_path, capsys):
    out = tmp_path / "cmp"
    code = main(
        [
            "compare",
            "--quiet",
            "--seeds",
            "0",
            "1",
            "--rounds",
            "1",
            "--out",
            str(out),
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
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["runs"]) == {"A", "B"}
    for label, runs in summary["runs"].items():
        assert [r["seed"] for r in runs] == [0, 1]
        for r in runs:
            results = json.loads(
                (tmp_path / "cmp" / f"{label}-s{r['seed']}" / "results.json").read_text()
            )
            assert results["algorithm"] == ("fedavg" if label == "A" else "fedmlac")
            assert r["accuracy"] == pytest.approx(results["final"]["accuracy"])
        accs = [r["accuracy"] for r in runs]
        assert summary["mean_std"][label]["accuracy"] == pytest.approx(
            [np.mean(accs), np.std(accs)]
        )
    table = (out / "table.md").read_text()
    assert "| A |" in table and "| B |" in table
    # FedAvg has no personalized models
    assert "n/a (fedavg keeps no own model per client)" in table.splitlines()[2]
    assert "| B |" in capsys.readouterr().out


def test_compare_rejects_unknown_preset(capsys):
    assert main(["compare", "--preset", "nope"]) == 2
    assert "unknown preset 'nope'" in capsys.readouterr().err


def test_a_run_directory_is_reused_only_for_its_settings_even_after_new_settings_appear(tmp_path):
    import yaml

    from fedac.config import load_config, save_config
    from fedac.experiments.compare import check_same_config

    cfg = load_config(overrides=["train.rounds=3"])
    save_config(cfg, tmp_path / "config.yaml")
    check_same_config(cfg, tmp_path)  # the same settings: reused
    # A config.yaml written before a section existed (here: attack) still matches at that section's
    # defaults.
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    del saved["attack"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved))
    check_same_config(cfg, tmp_path)
    # The folder it was written to is not a setting: a run directory moved elsewhere is still
    # reused.
    moved = load_config(overrides=["train.rounds=3"])
    moved.out = str(tmp_path / "elsewhere")
    check_same_config(moved, tmp_path)
    # How this machine computes is not a setting either: a table begun with two cohort workers is
    # finished with one, on the sequential path, or checkpointing less often. Each of
    # HOW_TO_COMPUTE, one at a time.
    for how in [
        "runtime.cohort_workers=1",
        "runtime.execution=sequential",
        "train.checkpoint_every=2",
        "runtime.threads=2",
        "runtime.cohort_chunk=8",
        "runtime.keep_freed_memory=false",
        "runtime.gru_kernel=torch",
        "runtime.client_memory=host",
        "runtime.devices=cpu,cpu",
        "runtime.dist_timeout=60",
    ]:
        check_same_config(load_config(overrides=["train.rounds=3", how]), tmp_path)
    # More rounds of the same settings: a run the table's longer schedule continues; fewer refuse.
    assert check_same_config(load_config(overrides=["train.rounds=4"]), tmp_path) is True
    assert check_same_config(cfg, tmp_path) is False
    with pytest.raises(ConfigError, match="holds a run of other settings"):
        check_same_config(load_config(overrides=["train.rounds=2"]), tmp_path)
    with pytest.raises(ConfigError, match="holds a run of other settings"):
        check_same_config(load_config(overrides=["train.rounds=4", "train.lr=0.05"]), tmp_path)
    # Any other setting that differs refuses, old file or new.
    # a train setting that does count
    with pytest.raises(ConfigError, match="holds a run of other settings"):
        check_same_config(load_config(overrides=["train.rounds=3", "train.lr=0.05"]), tmp_path)
    with pytest.raises(ConfigError, match="holds a run of other settings"):
        check_same_config(
            load_config(overrides=["train.rounds=3", "attack.kind=sign_flip"]), tmp_path
        )
    # A config.yaml written before the runtime settings had a section (they sat under train)
    # matches too; their arithmetic (precision) still counts.
    saved["train"].update(saved.pop("runtime"))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved))
    check_same_config(load_config(overrides=["train.rounds=3", "runtime.threads=2"]), tmp_path)
    with pytest.raises(ConfigError, match="holds a run of other settings"):
        check_same_config(
            load_config(overrides=["train.rounds=3", "runtime.precision=bf16"]), tmp_path
        )


def test_a_comparison_whose_schedule_grew_continues_its_runs(gsc_root, tmp_path, capsys):
    """The same comparison with more rounds continues each finished run from its checkpoint (a
    table lengthened after a convergence check), to what a straight run of that many rounds gives;
    `--finished-only` before that leaves the shorter runs out."""
    from fedac.experiments.compare import finished_results

    def compare(out, rounds, *extra):
        argv = ["compare", "--quiet", "--seeds", "0", "--rounds", str(rounds), "--out", str(out)]
        argv += ["--method", "A=fedavg", "--set", f"data.root={gsc_root}", *extra]
        for setting in ("model.name=crnn_tiny", "train.local_epochs=1", "train.eval_every=1"):
            argv += ["--set", setting]
        assert main(argv) == 0
        return json.loads((out / "summary.json").read_text())["runs"]["A"]

    grown = tmp_path / "grown"
    compare(grown, 2)
    assert compare(grown, 3, "--finished-only") == []
    assert finished_results(grown / "A-s0", 3) is None and finished_results(grown / "A-s0", 2)
    went_on = compare(grown, 3)[0]
    results = json.loads((grown / "A-s0" / "results.json").read_text())
    assert (results["rounds"], results["resumed_from"], results["rounds_trained"]) == (3, 2, 1)
    assert "rounds: 3" in (grown / "A-s0" / "config.yaml").read_text()
    straight = compare(tmp_path / "straight", 3)[0]
    assert went_on["accuracy"] == straight["accuracy"]
    again = json.loads((tmp_path / "straight" / "A-s0" / "results.json").read_text())
    assert results["final"] == again["final"]
    capsys.readouterr()


def test_mean_std_over_seeds_leaves_out_runs_without_the_metric():
    """A CTC run reports client_accuracy_mean as None (it has no accuracy): the summary skips it
    instead of failing, and averages the runs that have the value."""
    from fedac.experiments.compare import Cell, markdown_table, runs_mean_std

    runs = {
        "asr": [{"accuracy": None, "client_accuracy_mean": None, "wer": 0.8}],
        "kws": [{"accuracy": 0.5, "client_accuracy_mean": 0.25}, {"accuracy": 0.7}],
    }
    out = runs_mean_std(runs)
    assert (out["kws"]["accuracy"].mean, out["kws"]["accuracy"].std) == pytest.approx((0.6, 0.1))
    assert out["kws"]["client_accuracy_mean"] == Cell(0.25, 0.0, seeds=1)
    assert out["asr"]["accuracy"] == Cell(None, None, 0, "a CTC task has no clip accuracy")
    assert out["asr"]["client_accuracy_mean"].mean is None
    # the compare table renders it too
    assert "| asr | n/a (a CTC task has no clip accuracy) |" in markdown_table(runs)
    assert "fa" not in out["kws"]  # no run has FA: no such key

    # FedKWS-UI's keys are averaged too once a run has them (the README's FA / FR cells quote them).
    kws = runs_mean_std(
        {
            "m": [
                {"accuracy": 0.5, "fa": 0.1, "test_last5_mean": 0.4},
                {"accuracy": 0.7, "fa": 0.3, "test_last5_mean": None},
            ]
        }
    )["m"]
    assert (kws["fa"].mean, kws["fa"].std) == pytest.approx((0.2, 0.1))
    assert kws["test_last5_mean"] == Cell(0.4, 0.0, seeds=1)


def strict(text: str):
    """json.loads refusing NaN and Infinity, which are not JSON."""

    def refuse(constant: str):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_one_seed_summary_is_strict_json_and_its_table_says_why_a_column_is_empty(
    gsc_root, tmp_path
):
    """One seed has no spread (no "± 0.00"); FedAvg's own-model columns say why they are empty, in
    the table and in summary.json, which a strict JSON parser reads (null, never NaN)."""
    out = tmp_path / "cmp"
    argv = ["compare", "--quiet", "--seeds", "0", "--rounds", "1", "--out", str(out)]
    settings = [f"data.root={gsc_root}", "model.name=crnn_tiny", "train.local_epochs=1"]
    assert main([*argv, "--method", "A=fedavg", *[f"--set={s}" for s in settings]]) == 0
    summary = strict((out / "summary.json").read_text())
    why = "fedavg keeps no own model per client"
    assert summary["mean_std"]["A"]["personalized_accuracy_mean"] is None
    assert summary["unavailable"]["A"]["personalized_accuracy_mean"] == why
    accuracy = summary["runs"]["A"][0]["accuracy"]
    assert summary["mean_std"]["A"]["accuracy"] == [accuracy, 0.0]
    row = (out / "table.md").read_text().splitlines()[2]
    assert "±" not in row and f"| A | {100 * accuracy:.2f} |" in row
    assert f"n/a ({why})" in row


@pytest.mark.parametrize("other_finishes", [True, False])
def test_a_run_another_process_is_training_is_waited_for_not_trained_twice(
    gsc_root, tmp_path, monkeypatch, other_finishes
):
    """Two copies of one comparison share its runs: a run whose directory another process has locked
    is passed over, the others are trained, and at the end the copy waits for the lock, then reads
    the other's result or, if it died without one, trains (resumes) that run itself."""
    import fcntl
    import os
    import shutil
    import threading
    import time

    from fedac.engine.simulator import Simulator

    common = [
        "--quiet",
        "--seeds",
        "0",
        "--rounds",
        "1",
        "--set",
        f"data.root={gsc_root}",
        "--set",
        "model.name=crnn_tiny",
        "--set",
        "train.local_epochs=1",
        "--method",
        "A=fedavg",
    ]
    # what the other process ends with
    assert main(["compare", *common, "--out", str(tmp_path / "other")]) == 0
    trained = []
    real_run = Simulator.run
    monkeypatch.setattr(
        Simulator,
        "run",
        lambda self, **kw: trained.append(self.run_dir.name) or real_run(self, **kw),
    )
    out = tmp_path / "cmp"
    (out / "A-s0").mkdir(parents=True)
    held = os.open(out / "A-s0", os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)  # "another process" is training A
    codes = []
    worker = threading.Thread(
        target=lambda: codes.append(
            main(["compare", *common, "--method", "B=fedprox", "--out", str(out)])
        )
    )
    worker.start()
    deadline = time.monotonic() + 600  # a safety net: B's run is the event waited for
    while not (out / "B-s0" / "results.json").is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    assert trained == ["B-s0"], "B, after the locked A, is trained meanwhile"
    assert not (out / "A-s0" / "config.yaml").exists() and worker.is_alive()  # A untouched: waiting
    if other_finishes:
        shutil.copy(tmp_path / "other" / "A-s0" / "results.json", out / "A-s0" / "results.json")
    os.close(held)  # the other process ends (or dies without a result)
    worker.join(timeout=600)
    assert codes == [0]
    # A read back, or trained here
    assert trained == (["B-s0"] if other_finishes else ["B-s0", "A-s0"])
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["runs"]) == ["A", "B"] and all(
        len(r) == 1 for r in summary["runs"].values()
    )
    if other_finishes:  # the table holds the other process's result
        other = json.loads((tmp_path / "other" / "A-s0" / "results.json").read_text())["final"]
        assert summary["runs"]["A"][0]["accuracy"] == other["accuracy"]


def test_reproduce_worst_adds_the_worst_clients_tables_and_only_where_the_writer_has_them(
    capsys, tmp_path
):
    """`fedac reproduce --worst`: the default writer's table.md gains one table per worst-10 % key
    that some run has (each cell mean ± std over seeds); without the flag it has none; a table with
    a writer of its own (earlyexit-table2, robustness) refuses the flag instead of dropping it."""
    from fedac.cli import main
    from fedac.experiments.catalog import EXPERIMENTS
    from fedac.experiments.runner import markdown

    spec = EXPERIMENTS["table4"]
    runs = {
        "Speech Commands": {
            "FedAvg": [
                {"seed": 0, "accuracy": 0.5, "client_accuracy_worst10": 0.10},
                {"seed": 1, "accuracy": 0.6, "client_accuracy_worst10": 0.30},
            ],
            "FedKAD": [{"seed": 0, "accuracy": None, "personalized_local_accuracy_worst10": 0.4}],
        }
    }
    plain = markdown(spec, runs, ["FedAvg", "FedKAD"], [0, 1], "cmd")
    worst = markdown(spec, runs, ["FedAvg", "FedKAD"], [0, 1], "cmd", worst=True)
    assert "worst 10 %" not in plain
    shared = worst.split("## Shared model: worst 10 % clients' held-out acc.")[1].split("##")[0]
    assert "| FedAvg | 20.00 ± 10.00 |" in shared and "| FedKAD | — |" in shared
    own = worst.split("## Own models: worst 10 % clients' held-out acc.")[1].split("##")[0]
    assert "| FedKAD | 40.00 (n=1) |" in own
    for name in ("earlyexit-table2", "robustness"):
        assert main(["reproduce", name, "--worst", "--out", str(tmp_path / name)]) == 2
        assert f"{name} does not use --worst" in capsys.readouterr().err


def write_metrics(run_dir, rows):
    """metrics.csv of (round, val_accuracy, virtual_time_s or None) rows."""
    run_dir.mkdir(parents=True)
    clock = any(t is not None for _, _, t in rows)
    lines = ["round,val_accuracy" + (",virtual_time_s" if clock else "")]
    lines += [f"{r},{a}" + (f",{t}" if clock else "") for r, a, t in rows]
    (run_dir / "metrics.csv").write_text("\n".join(lines) + "\n")
    return {"run_dir": str(run_dir)}


@pytest.fixture
def kept_figure(monkeypatch):
    """The figure a plot function drew, left open (pyplot's close does nothing) for the test."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.setattr(plt, "close", lambda *args: None)
    yield plt.gcf
    monkeypatch.undo()
    plt.close("all")


def curves(ax):
    return [(list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()]


def test_the_virtual_time_panel_is_drawn_only_on_the_clock_and_follows_its_numbers(
    tmp_path, kept_figure
):
    from fedac.experiments.compare import plot_accuracy_curves

    timed = {
        "A": [write_metrics(tmp_path / "a", [(1, 0.1, 7.5), (2, 0.3, 12.0), (3, 0.4, 30.25)])],
        "B": [write_metrics(tmp_path / "b", [(2, 0.2, 1.5), (4, 0.5, 2.0)])],
    }
    plot_accuracy_curves(timed, tmp_path / "timed.png")
    by_round, by_time = kept_figure().axes
    assert curves(by_round) == [([1.0, 2.0, 3.0], [10.0, 30.0, 40.0]), ([2.0, 4.0], [20.0, 50.0])]
    assert curves(by_time) == [([7.5, 12.0, 30.25], [10.0, 30.0, 40.0]), ([1.5, 2.0], [20.0, 50.0])]
    assert by_time.get_xlabel() == "virtual time (s)"
    assert (tmp_path / "timed.png").is_file()

    kept_figure().clear()
    ideal = {"A": [write_metrics(tmp_path / "c", [(1, 0.1, None), (2, 0.3, None)])]}
    plot_accuracy_curves(ideal, tmp_path / "ideal.png")
    (only,) = kept_figure().axes  # no clock: accuracy against rounds alone
    assert curves(only) == [([1.0, 2.0], [10.0, 30.0])]


def test_compare_on_the_clock_draws_accuracy_against_virtual_time(gsc_root, tmp_path, capsys):
    import csv

    import matplotlib.image

    base = ["compare", "--quiet", "--seeds", "0", "--rounds", "1", "--method", "A=fedavg"]
    settings = [f"data.root={gsc_root}", "model.name=crnn_tiny", "train.local_epochs=1"]
    clock = ["system.devices=synthetic", "system.deadline=30"]
    out = tmp_path / "clock"
    assert main([*base, "--out", str(out), *[f"--set={s}" for s in settings + clock]]) == 0
    with open(out / "A-s0" / "metrics.csv") as handle:
        assert all(float(r["virtual_time_s"]) > 0 for r in csv.DictReader(handle))
    image = matplotlib.image.imread(out / "accuracy_curves.png")
    assert image.shape[1] == 1200  # two panels of 6 inches at 100 dpi
    assert "accuracy_curves.png" in capsys.readouterr().out


def test_a_later_run_of_a_comparison_counts_only_its_own_time_before_round_1(monkeypatch, tmp_path):
    """The estimate after round 1 adds the time before it (reading and caching the data): for the
    second run of a comparison that is its own preparation, not the first run's 500 s."""
    from types import SimpleNamespace

    import fedac.engine.simulator as simulator
    import fedac.settings.compatibility as compatibility
    from fedac import progress
    from fedac.config import Config
    from fedac.experiments import compare

    clock = [0.0]
    monkeypatch.setattr(progress, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    seen = []

    class Run:  # a Simulator whose run reads what RoundLoop would and takes 500 s
        def __init__(self, *args, **kwargs):
            pass

        def run(self, resume):
            seen.append(progress.seconds_before_run())
            clock[0] += 500.0
            return {"accuracy": 0.5}

    def prepare(built, cfg, show):  # building a run's data: 100 s, then 30 s
        clock[0] += 100.0 if not seen else 30.0

    monkeypatch.setattr(simulator, "Simulator", Run)
    monkeypatch.setattr(compatibility, "check", lambda cfg: None)
    monkeypatch.setattr(compare, "shared_data", prepare)
    progress.before_run_starts()  # (cli.main's)
    for name in ("a", "b"):
        compare.train_run(Config(), tmp_path / name, name, (True, None, False), {}, False)
    assert seen == [100.0, 30.0]
