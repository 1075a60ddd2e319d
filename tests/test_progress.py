"""Progress written to a file or pipe (fedac/progress.py): whole lines, no cursor escapes, a bounded
number of them; a terminal still gets tqdm's bars."""

from __future__ import annotations

import io
import subprocess
import sys
import time

import pytest

from fedac import progress
from fedac.progress import LogLines
from helpers import tiny_run


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(progress.time, "monotonic", fake)
    return fake


def lines_of(stream: io.StringIO) -> list[str]:
    text = stream.getvalue()
    assert "\r" not in text and "\x1b" not in text
    return text.splitlines()


def test_a_file_gets_a_line_per_interval_and_the_last_one(clock):
    out = io.StringIO()
    bar = LogLines(None, 300, "synth", "task", 0, True, 0.0, False, out, every=10.0)
    for _ in range(300):  # 300 tasks over 30 s: a line at 10, 20 and 30 s, none in between
        clock.now += 0.1
        bar.update()
    bar.close()
    assert lines_of(out) == [
        "synth: 100/300 tasks, 00:10 elapsed, ~00:20 left",
        "synth: 200/300 tasks, 00:20 elapsed, ~00:10 left",
        "synth: 300/300 tasks, 00:30 elapsed",
    ]


def test_a_fast_transient_bar_writes_nothing_and_a_kept_one_its_end(clock):
    out = io.StringIO()
    with LogLines(None, 4, "round 1", "client", 0, False, 2.0, False, out, every=10.0) as bar:
        for _ in range(4):
            clock.now += 1.0
            bar.update()
    assert lines_of(out) == []
    kept = LogLines(None, 50, "fedavg rounds", "round", 10, True, 0.0, False, out, every=10.0)
    kept.set_postfix({"val_accuracy": "0.500"})
    clock.now += 3.0
    kept.update()  # a resumed run: the rate counts the rounds of this sitting only
    kept.close()  # interrupted: the count it reached
    assert lines_of(out) == [
        "fedavg rounds: 11/50 rounds, 00:03 elapsed, ~01:57 left, val_accuracy=0.500"
    ]


def test_a_heartbeat_bar_writes_while_nothing_finishes():
    out = io.StringIO()
    bar = LogLines(None, 8, "round 3", "client", 0, False, 0.0, True, out, every=0.05)
    time.sleep(0.4)
    bar.close()
    lines = lines_of(out)
    assert 3 <= len(lines) <= 9, lines
    assert all(line.startswith("round 3: 0/8 clients, 00:00 elapsed") for line in lines)
    assert not bar._ticker.is_alive()


def test_a_terminal_gets_tqdm_and_a_file_gets_lines(monkeypatch):
    from tqdm import tqdm

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    assert isinstance(progress.bar(total=3, desc="x"), tqdm)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert isinstance(progress.bar(total=3, desc="x"), LogLines)
    assert isinstance(progress.bar(total=3, desc="x", disable=True), tqdm)  # (silent)


def test_a_synthesis_of_300_tasks_writes_one_line(capsys):
    from fedac.data.layout import run_tasks

    assert run_tasks(abs, list(range(-300, 0)), 1, "synth numbers", True) == list(range(300, 0, -1))
    (line,) = lines_of(io.StringIO(capsys.readouterr().err))
    assert line.startswith("synth numbers: 300/300 tasks, ")


@pytest.mark.slow
def test_fedac_run_logged_to_a_pipe_has_no_cursor_escapes(gsc_root, tmp_path):
    rounds = 4
    settings = {**tiny_run(gsc_root, tmp_path / "cache"), "train.rounds": rounds}
    done = subprocess.run(
        [sys.executable, "-m", "fedac", "run", "--out", str(tmp_path / "run")]
        + [f"--set={k}={v}" for k, v in settings.items()],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout
    lines = lines_of(io.StringIO(done.stdout))
    assert all(line.strip() for line in lines), "a blank line"
    progress_lines = [line for line in lines if line.startswith("fedavg rounds:")]
    assert 1 <= len(progress_lines) <= rounds
    assert progress_lines[-1].startswith(f"fedavg rounds: {rounds}/{rounds} rounds")
    assert len(lines) <= rounds + 20  # the start, features, the table of results


@pytest.mark.parametrize("before, said", [(0.0, False), (200.0, True)])
def test_the_estimate_counts_the_time_before_the_first_round(
    monkeypatch, capsys, tmp_path, before, said
):
    """A 3-round run of 40 s rounds takes 2 min: no estimate; after 200 s of reading and caching
    its data the command takes 5.3 min in all, over ESTIMATE_ABOVE_S: the estimate says so."""
    from types import SimpleNamespace

    from fedac.engine import rounds

    clock = [0.0]
    monkeypatch.setattr(rounds, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(progress, "seconds_before_run", lambda: before)
    with rounds.RoundLoop(tmp_path, 3, 0, "x rounds", True, None) as loop:
        with loop.round(1, 1):
            clock[0] += 40.0
        loop.end_round(1, lambda: None, boundary=False)
    out = capsys.readouterr().out
    assert said == out.startswith(
        "round 1 took 40.0 s; 2 more rounds: about 1 min (Ctrl-C stops cleanly at the end of a "
        "round; the run resumes from there); 5 min in all with the 200 s before round 1"
    )
    assert said == bool(out)
