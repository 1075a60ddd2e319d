"""A run directory's files compare byte for byte: every CSV fedac writes ends its lines with "\\n",
and a run interrupted by a signal and resumed writes the same clients.csv, metrics.csv (its wall
column aside) and results.json (its timings and resume record aside) as the uninterrupted run."""

from __future__ import annotations

import ast
import csv
import io
import json
import os
import signal
from pathlib import Path

import pytest

from fedac.config import load_config
from fedac.engine.data import build_federated_data
from fedac.engine.report import append_client_rows, truncate_client_rows
from fedac.engine.simulator import Simulator
from fedac.errors import RunInterrupted
from helpers import tiny_run

pytestmark = pytest.mark.usefixtures("one_thread")
SRC = Path(__file__).resolve().parents[2] / "src" / "fedac"
ROUNDS = 4


def test_every_csv_writer_in_src_ends_lines_with_newline():
    """The csv module's default line ending is "\\r\\n"; every writer in src/ says "\\n"."""
    calls = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            func = node.func if isinstance(node, ast.Call) else None
            if isinstance(func, ast.Attribute) and func.attr in ("writer", "DictWriter"):
                if isinstance(func.value, ast.Name) and func.value.id == "csv":
                    ending = {k.arg: k.value for k in node.keywords}.get("lineterminator")
                    # (or, appending to a file, that file's own ending: tested below)
                    ok = (isinstance(ending, ast.Constant) and ending.value == "\n") or (
                        isinstance(ending, ast.Name) and ending.id == "ending"
                    )
                    calls.append((f"{path.relative_to(SRC)}:{node.lineno}", ok))
    assert len(calls) >= 10  # (the walk finds them)
    assert [where for where, ok in calls if not ok] == []


def test_a_resumed_clients_csv_keeps_the_line_ending_it_began_with(tmp_path):
    """A run directory written before "\\n" endings (the csv module's "\\r\\n") stays one-ended
    through a resume's truncation and append."""
    (tmp_path / "clients.csv").write_bytes(b"round,client,accuracy\r\n1,a,0.5\r\n2,a,0.75\r\n")
    truncate_client_rows(tmp_path, 1)
    append_client_rows(tmp_path, ["round", "client", "accuracy"], [{"round": 2, "client": "a"}])
    expected = b"round,client,accuracy\r\n1,a,0.5\r\n2,a,\r\n"
    assert (tmp_path / "clients.csv").read_bytes() == expected


@pytest.fixture(scope="module")
def settings(gsc_root, tmp_path_factory):
    return {
        **tiny_run(gsc_root, tmp_path_factory.mktemp("run_files_cache")),
        "train.rounds": ROUNDS,
        "train.local_epochs": 1,
        "train.eval_every": 2,
        "train.checkpoint_every": 1000,  # only the signal and the last round write checkpoints
    }


def without(rows: list[dict], *keys: str) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in keys} for row in rows]


def metrics_rows(run_dir: Path) -> list[dict]:
    text = (run_dir / "metrics.csv").read_bytes().decode()
    assert "\r" not in text
    return without(list(csv.DictReader(io.StringIO(text))), "wall_seconds")


#: results.json's keys that say how the run went rather than what it computed.
HOW_IT_RAN = ("wall_seconds", "resumed_from", "rounds_trained", "code_version", "execution")


def results(run_dir: Path) -> dict:
    data = json.loads((run_dir / "results.json").read_text())
    data["history"] = without(data["history"], "wall_seconds")
    return {k: v for k, v in data.items() if k not in HOW_IT_RAN}


def test_a_signalled_and_resumed_run_writes_the_uninterrupted_files(
    settings, tmp_path, monkeypatch
):
    cfg = load_config(overrides=[f"{k}={v}" for k, v in settings.items()])
    data = build_federated_data(cfg, progress=False)
    straight, run = tmp_path / "straight", tmp_path / "run"
    Simulator(cfg, straight, data, progress=False).run()

    real = Simulator.run_round

    def run_round(self, state, round_idx):  # Ctrl-C while round 3 trains, past round 2's eval
        if round_idx == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return real(self, state, round_idx)

    with monkeypatch.context() as patch:
        patch.setattr(Simulator, "run_round", run_round)
        with pytest.raises(RunInterrupted):
            Simulator(cfg, run, data, progress=False).run()
    assert not (run / "results.json").exists()
    Simulator(cfg, run, data, progress=False).run(resume=True)

    assert b"\r" not in (straight / "clients.csv").read_bytes()
    assert (run / "clients.csv").read_bytes() == (straight / "clients.csv").read_bytes()
    assert metrics_rows(run) == metrics_rows(straight)
    resumed = json.loads((run / "results.json").read_text())
    assert (resumed["resumed_from"], resumed["rounds_trained"]) == (3, ROUNDS - 3)
    assert results(run) == results(straight)
