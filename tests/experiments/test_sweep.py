"""`fedac sweep` (experiments/sweep.py): trials are real runs scored on validation, the study
resumes (a larger --trials adds only the missing trials, a killed sweep continues), several
processes share one study without losing or adding trials, and bad searches are refused by name
before any run."""

import csv
import json
import signal
import socket
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from fedac.cli import main

optuna = pytest.importorskip("optuna")

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(gsc_root) -> list[str]:
    settings = [
        f"data.root={gsc_root}",
        "model.name=crnn_tiny",
        "train.fraction=0.5",
        "train.local_epochs=1",
        "train.eval_every=1",
    ]
    return [a for s in settings for a in ("--set", s)]


def sweep_args(gsc_root, out: Path, trials: int, *extra: str) -> list[str]:
    return [
        "sweep",
        "--quiet",
        "--trials",
        str(trials),
        "--rounds",
        "2",
        "--seed",
        "0",
        "--out",
        str(out),
        "--search",
        "train.lr=0.01:0.3:log",
        "--search",
        "train.momentum=0,0.9",
        *tiny(gsc_root),
        *extra,
    ]


def rows(out: Path) -> list[dict]:
    with open(out / "trials.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def test_sweep_writes_trials_and_best_and_a_larger_trials_adds_only_the_missing(
    gsc_root, tmp_path, capsys
):
    out = tmp_path / "sw"
    assert main(sweep_args(gsc_root, out, 3)) == 0
    first = rows(out)
    assert [r["state"] for r in first] == ["COMPLETE"] * 3
    for r in first:
        # the score is the run's own validation curve: its best evaluated round (train.select)
        with open(out / r["run_dir"] / "metrics.csv", newline="") as handle:
            curve = [float(row["val_accuracy"]) for row in csv.DictReader(handle)]
        assert float(r["score"]) == pytest.approx(max(curve)) and len(curve) == 2
        config = (out / r["run_dir"] / "config.yaml").read_text()
        assert f"lr: {float(r['train.lr'])}" in config
    assert (out / "sweep.png").stat().st_size > 0
    stamps = {r["run_dir"]: (out / r["run_dir"] / "results.json").stat().st_mtime for r in first}
    # the same command, one trial more: exactly one new run, the three left as they were
    assert main(sweep_args(gsc_root, out, 4)) == 0
    second = rows(out)
    assert len(second) == 4 and second[:3] == first
    assert sorted(p.name for p in (out / "trials").iterdir()) == ["0000", "0001", "0002", "0003"]
    assert stamps == {d: (out / d / "results.json").stat().st_mtime for d in stamps}
    # best.yaml repeats the best trial with `fedac run --config`
    best = max(second, key=lambda r: float(r["score"]))
    repeat = tmp_path / "repeat"
    assert main(["run", "--quiet", "--config", str(out / "best.yaml"), "--out", str(repeat)]) == 0
    trial = json.loads((out / best["run_dir"] / "results.json").read_text())
    again = json.loads((repeat / "results.json").read_text())
    assert again["final"]["accuracy"] == trial["final"]["accuracy"]
    assert again["history"][-1]["val_accuracy"] == trial["history"][-1]["val_accuracy"]
    # another search in the same folder is refused, naming what differs
    other = sweep_args(gsc_root, out, 4)
    other[other.index("train.lr=0.01:0.3:log")] = "train.lr=0.01:0.2"
    assert main(other) == 2
    assert "holds a sweep of other settings (searches differ)" in capsys.readouterr().err


def test_a_set_that_a_later_one_replaces_makes_no_other_study(tmp_path):
    """Of --sets of one key the last takes effect, so the study is the same without the replaced
    ones (a table's protocol repeats a key its dataset then sets: pfl-tuned's local epochs); a
    study made when definitions held every --set still opens; another value is another study."""
    from fedac.errors import ConfigError
    from fedac.experiments.sweep import SweepSpec, open_study, parse_search

    def spec(*overrides: str) -> SweepSpec:
        search = [parse_search("train.lr=0.01:0.3:log")]
        return SweepSpec(tmp_path / "sw", search, 2, overrides=list(overrides), seed=0)

    (tmp_path / "sw").mkdir()
    repeated = ("train.local_epochs=1", "train.rounds=3", "train.local_epochs=5")
    study = open_study(spec(*repeated), "maximize")
    assert study.user_attrs["definition"]["overrides"] == ["train.rounds=3", "train.local_epochs=5"]
    open_study(spec("train.rounds=3", "train.local_epochs=5"), "maximize")
    # as the studies made before stored them
    study.set_user_attr("definition", {**spec().definition(), "overrides": list(repeated)})
    open_study(spec("train.rounds=3", "train.local_epochs=5"), "maximize")
    with pytest.raises(ConfigError, match=r"\(overrides differ\)"):
        open_study(spec("train.rounds=3", "train.local_epochs=1"), "maximize")
    # a trial's drawn value replaces the command's --set of its key
    drawn = spec("train.lr=0.1", "train.rounds=3").settings({"train.lr": 0.05})
    assert drawn == ["train.rounds=3", "train.lr=0.05"]


def test_a_pruner_stops_a_trial_at_its_reported_round(gsc_root, tmp_path):
    from fedac.engine.simulator import Simulator
    from fedac.experiments.sweep import Pruned, SweepSpec, with_pruning

    spec = SweepSpec(tmp_path, [], 1, overrides=tiny(gsc_root)[1::2], rounds=3)
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.ThresholdPruner(2.0))
    trial, curve = study.ask(), []
    cfg = spec.config_for({})
    with pytest.raises(Pruned):
        with_pruning(Simulator, spec, trial, curve, [])(cfg, tmp_path / "run", progress=False).run()
    # pruned at the first evaluated round, which it reported
    assert [r for r, _ in curve] == [1]
    assert trial.storage.get_trial(trial._trial_id).intermediate_values == {1: curve[0][1]}
    assert not (tmp_path / "run" / "results.json").exists()


def test_a_trial_left_running_by_an_ended_process_is_failed_and_tried_again(tmp_path):
    from fedac.experiments.sweep import Search, SweepSpec, claim, open_study, worker_lock

    spec = SweepSpec(tmp_path, [Search("train.lr", 0.01, 0.1)], trials=1, progress=False)
    study = open_study(spec, "maximize")
    left = study.ask({"train.lr": spec.searches[0].distribution()})
    (tmp_path / "workers").mkdir()
    left.set_user_attr("worker", f"{socket.gethostname()}-999999999")
    (tmp_path / "workers" / f"{socket.gethostname()}-999999999.lock").touch()
    with worker_lock(tmp_path) as name:
        retry = claim(study, spec, name)
        assert retry is not None
        # a live worker's trial is left alone: the study is full while `retry` runs
        assert claim(study, spec, name) is None
    states = {t.number: t.state.name for t in study.get_trials()}
    assert states == {0: "FAIL", 1: "RUNNING"}
    assert retry.params == left.params and study.trials[1].user_attrs["retry_of"] == 0


def test_an_interrupted_trials_retry_continues_its_run_from_the_checkpoint(
    gsc_root, tmp_path, monkeypatch
):
    """SIGINT / SIGTERM in round 3 of 4 (checkpoints every round): the retry resumes the run in the
    interrupted trial's directory from round 2, trains rounds 3-4 only, and its curve, score and
    metrics equal an uninterrupted trial's of the same settings; its wall time counts both
    sittings."""
    from fedac.engine.checkpoint import load_checkpoint
    from fedac.engine.simulator import Simulator
    from fedac.errors import RunInterrupted
    from fedac.experiments import sweep
    from fedac.experiments.sweep import Search, SweepSpec, claim, open_study, run_trial, worker_lock

    overrides = [*tiny(gsc_root)[1::2], "train.checkpoint_every=1"]

    def trial_of(out: Path, interrupt: bool):
        spec = SweepSpec(
            out, [Search("train.lr", 0.05, 0.2)], 1, overrides=overrides, rounds=4, progress=False
        )
        out.mkdir()
        study = open_study(spec, "maximize")
        study.enqueue_trial({"train.lr": 0.1})
        with worker_lock(out) as name:
            trial = claim(study, spec, name)
            if interrupt:
                original = Simulator.run_round

                def stop_in_round_3(self, state, round_idx):
                    if round_idx == 3:
                        raise RunInterrupted(self.run_dir, 2, 4, signal.SIGTERM, "round 3")
                    return original(self, state, round_idx)

                with monkeypatch.context() as patch:
                    patch.setattr(Simulator, "run_round", stop_in_round_3)
                    with pytest.raises(RunInterrupted, match="continue with: the same command"):
                        run_trial(spec, study, trial, {})
                trial = claim(study, spec, name)  # the retry, queued by the interruption
                assert trial.user_attrs["retry_of"] == 0
                # this sitting's clock reads 1 s; the trial's wall time adds the run's before it
                before = load_checkpoint(out / "trials" / "0000").wall_seconds
                ticks = iter([10.0, 11.0])
                monkeypatch.setattr(
                    sweep, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks))
                )
            assert run_trial(spec, study, trial, {}) == "done"
            if interrupt:
                assert study.trials[-1].user_attrs["wall_s"] == pytest.approx(1.0 + before)
        return study

    whole = trial_of(tmp_path / "whole", interrupt=False)
    retried = trial_of(tmp_path / "retried", interrupt=True)
    first, retry = retried.trials
    assert (first.state.name, retry.state.name) == ("FAIL", "COMPLETE")
    assert first.user_attrs["run_dir"] == retry.user_attrs["run_dir"] == "trials/0000"
    assert not (tmp_path / "retried" / "trials" / "0001").exists()
    run = json.loads((tmp_path / "retried" / "trials" / "0000" / "results.json").read_text())
    assert (run["resumed_from"], run["rounds_trained"]) == (2, 2)
    done = whole.trials[0]
    assert (
        retry.intermediate_values == done.intermediate_values and len(done.intermediate_values) == 4
    )
    assert retry.value == done.value
    metrics = [
        (p / "trials" / "0000" / "metrics.csv") for p in (tmp_path / "whole", tmp_path / "retried")
    ]
    columns = ("round", "val_accuracy", "train_loss")
    a, b = ([{k: r[k] for k in columns} for r in csv.DictReader(open(m))] for m in metrics)
    assert a == b and len(a) == 4


@pytest.mark.parametrize(
    "search, extra, named",
    [
        ("train.nosuch=0:1", [], "unknown setting 'train.nosuch'"),
        ("train.lr=-0.1:0.5", [], "value -0.1 refused: train.lr must be > 0"),
        ("train.fraction=0.5:2", [], "train.fraction"),
        ("train.momentum=0.5,1.5", [], "train.momentum"),
        ("fedprox.mu=0.001:1", ["--algorithm", "ditto"], "ditto does not read the fedprox"),
        ("data.alpha=0.1:1", [], "data.alpha: not applied under data.partition=natural"),
        ("train.optimizer=0:1", [], "a range needs a numeric setting"),
        ("train.rounds=1:5", [], "train.rounds: not searchable"),
        ("train.lr=0.1:0.01", [], "LOW must be below HIGH"),
        ("train.lr=0:0.1:log", [], "a log range needs LOW > 0"),
        ("train.lr=0.2:0.3", ["--baseline"], "train.lr's own value 0.1 lies outside its search"),
        ("train.local_epochs=1.5:3", [], "train.local_epochs' expects int"),
    ],
)
def test_bad_searches_are_refused_by_name_before_any_run(tmp_path, capsys, search, extra, named):
    code = main(
        ["sweep", "--trials", "1", "--out", str(tmp_path / "sw"), "--search", search, *extra]
    )
    assert code == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "sw").exists()


def fedac(*args: str) -> subprocess.Popen:
    def defaults():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)

    return subprocess.Popen(
        [sys.executable, "-m", "fedac.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=defaults,
    )


@pytest.mark.slow
def test_two_processes_on_one_study_finish_exactly_the_trials(gsc_root, tmp_path):
    out = tmp_path / "sw"
    # two worker processes of one command, and a second command on the same study at once
    first = fedac(*sweep_args(gsc_root, out, 5, "--jobs", "2"))
    time.sleep(1.0)
    second = fedac(*sweep_args(gsc_root, out, 5))
    for proc in (first, second):
        output = proc.communicate(timeout=600)[0]
        assert proc.returncode == 0, output
    states = [r["state"] for r in rows(out)]
    assert states == ["COMPLETE"] * 5
    assert len(list((out / "trials").iterdir())) == 5


@pytest.mark.slow
def test_a_killed_sweep_continues(gsc_root, tmp_path):
    out = tmp_path / "sw"
    args = sweep_args(gsc_root, out, 3, "--rounds", "8")
    proc = fedac(*args)
    deadline = time.monotonic() + 300
    # killed (SIGKILL: no handler runs) once the second trial has trained a round
    while not (out / "trials" / "0001" / "metrics.csv").exists():
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    assert main(args) == 0
    got = rows(out)
    assert [r["state"] for r in got] == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE"]
    # the killed trial's settings tried again first (a queued trial), then a new draw
    assert got[2]["retry_of"] == "1" and got[2]["train.lr"] == got[1]["train.lr"]
    assert got[1]["failed"] == "its process ended mid-trial"


def test_the_metric_prefers_the_shared_or_the_personal_models_as_asked():
    """--metric auto scores the shared model's validation accuracy where there is one, personal
    the clients' own models where they exist; each falls back to the other; a named metric is
    taken as it is, and is missing where the row lacks it."""
    from fedac.experiments.sweep import SweepSpec, metric_of

    both = {"val_accuracy": 0.5, "local_accuracy": 0.7}
    shared, personal = {"val_accuracy": 0.5}, {"local_accuracy": 0.7}

    def spec(metric: str) -> SweepSpec:
        return SweepSpec(None, [], 1, metric=metric)  # type: ignore[arg-type]

    assert [metric_of(spec("auto"), r) for r in (both, shared, personal)] == [
        "val_accuracy",
        "val_accuracy",
        "local_accuracy",
    ]
    assert [metric_of(spec("personal"), r) for r in (both, shared, personal)] == [
        "local_accuracy",
        "val_accuracy",
        "local_accuracy",
    ]
    assert metric_of(spec("val_macro_f1"), both) is None


def test_the_median_pruner_takes_its_start_and_refuses_other_text():
    from fedac.errors import ConfigError
    from fedac.experiments.sweep import median_pruner

    assert median_pruner("median") == (5, 0)
    assert median_pruner("median:2") == (2, 0)
    assert median_pruner("median:2:20") == (2, 20)
    assert median_pruner("none") is None
    for bad in ("median:-1", "median:a", "median:1:2:3", "hyperband", "none:2"):
        with pytest.raises(ConfigError, match="median\\[:STARTUP"):
            median_pruner(bad)


def test_the_sampler_is_tpe_with_its_random_start_or_random_and_refuses_other_text(tmp_path):
    import optuna

    from fedac.errors import ConfigError
    from fedac.experiments.sweep import Search, SweepSpec, open_study, sampler_of

    assert sampler_of("tpe") == ("tpe", 10) and sampler_of("tpe:2") == ("tpe", 2)
    assert sampler_of("random") == ("random", 0)
    for bad in ("tpe:-1", "tpe:a", "tpe:1:2", "random:3", "cmaes"):
        with pytest.raises(ConfigError, match="tpe\\[:STARTUP\\]"):
            sampler_of(bad)
    searches = [Search("train.lr", 0.01, 0.1)]
    for sampler, kind in (("tpe:3", optuna.samplers.TPESampler), ("random", None)):
        (out := tmp_path / sampler.replace(":", "-")).mkdir()
        spec = SweepSpec(out, searches, trials=1, sampler=sampler, progress=False)
        study = open_study(spec, "maximize")
        if kind is None:
            assert isinstance(study.sampler, optuna.samplers.RandomSampler)
        else:
            assert isinstance(study.sampler, kind) and study.sampler._n_startup_trials == 3
