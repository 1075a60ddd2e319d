"""Run directories and config.yaml files written by older fedac still load and resume with today's
code.

tests/data/old_runs/ holds config.yaml files committed to docs/results at points across the history
(the oldest, zero-shot ones from before zero-shot read train.rounds, FedKWS-UI, early exit, the last
before the layer refactor) and three small run directories that old code stopped after round 2
(README.md there says which commit wrote each, and the exact commands). Nothing here may be
regenerated with today's code: the point is what the old code wrote.

Those numbers were written on another machine, so they are compared to a stated tolerance (REL); the
mechanics of the resume (rounds trained, the checkpoint's round, the files written, the keys of
every result) exactly. tests/test_portability.py reruns this module under other kernel choices."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import yaml

from fedac import config as config_mod
from fedac.cli import main
from fedac.config import RENAMED, Config, load_config
from fedac.engine.checkpoint import load_checkpoint
from fedac.training.device import resolve_device
from helpers import compute_overrides, numbers_differ

OLD = Path(__file__).parents[1] / "data" / "old_runs"
CONFIGS = sorted((OLD / "configs").glob("*.yaml"))
RUNS = sorted(path.parent for path in OLD.glob("*/checkpoint.pt"))
#: The round count each old zero-shot file means: it holds train.rounds 50 (the then unused global
#: default) beside zeroshot.rounds 0 ("the scenario's rounds"), and keeps meaning the scenario's.
ZEROSHOT_ROUNDS = {"homogeneous": 10, "heterogeneous": 30}
#: Files a resumed run writes that the old run directories do not hold.
NEW_FILES = ("results.json", "curves.png", "clients.csv", "clients.png", "confusion.png")
#: metrics.csv columns left out of the comparison: the wall clock, and the byte counts that the old
#: code did not record (their cumulative totals are NaN after a resume from such a checkpoint).
NOT_COMPARED = {
    "wall_seconds",
    "download_bytes",
    "upload_bytes",
    "upload_bytes_per_client",
    "download_bytes_total",
    "upload_bytes_total",
}
#: Relative tolerance of the numbers in expected/*.json, which the old code wrote on another
#: machine. Measured (torch 2.13.0 CPU, three resumed runs): between the writer's machine and an AMD
#: EPYC with AVX-512 the resumed rounds' train_loss differs by up to 1.8e-6 relative, every other
#: number not at all; on one machine ATEN_CPU_CAPABILITY=default, 2 threads instead of 1, the fused
#: instead of the torch GRU, or MKL_CBWR move it by up to 5e-8. 1e-4 is ~50x the spread between
#: machines; a 1 % change of train.lr moves round 4's train_loss by 4e-4 (fedmlac) to 7.5e-4
#: (fedavg), and a count (a round, clients, a correct prediction in an accuracy) that changes by one
#: moves its value by more than 1e-4: both are still caught.
REL = 1e-4


#: New name -> the old name an old file holds it under.
OLD_NAMES = {new: old for old, new in RENAMED.items()}


def leaves(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def assert_noticed(old: list[str], caplog) -> None:
    """One warning line per old name, naming its new name."""
    notices = [r.getMessage() for r in caplog.records if r.name == "fedac.config"]
    assert old and len(notices) == len(old)
    for key in old:
        assert sum(f" {key} is now {RENAMED[key]} " in line for line in notices) == 1


def test_the_committed_old_files_are_there():
    assert len(CONFIGS) >= 5 and len(RUNS) >= 3
    # keep the clone small
    assert sum(p.stat().st_size for p in OLD.rglob("*") if p.is_file()) < 2_000_000


@pytest.mark.parametrize(
    "path",
    CONFIGS + [run / "config.yaml" for run in RUNS],
    ids=lambda p: p.parent.name + "/" + p.name,
)
def test_an_old_config_loads_to_what_it_says(path, monkeypatch, caplog):
    raw = yaml.safe_load(path.read_text())
    monkeypatch.setattr(config_mod, "_NOTICED", set())
    with caplog.at_level(logging.WARNING, logger="fedac.config"):
        cfg = load_config(path)
    # a setting written under its old name is read under the new one, with one notice naming it
    said = {RENAMED.get(key, key): value for key, value in leaves(raw).items()}
    assert_noticed([key for key in leaves(raw) if key in RENAMED], caplog)
    got, builtin = leaves(cfg.to_dict()), leaves(Config().to_dict())
    assert (
        cfg.algorithm == raw["algorithm"]
        and cfg.dataset == raw["dataset"]
        and cfg.seed == raw["seed"]
    )
    assert cfg.model.name == raw["model"]["name"] and cfg.train.lr == raw["train"]["lr"]
    if cfg.algorithm == "zeroshot" and raw["zeroshot"]["rounds"] == 0:
        rounds = ZEROSHOT_ROUNDS[raw["zeroshot"]["scenario"]]
        assert (cfg.train.rounds, cfg.zeroshot.rounds) == (rounds, rounds)
        del said["train.rounds"], said["zeroshot.rounds"]
    # Every setting the file holds is loaded as written (a setting renamed or dropped since would
    # fail to load).
    assert {key: got[key] for key in said} == said
    # A setting added since takes its built-in default, never an algorithm's own default
    # (RUN_DEFAULTS in settings/<name>.py): the file's run trained without it.
    added = {
        key: got[key]
        for key in got
        if key not in said and key not in ("train.rounds", "zeroshot.rounds")
    }
    assert added == {key: builtin[key] for key in added}


@pytest.mark.slow
@pytest.mark.parametrize("old", RUNS, ids=lambda p: p.name)
def test_an_old_run_directory_resumes_to_its_end(old, tmp_path, monkeypatch, capsys, caplog):
    # config.yaml's `out` is relative: nothing may land there but the copy
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "copy"
    shutil.copytree(old, run)
    # how to compute, never what (tests/test_portability.py's variants), written as the old file
    # names it
    compute = compute_overrides()
    raw = yaml.safe_load((run / "config.yaml").read_text())
    for key, value in compute.items():
        section, name = OLD_NAMES.get(key, key).split(".")
        raw[section][name] = yaml.safe_load(value)
    (run / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    stopped_at = len((old / "metrics.csv").read_text().splitlines()) - 1
    monkeypatch.setattr(config_mod, "_NOTICED", set())
    with caplog.at_level(logging.WARNING, logger="fedac.config"):
        assert main(["run", "--resume", str(run), "--quiet"]) == 0, capsys.readouterr().err
    # the old names it holds (train.threads, ...) are read as runtime.*, each said once
    assert_noticed([key for key in leaves(raw) if key in RENAMED], caplog)
    results = json.loads((run / "results.json").read_text())
    cfg = load_config(run / "config.yaml")
    assert {key: str(value) for key, value in compute.items()} == {
        key: str(getattr(getattr(cfg, key.split(".")[0]), key.split(".")[1])) for key in compute
    }
    rounds = load_config(old / "config.yaml").train.rounds
    trained = (results["rounds"], results["resumed_from"], results["rounds_trained"])
    # resumed at its checkpoint, not restarted
    assert trained == (rounds, stopped_at, rounds - stopped_at)
    assert load_checkpoint(run).round == rounds
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy"]
    # What today's code writes beside the old files: the final results and figures, and the
    # per-client record the old code did not keep (confusion.png only where the method has a shared
    # classifier).
    written = {p.name for p in run.iterdir()} - {p.name for p in old.iterdir()}
    assert {"results.json", "curves.png", "clients.csv", "clients.png"} <= written <= set(NEW_FILES)
    # The old code's own uninterrupted run of the same settings (on the CPU): resuming across
    # versions changed nothing. The mechanics exactly: the rounds evaluated and the keys of every
    # row and of the final results.
    expected = json.loads((OLD / "expected" / f"{old.name}.json").read_text())
    history = [
        {k: v for k, v in row.items() if k not in NOT_COMPARED} for row in results["history"]
    ]
    assert [row["round"] for row in history] == [row["round"] for row in expected["history"]]
    assert [sorted(row) for row in history] == [sorted(row) for row in expected["history"]]
    assert set(expected["final"]) <= set(results["final"])
    if resolve_device(cfg.runtime.device).type != "cpu":
        # FEDAC_TEST_DEVICE=cuda: the GPU's rounding was never measured against these CPU numbers
        return
    final = {key: results["final"][key] for key in expected["final"]}
    differ = numbers_differ(history, expected["history"], REL, "history") + numbers_differ(
        final, expected["final"], REL, "final"
    )
    assert not differ, (
        f"today's code trains the old run's rounds differently (see README.md there): {differ}"
    )
