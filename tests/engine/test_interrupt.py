"""SIGINT / SIGTERM lose nothing (engine/rounds.py): a real `fedac run` signalled mid-run stops at a
round boundary with a checkpoint that the signal itself wrote (train.checkpoint_every is beyond
every round it could stop at), exits 130 / 143 with one line saying how to continue, and resumes to
the parameters and metrics of an uninterrupted run. A second signal abandons the round and keeps the
last checkpoint; the progress inside a round hears of every client."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import fedac.engine.rounds as rounds_module
from fedac import progress
from fedac.algorithms import build_algorithm
from fedac.algorithms.base import ClientData, Task
from fedac.cli import main
from fedac.config import load_config
from fedac.engine.checkpoint import load_checkpoint
from fedac.engine.data import build_federated_data
from fedac.engine.evaluation import Evaluator
from fedac.engine.execution import run_clients, stacking_obstacle
from fedac.engine.simulator import Simulator
from fedac.errors import RunInterrupted
from fedac.training.stacking import client_progress
from helpers import tiny_run

pytestmark = pytest.mark.usefixtures("one_thread")
ROUNDS = 16
NEVER = 1000  # train.checkpoint_every: only the last round and the signal write checkpoints


@pytest.fixture(scope="module")
def settings(gsc_root, tmp_path_factory):
    return {
        **tiny_run(gsc_root, tmp_path_factory.mktemp("interrupt_cache")),
        "train.rounds": ROUNDS,
        "train.local_epochs": 1,
        "train.eval_every": 2,
        "train.checkpoint_every": NEVER,
    }


def config(settings, **extra):
    return load_config(overrides=[f"{k}={v}" for k, v in {**settings, **extra}.items()])


@pytest.fixture(scope="module")
def data(settings):
    return build_federated_data(config(settings), progress=False)


@pytest.fixture(scope="module")
def straight(settings, data, tmp_path_factory):
    """The uninterrupted run: its final parameters and results."""
    sim = Simulator(config(settings), tmp_path_factory.mktemp("straight"), data, progress=False)
    sim.run()
    return sim.state.server["params"], json.loads((sim.run_dir / "results.json").read_text())


def metrics_rounds(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.csv"
    if not path.is_file():
        return []
    with open(path, newline="") as handle:
        return [int(row["round"]) for row in csv.DictReader(handle)]


def fedac(*args: str, **popen) -> subprocess.Popen:
    # a shell's background job starts with SIGINT ignored, and fedac leaves an ignored signal
    # ignored: the child gets the default dispositions whatever the test runner inherited
    def defaults():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)

    return subprocess.Popen(
        [sys.executable, "-m", "fedac.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=defaults,
        **popen,
    )


def interrupt_after_round(
    run_dir: Path, proc: subprocess.Popen, at_least: int, sig: int, timeout: float = 300.0
) -> str:
    """Send `sig` once metrics.csv shows round `at_least`; the process's whole output."""
    deadline = time.monotonic() + timeout
    while not metrics_rounds(run_dir) or metrics_rounds(run_dir)[-1] < at_least:
        if proc.poll() is not None:
            pytest.fail(
                f"fedac run exited ({proc.returncode}) before round {at_least}: "
                f"{proc.stdout.read()}"
            )
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no round {at_least} in metrics.csv after {timeout} s")
        time.sleep(0.02)
    proc.send_signal(sig)
    try:
        return proc.communicate(timeout=timeout)[0]
    finally:
        proc.kill()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signalled_fedac_run_checkpoints_its_round_and_resumes_exactly(
    settings, straight, tmp_path, sig
):
    run_dir = tmp_path / "run"
    proc = fedac(
        "run", "--quiet", "--out", str(run_dir), *[f"--set={k}={v}" for k, v in settings.items()]
    )
    out = interrupt_after_round(run_dir, proc, 2, sig)
    assert proc.returncode == 128 + sig, out  # 130 / 143, the shell's status for the signal
    assert "Traceback" not in out
    # written by the signal: no checkpoint_every boundary came before
    state = load_checkpoint(run_dir)
    stopped = state.round
    assert 2 <= stopped < ROUNDS and not (run_dir / "results.json").exists()
    hint = (
        f"fedac: interrupted after round {stopped} of {ROUNDS}; checkpoint written; continue with: "
        f"fedac run --resume {run_dir}"
    )
    assert [line for line in out.splitlines() if "interrupted" in line] == [hint]
    # metrics.csv holds what the checkpoint's history holds, as at a checkpoint_every boundary
    assert (
        metrics_rounds(run_dir)
        == [int(row["round"]) for row in state.history]
        == list(range(2, stopped + 1, 2))
    )
    if sig == signal.SIGTERM:
        return  # (resuming is the same for both signals: proven once, below)

    resumed = fedac("run", "--resume", str(run_dir), "--quiet")
    out = resumed.communicate(timeout=600)[0]
    assert resumed.returncode == 0, out
    results = json.loads((run_dir / "results.json").read_text())
    assert (results["resumed_from"], results["rounds_trained"]) == (stopped, ROUNDS - stopped)
    params, expected = straight
    final = load_checkpoint(run_dir).server["params"]
    # on the CPU: the checkpoint's tensors load there, the straight run's stay on its device (CUDA
    # on a GPU machine), and torch.equal refuses two devices
    assert final.keys() == params.keys() and all(
        torch.equal(final[k].cpu(), params[k].cpu()) for k in params
    )
    assert results["final"] == expected["final"]
    assert [
        {k: v for k, v in row.items() if k != "wall_seconds"} for row in results["history"]
    ] == [{k: v for k, v in row.items() if k != "wall_seconds"} for row in expected["history"]]


def signals_in_rounds(patch: pytest.MonkeyPatch, sent: dict[int, list[int]]) -> None:
    """Every simulator sends itself the signals `sent[r]` while computing round r, as a user's
    Ctrl-C or kill would."""
    real = Simulator.run_round

    def run_round(self, state, round_idx):
        for sig in sent.get(round_idx, []):
            os.kill(os.getpid(), sig)
        return real(self, state, round_idx)

    patch.setattr(Simulator, "run_round", run_round)


def signal_in_round(
    patch: pytest.MonkeyPatch, at: int, times: int, sig: int = signal.SIGINT
) -> None:
    """`sig` `times` times while computing round `at`."""
    signals_in_rounds(patch, {at: [sig] * times})


def test_second_signal_abandons_the_round_and_keeps_the_last_checkpoint(
    settings, data, tmp_path, monkeypatch
):
    cfg = config(settings, **{"train.checkpoint_every": 2})
    signal_in_round(monkeypatch, at=5, times=2)
    trained = []
    monkeypatch.setattr(Evaluator, "evaluate_round", lambda self, state, r, row: trained.append(r))
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(RunInterrupted) as caught:
        Simulator(cfg, tmp_path, data, progress=False).run()
    exc = caught.value
    assert (exc.round, exc.signum, exc.exit_status) == (4, signal.SIGINT, 130)
    assert str(exc) == (
        f"interrupted during round 5 of {ROUNDS}, which was abandoned; resume starts after round 4 "
        f"of {ROUNDS} (the last checkpoint); continue with: fedac run --resume {tmp_path}"
    )
    assert trained == [2, 4]  # round 5 was cut before its evaluation
    assert load_checkpoint(tmp_path).round == 4 and metrics_rounds(tmp_path) == [2, 4]
    assert signal.getsignal(signal.SIGINT) is before  # the handlers are given back


def test_signal_in_the_final_evaluation_ends_the_run_at_once(settings, data, tmp_path, monkeypatch):
    cfg = config(settings, **{"train.rounds": 2})

    def final_results(self, state):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("the final evaluation went on after the signal")

    monkeypatch.setattr(Simulator, "final_results", final_results)
    with pytest.raises(RunInterrupted) as caught:
        Simulator(cfg, tmp_path, data, progress=False).run()
    assert (caught.value.round, caught.value.during, caught.value.exit_status) == (
        2,
        "the final evaluation",
        143,
    )
    assert load_checkpoint(tmp_path).round == 2 and not (tmp_path / "results.json").exists()


def test_interrupted_comparison_says_to_rerun_it_and_rerunning_resumes(
    settings, tmp_path, monkeypatch, capsys
):
    argv = [
        "compare",
        "--method",
        "A=fedavg",
        "--seeds",
        "0",
        "--rounds",
        "3",
        "--out",
        str(tmp_path),
        "--quiet",
        *[f"--set={k}={v}" for k, v in settings.items() if k != "train.rounds"],
    ]
    with pytest.MonkeyPatch.context() as patch:
        signal_in_round(patch, at=2, times=1)
        assert main(argv) == 130
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "interrupted" in line]
    assert lines == [
        f"fedac: interrupted after round 2 of 3 ({tmp_path / 'A-s0'}); checkpoint written; "
        "continue with: the same command again (runs that ended are read back, this one resumes "
        "from its checkpoint)"
    ]
    assert main(argv) == 0
    assert json.loads((tmp_path / "A-s0" / "results.json").read_text())["resumed_from"] == 2


def test_a_background_job_keeps_sigint_ignored_and_stops_cleanly_on_sigterm(
    settings, data, tmp_path, monkeypatch, capsys
):
    """`fedac run ... &` in a script starts with SIGINT ignored: the rounds leave it ignored
    (engine/rounds.py says why), the estimate names `kill PID` instead of Ctrl-C, and SIGTERM still
    stops at the end of the round with a checkpoint."""
    # (conftest.py's process_state gives the default back after)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signals_in_rounds(monkeypatch, {2: [signal.SIGINT], 3: [signal.SIGTERM]})
    monkeypatch.setattr(rounds_module, "ESTIMATE_ABOVE_S", 0.0)  # every run counts as slow
    with pytest.raises(RunInterrupted) as caught:
        Simulator(config(settings), tmp_path, data, progress=True).run()
    assert (caught.value.round, caught.value.signum, caught.value.exit_status) == (
        3,
        signal.SIGTERM,
        143,
    )
    assert load_checkpoint(tmp_path).round == 3 and metrics_rounds(tmp_path) == [2]
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert f"(kill {os.getpid()} stops cleanly at the end of a round" in capsys.readouterr().out


@pytest.mark.slow
def test_the_signal_tests_pass_in_a_pytest_started_with_sigint_ignored(tmp_path):
    """A background `python -m pytest` (SIGINT ignored, as a script's `cmd &` or `nohup cmd &`
    starts it) runs the tests that send themselves SIGINT as a foreground one does: conftest.py's
    process_state installs Python's handler for every test instead of inheriting SIG_IGN."""
    tests = [
        "test_second_signal_abandons_the_round_and_keeps_the_last_checkpoint",
        "test_interrupted_comparison_says_to_rerun_it_and_rerunning_resumes",
    ]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--basetemp={tmp_path / 'tmp'}",
            *[f"{__file__}::{name}" for name in tests],
        ],
        cwd=Path(__file__).parents[2],
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert proc.returncode == 0 and f"{len(tests)} passed" in proc.stdout, (
        proc.stdout[-3000:] + proc.stderr[-2000:]
    )


def test_ctrl_c_outside_the_rounds_is_one_line_and_status_130(
    settings, tmp_path, monkeypatch, capsys
):
    def building(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("fedac.engine.simulator.build_federated_data", building)
    assert (
        main(
            [
                "run",
                "--quiet",
                "--out",
                str(tmp_path / "run"),
                *[f"--set={k}={v}" for k, v in settings.items()],
            ]
        )
        == 130
    )
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedac: interrupted outside the training rounds") and "\n" not in err


def test_round_progress_hears_every_client_and_slow_runs_get_an_estimate(
    settings, data, tmp_path, monkeypatch, capsys
):
    updates: list[tuple[str, int]] = []

    class Recording(progress.LogLines):  # (capsys: stderr is no terminal)
        def update(self, n=1):
            updates.append((self.desc, n))
            return super().update(n)

    monkeypatch.setattr(progress, "LogLines", Recording)
    monkeypatch.setattr(rounds_module, "ESTIMATE_ABOVE_S", 0.0)  # every run counts as slow
    sim = Simulator(config(settings, **{"train.rounds": 2}), tmp_path, data, progress=True)
    sim.run()
    for r in (1, 2):
        assert sum(n for desc, n in updates if desc == f"round {r}") == sim.cohort_size > 1
    assert re.search(
        r"^round 1 took [\d.]+ s; 1 more round: about \d+ min \(Ctrl-C stops cleanly",
        capsys.readouterr().out,
        re.M,
    )


@pytest.mark.parametrize("execution,workers", [("sequential", 1), ("cohort", 1), ("cohort", 2)])
def test_client_progress_counts_each_client_once(execution, workers):
    g = torch.Generator().manual_seed(0)
    sizes = [12, 5, 9, 3, 7]
    datas = [
        ClientData(
            f"c{i}",
            torch.randn(n, 8, 21, generator=g),
            torch.randint(0, 3, (n,), generator=g),
            torch.zeros(0, 8, 21),
            torch.zeros(0, dtype=torch.long),
        )
        for i, n in enumerate(sizes)
    ]
    cfg = load_config(
        overrides=[
            "model.name=crnn_lite",
            "train.local_epochs=1",
            f"runtime.execution={execution}",
            "runtime.cohort_chunk=2",
            f"runtime.cohort_workers={workers}",
        ]
    )
    algo = build_algorithm(cfg, Task(8, 3, [d.name for d in datas]))
    if execution == "cohort":
        assert stacking_obstacle(algo) is None
    calls: list[int] = []
    with client_progress(calls.append):
        results = run_clients(
            algo, algo.broadcast(algo.init_server()), [None] * len(datas), datas, 1, 0
        )
    assert len(results) == sum(calls) == len(datas)
    # a chunk at once
    assert calls == [1] * len(datas) if execution == "sequential" else max(calls) == 2
    run_clients(algo, algo.broadcast(algo.init_server()), [None] * len(datas), datas, 1, 0)
    assert sum(calls) == len(datas)  # outside client_progress nothing is counted
