"""The figures the README and docs quote match the committed results they come from (`fedac
report`)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from fedac.cli import main
from fedac.errors import ConfigError
from fedac.experiments.figures import FIGURES, collect, lookup, quoted_files, render_value

REPO = Path(__file__).resolve().parents[2]


def test_every_quoted_figure_matches_its_committed_result():
    quotes = collect(REPO)
    missing = [f"{q.doc}: {q.text!r} (from {q.source})" for q in quotes if not q.found]
    assert not missing, (
        "quoted figures that differ from their results (regenerate with `fedac report`):\n"
        + "\n".join(missing)
    )
    sources = " ".join(q.source for q in quotes)
    assert "docs/results/default-run/results.json [final.accuracy]" in sources


def test_every_results_table_row_of_the_readme_is_tied_to_a_file():
    """A mean ± std typed into a README table by hand, with no figure behind it, fails: both of its
    numbers must lie inside quotes (a whole row, or single figures) found in that row."""
    quoted = [q.text for q in collect(REPO) if q.doc == "README.md"]
    rows = [
        line
        for line in (REPO / "README.md").read_text().splitlines()
        if line.startswith("|") and "±" in line
    ]
    assert rows
    for row in rows:
        inside = [q for q in quoted if q in row]
        pairs = re.findall(r"[\d.]+%? ± [\d.]+%?", row)
        assert pairs, row
        for pair in pairs:
            mean, std = pair.split(" ± ")
            assert any(mean in q for q in inside) and any(std in q for q in inside), (row, pair)


def copy_repo_figures(dest: Path) -> Path:
    """The figures file, its documents and its result files under `dest`."""
    entries = [e for e in yaml.safe_load((REPO / FIGURES).read_text()) if "stale_ok" not in e]
    paths = (
        {str(FIGURES)}
        | {e["doc"] for e in entries}
        | {f for e in entries for f in e.get("files") or [e["file"]]}
    )
    for rel in paths:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, dest / rel)
    return dest


@pytest.mark.slow
def test_report_check_fails_when_the_readme_or_the_result_changes(tmp_path, capsys):
    root = copy_repo_figures(tmp_path)
    # (quotes only: whether the results are fresh is the test below's)
    figures = root / FIGURES
    notes = [
        {"stale_ok": f, "reason": "this test checks the quotes"}
        for f in quoted_files(root, doc="README.md")
    ]
    figures.write_text(figures.read_text() + yaml.safe_dump(notes))
    assert main(["report", "--root", str(root), "--check"]) == 0
    out = capsys.readouterr().out
    # the figure as the committed result gives it (a rerun of the default run changes it)
    accuracy = json.loads((root / "docs/results/default-run/results.json").read_text())["final"][
        "accuracy"
    ]
    quote = f"reached {accuracy:.2%} test accuracy"
    assert f"ok      README.md: {quote}" in out
    assert "MISSING" not in out

    readme = root / "README.md"
    readme.write_text(readme.read_text().replace(quote, "reached 3.90% test accuracy"))
    assert main(["report", "--root", str(root), "--check"]) == 1
    assert f"MISSING README.md: {quote}" in capsys.readouterr().out

    shutil.copy(REPO / "README.md", readme)
    result = root / "docs/results/default-run/results.json"
    data = json.loads(result.read_text())
    data["final"]["macro_f1"] = 0.6
    result.write_text(json.dumps(data))
    assert main(["report", "--root", str(root), "--check"]) == 1
    assert "MISSING README.md: (macro-F1 60.00%)" in capsys.readouterr().out
    assert main(["report", "--root", str(root)]) == 0  # without --check it only prints


def test_values_ranges_and_keys(tmp_path):
    for name, value in (("a", 0.153), ("b", 0.267), ("c", 0.153)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"w": {"floor": [value, 9.0]}}))
    entry = {"key": "w.floor.0", "format": "{:.2f}"}
    assert render_value({**entry, "file": "b.json"}, tmp_path) == "0.27"
    assert render_value({**entry, "files": ["b.json", "a.json"]}, tmp_path) == "0.15-0.27"
    assert render_value({**entry, "files": ["a.json", "c.json"]}, tmp_path) == "0.15"
    assert (
        lookup({"runs": {"FedMLAC w/o ML": [{"accuracy": 0.3}]}}, "runs.FedMLAC w/o ML.0.accuracy")
        == 0.3
    )
    with pytest.raises(ConfigError, match="no 'f1' .of key 'final.f1'"):
        lookup({"final": {"accuracy": 0.3}}, "final.f1")


def test_an_early_exit_table_is_tied_row_by_row(tmp_path):
    """`table: earlyexit`: each row rendered from the table's summary.json must be in the
    document."""
    from fedac.experiments.figures import quotes_of

    rows = [
        {
            "dataset": "speech_commands",
            "metric": "error",
            "values": {"homo FL": [30.0, 32.0], "hetero FedAvg": [36.5]},
        },
        {
            "dataset": "voxceleb1",
            "metric": "EER",
            "values": {"homo FL": [15.25, 14.75], "hetero FedAvg": []},
        },
    ]
    (tmp_path / "summary.json").write_text(json.dumps({"rows": rows}))
    quotes = quotes_of({"table": "earlyexit", "file": "summary.json"}, tmp_path)
    assert quotes == [
        "| speech_commands | error | 31.00 ± 1.00 | 36.50 |",
        "| voxceleb1 | EER | 15.00 ± 0.25 | - |",
    ]
    with pytest.raises(ConfigError, match="known: compare, earlyexit"):
        quotes_of({"table": "other", "file": "summary.json"}, tmp_path)


def test_a_grid_entry_ties_each_whole_row_to_one_figure_per_file(tmp_path):
    """`table: grid` renders `| label | cell | ... |` from a key of each file in turn, by hand
    here."""
    for name, acc in (("a", [0.5, 0.125]), ("b", [0.25, 0.0])):
        (tmp_path / f"{name}.json").write_text(
            json.dumps({"mean_std": {"FedAvg": {"accuracy": acc}}})
        )
    grid = {
        "doc": "README.md",
        "table": "grid",
        "files": ["a.json", "b.json"],
        "format": "{:.2%}",
        "rows": [["FedAvg, test acc.", "mean_std.FedAvg.accuracy"]],
    }
    one_seed = dict(grid, rows=[["FedAvg, seed 0", "mean_std.FedAvg.accuracy.0"]], std=False)
    (tmp_path / "figures.yaml").write_text(yaml.safe_dump([dict(grid, std=True), one_seed]))
    readme = tmp_path / "README.md"
    readme.write_text(
        "| FedAvg, test acc. | 50.00% ± 12.50% | 25.00% ± 0.00% |\n| FedAvg, seed 0 | 50.00% | "
        "25.00% |\n"
    )
    quotes = collect(tmp_path, Path("figures.yaml"))
    assert [q.text for q in quotes] == [
        "| FedAvg, test acc. | 50.00% ± 12.50% | 25.00% ± 0.00% |",
        "| FedAvg, seed 0 | 50.00% | 25.00% |",
    ]
    assert all(q.found for q in quotes)
    readme.write_text(
        "| FedAvg, test acc. | 50.00% ± 12.50% | 25.10% ± 0.00% |\n| FedAvg, seed 0 | 50.00% | "
        "25.00% |\n"
    )
    assert [q.found for q in collect(tmp_path, Path("figures.yaml"))] == [False, True]


def test_a_robustness_entry_ties_each_row_of_one_algorithm_and_metric(tmp_path):
    """`table: robustness` renders one table of `fedac reproduce robustness`'s summary.json, by hand
    here: a cell per aggregator in percent, `(n=k)` for a partial cell, the success rate on the
    clean row (its baseline) and the backdoor rows only."""
    cells = {
        "clean": {
            "FedAvg": {
                "mean": {"accuracy": [0.5, 0.125, 2], "attack_success_rate": [0.03, 0.01, 2]},
                "median": {"accuracy": [0.25, 0.0, 1], "attack_success_rate": [0.02, 0.0, 1]},
            }
        },
        "scale 30%": {
            "FedAvg": {
                "mean": {
                    "accuracy": [0.1, 0.0, 2],
                    "attack_success_rate": [float("nan"), float("nan"), 0],
                },
                "median": {
                    "accuracy": [0.2, 0.0, 2],
                    "attack_success_rate": [float("nan"), float("nan"), 0],
                },
            }
        },
        "backdoor 30%": {
            "FedAvg": {
                "mean": {"accuracy": [0.4, 0.0, 2], "attack_success_rate": [0.9, 0.05, 2]},
                "median": {"accuracy": [0.0, 0.0, 0], "attack_success_rate": [0.0, 0.0, 0]},
            }
        },
    }
    (tmp_path / "summary.json").write_text(
        json.dumps({"command": "", "seeds": [0, 1], "cells": cells})
    )
    entry = {
        "doc": "README.md",
        "table": "robustness",
        "file": "summary.json",
        "algorithm": "FedAvg",
    }
    (tmp_path / "figures.yaml").write_text(
        yaml.safe_dump([dict(entry, metric="accuracy"), dict(entry, metric="attack_success_rate")])
    )
    rows = [
        "| clean | 50.00 ± 12.50 | 25.00 (n=1) |",
        "| scale 30% | 10.00 ± 0.00 | 20.00 ± 0.00 |",
        "| backdoor 30% | 40.00 ± 0.00 | pending |",
        "| clean | 3.00 ± 1.00 | 2.00 (n=1) |",
        "| backdoor 30% | 90.00 ± 5.00 | pending |",
    ]
    (tmp_path / "README.md").write_text("\n".join(rows) + "\n")
    quotes = collect(tmp_path, Path("figures.yaml"))
    assert [q.text for q in quotes] == rows and all(q.found for q in quotes)
    (tmp_path / "README.md").write_text(
        "\n".join(rows[:4]) + "\n| backdoor 30% | 90.00 ± 5.01 | pending |\n"
    )
    assert [q.found for q in collect(tmp_path, Path("figures.yaml"))] == [
        True,
        True,
        True,
        True,
        False,
    ]
    # Without a backdoor row there is no success-rate table, not even the clean baseline.
    from fedac.experiments.robustness import table_rows

    no_backdoor = {
        "seeds": [0, 1],
        "cells": {row: c for row, c in cells.items() if row != "backdoor 30%"},
    }
    assert table_rows(no_backdoor, "FedAvg", "attack_success_rate") == []


def test_no_result_the_readme_quotes_is_stale_without_a_stated_reason():
    """Every result the README quotes was made by the current training code, or the figures file
    says why it may stay (a stale_ok note). After a change of training code: rerun
    scripts/default_run.sh (about a minute) and commit docs/results/default-run/."""
    from fedac.experiments.figures import freshness, quoted_files, readme_not_current
    from fedac.version import source_sha256

    current = source_sha256()
    states = {f: freshness(REPO, f, current) for f in quoted_files(REPO, doc="README.md")}
    stale = readme_not_current(REPO, states)
    assert not stale, "\n".join(states[f][1] for f in stale)


def test_report_check_fails_on_a_stale_readme_result_unless_a_reason_is_given(tmp_path, capsys):
    (tmp_path / "docs/results").mkdir(parents=True)
    (tmp_path / "README.md").write_text("reached 50.00% test accuracy\n")
    result = tmp_path / "docs/results/run.json"
    result.write_text(json.dumps({"code_version": {"source_sha256": "0" * 64}, "acc": 0.5}))
    entry = {"doc": "README.md", "file": "docs/results/run.json", "key": "acc"}
    entry |= {"format": "{:.2%}", "quote": "reached {} test accuracy"}
    figures = tmp_path / FIGURES
    figures.write_text(yaml.safe_dump([entry]))
    assert main(["report", "--root", str(tmp_path), "--check"]) == 1
    assert "the README quotes 1 stale result(s) (docs/results/run.json)" in capsys.readouterr().out
    note = {
        "stale_ok": "docs/results/run.json",
        "reason": "a day of runs; nothing it reads changed",
    }
    figures.write_text(yaml.safe_dump([entry, note]))
    assert main(["report", "--root", str(tmp_path), "--check"]) == 0
    out = capsys.readouterr().out
    assert "stale, may stay: docs/results/run.json: a day of runs; nothing it reads changed" in out
    figures.write_text(yaml.safe_dump([entry, {**note, "reason": " "}]))
    assert main(["report", "--root", str(tmp_path), "--check"]) == 2  # a note needs its reason
    assert "gives no reason" in capsys.readouterr().err
