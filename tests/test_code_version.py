"""Results record the training code that made them (version.py) and `fedac report` says when a
quoted one was made by other code (experiments/figures.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedac import __version__
from fedac.cli import main
from fedac.config import Config
from fedac.engine.report import write_results
from fedac.experiments import figures
from fedac.experiments.figures import RERUN
from fedac.version import NOT_TRAINING, PACKAGE, git_state, source_sha256, training_files

DEFAULT_RUN = "docs/results/default-run/results.json"


def package_copy(dest: Path) -> Path:
    """The package's sources under `dest` (not the 11 MB encoder weights, which the hash never
    reads)."""
    shutil.copytree(
        PACKAGE, dest, ignore=shutil.ignore_patterns("__pycache__", "_build", "*.safetensors")
    )
    return dest


def test_the_training_code_is_every_module_but_the_presentation_layer():
    files = training_files()
    for rel in (
        "engine/simulator.py",
        "config.py",
        "experiments/compare.py",
        "experiments/reproduce.py",
        "experiments/robustness.py",
        "experiments/fedmlac.py",
        "kernels/gru.cpp",
        "models/pretrained/w2v2_s/pretrain.json",
        "data/synth/speech_commands.py",
    ):
        assert rel in files, rel
    for rel in (
        "cli.py",
        "engine/report.py",
        "experiments/figures.py",
        "version.py",
        "models/pretrained/w2v2_s/README.md",
        "models/pretrained/w2v2_s/model.safetensors",
    ):
        assert rel not in files, rel
    assert not [f for f in files if "__pycache__" in f or "_build" in f]
    # no stale names in the excluded set
    assert set(NOT_TRAINING) <= {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")}


def test_the_hash_changes_with_the_training_code_only(tmp_path):
    root = package_copy(tmp_path / "fedac")
    before = source_sha256(root)
    assert before == source_sha256(root) and len(before) == 64
    for rel in (
        "engine/simulator.py",
        "kernels/gru.cpp",
        "models/pretrained/w2v2_s/pretrain.json",
        "experiments/compare.py",
    ):
        original = (root / rel).read_bytes()
        (root / rel).write_bytes(original + b"\n")
        assert source_sha256(root) != before, rel
        (root / rel).write_bytes(original)
        assert source_sha256(root) == before, rel
    for rel in ("cli.py", "engine/report.py", "experiments/figures.py"):
        (root / rel).write_text("# another presentation\n")
    for rel in (
        "NOTES.md",
        "kernels/_build/cpu/helper.py",
        "__pycache__/x.py",
        "models/pretrained/w2v2_s/README.md",
    ):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x = 1\n")
    assert source_sha256(root) == before
    # a new module counts, so does a moved one
    (root / "algorithms/new_rule.py").write_text("x = 1\n")
    added = source_sha256(root)
    assert added != before
    (root / "algorithms/new_rule.py").rename(root / "algorithms/renamed.py")
    assert source_sha256(root) not in (before, added)
    (root / "algorithms/renamed.py").unlink()
    # Line endings do not count: a Windows checkout of the same commit hashes the same.
    seeding = root / "seeding.py"
    seeding.write_bytes(seeding.read_bytes().replace(b"\n", b"\r\n"))
    assert source_sha256(root) == before


def test_the_hash_is_fast_and_imports_neither_torch_nor_numpy():
    code = (
        "import sys, time; from fedac.version import source_sha256; t = time.perf_counter(); "
        "source_sha256(); print(time.perf_counter() - t, 'torch' in sys.modules or 'numpy' in "
        "sys.modules)"
    )
    seconds, heavy = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert heavy == "False"
    # ~5-35 ms on two busy cores; the bound leaves room for a loaded CI machine
    assert float(seconds) < 0.5


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_state_of_a_checkout_an_ignored_install_and_no_repository(tmp_path, monkeypatch):
    assert git_state(package_copy(tmp_path / "plain" / "fedac")) == (None, None)  # not a repository
    repo = tmp_path / "repo"
    package = package_copy(repo / "src" / "fedac")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "c"], check=True)
    head = subprocess.run(
        [*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert git_state(package) == (head, False)
    (package / "cli.py").write_text("# presentation only\n")
    (package / "NOTES.md").write_text("notes\n")
    assert git_state(package) == (head, False)
    (package / "algorithms" / "new_rule.py").write_text("x = 1\n")  # untracked training code
    assert git_state(package) == (head, True)
    (package / "algorithms" / "new_rule.py").unlink()
    (package / "rules" / "aggregation.py").write_text("# changed\n")
    assert git_state(package) == (head, True)
    # A package git does not track (installed into a repository's ignored virtualenv) is no
    # checkout.
    (repo / ".gitignore").write_text("venv/\n")
    assert git_state(package_copy(repo / "venv" / "fedac")) == (None, None)
    monkeypatch.setenv("PATH", str(tmp_path / "no-git-here"))
    assert git_state(package) == (None, None)


def written_results(run_dir: Path) -> dict:
    """write_results of a hand-made run into `run_dir`; the code_version its results.json
    records."""
    run_dir.mkdir(exist_ok=True)
    results = {
        "algorithm": "fedavg",
        "dataset": "speech_commands",
        "final": {"accuracy": 0.5},
        "history": [{"round": 1.0, "val_accuracy": 0.5, "train_loss": 1.0}],
    }
    write_results(run_dir, results, Config())
    recorded = json.loads((run_dir / "results.json").read_text())["code_version"]
    assert results["code_version"] == recorded  # what compare keeps of the run says the same
    return recorded


def test_results_json_records_the_code_that_made_it(tmp_path):
    before = source_sha256()
    recorded = written_results(tmp_path)
    # (either side of the write: in a shared working tree another edit may land in between)
    assert recorded["fedac"] == __version__ and recorded["source_sha256"] in (
        before,
        source_sha256(),
    )
    assert set(recorded) == {"fedac", "source_sha256", "git_commit", "git_dirty"}


def test_a_result_of_the_current_code_is_fresh(tmp_path, capsys):
    recorded = written_results(tmp_path / "run")
    root = report_root(tmp_path / "repo", {"code_version": recorded}, [recorded["source_sha256"]])
    code, out = report(root, capsys, "--check", "--fresh")
    assert code == 0 and "stale" not in out and "unrecorded" not in out


def report_root(tmp_path: Path, default_run: dict, summary_hashes: list[str | None]) -> Path:
    """A repository of three quoted results: the default run, a comparison's summary.json with each
    run's training-code hash, and an old result that records none."""
    results = {
        DEFAULT_RUN: {"final": {"accuracy": 0.6}, **default_run},
        "docs/results/cmp/summary.json": {
            "runs": {"FedAvg": [{"accuracy": 0.5, "source_sha256": h} for h in summary_hashes]}
        },
        "docs/results/old/results.json": {"final": {"accuracy": 0.7}},
    }
    for rel, data in results.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(json.dumps(data))
    entries = [
        {
            "doc": "README.md",
            "file": DEFAULT_RUN,
            "key": "final.accuracy",
            "format": "{:.2f}",
            "quote": "a {}",
        },
        {
            "doc": "README.md",
            "file": "docs/results/cmp/summary.json",
            "key": "runs.FedAvg.0.accuracy",
            "format": "{:.2f}",
            "quote": "b {}",
        },
        {
            "doc": "README.md",
            "file": "docs/results/old/results.json",
            "key": "final.accuracy",
            "format": "{:.2f}",
            "quote": "c {}",
        },
    ]
    (tmp_path / "docs/results/figures.yaml").write_text(yaml.safe_dump(entries))
    (tmp_path / "README.md").write_text("a 0.60, b 0.50, c 0.70\n")
    return tmp_path


def report(root: Path, capsys, *flags: str) -> tuple[int, str]:
    code = main(["report", "--root", str(root), *flags])
    return code, capsys.readouterr().out


def test_report_says_which_quoted_results_other_training_code_made(tmp_path, capsys, monkeypatch):
    current, other = "c" * 64, "0" * 64
    # the training code of now, by hand
    monkeypatch.setattr(figures, "source_sha256", lambda: current)
    version = {"fedac": __version__, "git_commit": "abc1234def", "git_dirty": False}
    root = report_root(
        tmp_path / "fresh", {"code_version": {**version, "source_sha256": current}}, [current]
    )
    code, out = report(root, capsys, "--check", "--fresh")
    assert code == 0 and "stale" not in out
    # the old result: counted, not failed
    assert "1 quoted result files record no code_version" in out

    root = report_root(
        tmp_path / "stale", {"code_version": {**version, "source_sha256": other}}, [current, other]
    )
    code, out = report(root, capsys, "--check")
    # a figure README.md quotes made by other training code fails the check (unless
    # docs/results/figures.yaml's `stale_ok` says why it may stay)
    assert code == 1
    assert (
        f"stale: {DEFAULT_RUN} was produced by training code 000000000000 (commit abc1234); the "
        f"current training code is {current[:12]}: rerun `{RERUN[DEFAULT_RUN]}` and commit it"
    ) in out
    assert (
        "stale: docs/results/cmp/summary.json was produced by training code 000000000000, "
        f"{current[:12]};" in out
    )
    code, out = report(root, capsys, "--check", "--fresh")
    assert code == 1 and f"--fresh: {DEFAULT_RUN} must be remade" in out

    root = report_root(tmp_path / "unrecorded", {}, [None])
    code, out = report(root, capsys, "--fresh")
    assert code == 1 and f"unrecorded: {DEFAULT_RUN} records no code_version" in out
    assert "2 quoted result files record no code_version" in out  # the old result and the summary


def test_the_default_run_folder_says_how_to_remake_it():
    repo = PACKAGE.parents[1]
    script = repo / RERUN[DEFAULT_RUN]
    if not script.is_file():
        pytest.skip("not a source checkout")
    assert os.access(script, os.X_OK)
    assert RERUN[DEFAULT_RUN] in (repo / "docs/results/default-run/README.md").read_text()
