"""`fedac report`: every figure that the README and docs quote, regenerated from committed results.

The figures are declared in `docs/results/figures.yaml`, one entry per quote:

    - doc: README.md                              # the document that quotes it
      file: docs/results/default-run/results.json # committed result (or `files:` for a range over
      several)
      key: final.accuracy                         # dotted path into the JSON (list items by index)
      format: "{:.2%}"                            # how the document writes the value
      quote: "reached {} test accuracy"           # the document's words around it; {} is the value

or, for a `fedac compare` table, `table: compare` with `file:` its summary.json: every row that
`fedac.experiments.compare.markdown_table` renders from the file must appear in the document
verbatim (`table: earlyexit` likewise for an early-exit table's summary.json,
`fedac.experiments.earlyexit.markdown_table`; `table: robustness` for one table of `fedac reproduce
robustness`'s summary.json, chosen by `algorithm:` and `metric:`, `accuracy` or
`attack_success_rate`: the rows of `fedac.experiments.robustness.table_rows`; `table: tuned` for
one dataset's table of `fedac reproduce pfl-tuned`, its tuned.json and `dataset:`, the rows of
`fedac.experiments.pfl.tuned_row`).

A table of one figure per cell, such as a reproduction's mean ± std per method and column, is one
`table: grid` entry rather than a quote per cell:

    - doc: README.md
      table: grid
      files: [docs/results/reproduce-table5/cremad_10pct/summary.json, ...]   # one per column
      format: "{:.2%}"
      std: true                                    # cells are `mean ± std`: `key.0` ± `key.1`
      rows: [["Table 5 (CREMA-D), FedAvg: shared model, test acc.", mean_std.FedAvg.accuracy], ...]

Each row must appear verbatim: `| label | cell | cell | ... |`, a cell being `key.0` (or, without
`std`, `key` itself) of each file in turn.

`fedac report` prints each figure as regenerated; `fedac report --check` exits 1 naming every quote
a document no longer contains (tests/experiments/test_figures.py runs it on this repository).

It also says which quoted results were made by other training code than the current one (version.py:
results.json's `code_version`, a comparison's summary.json each run's `source_sha256`): a `stale:`
line with the command that remakes it. For a result the docs alone quote that is a warning; a result
the README quotes fails `--check` (and so the suite) unless the figures file states why it may stay:

    - stale_ok: docs/results/reproduce-fedkws12-scaled-uniform/speech_commands_DSCNN/summary.json
      reason: "36 runs of 2,000 rounds (about 9 CPU-hours); the FedKWS training path is unchanged"

`fedac report --fresh` exits 1 when a result of `RERUN` (the README's default run) is stale or
records no code: run it before committing a README that quotes it.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fedac.errors import ConfigError
from fedac.version import source_sha256

FIGURES = Path("docs/results/figures.yaml")

#: The results that `fedac report --fresh` requires to come from the current training code, with the
#: command that remakes each: the README's default run, about 90 s on two cores. Other quoted
#: results (reproductions of hours) are only reported when stale.
RERUN = {"docs/results/default-run/results.json": "scripts/default_run.sh"}


@dataclass
class Quote:
    doc: str
    text: str
    """What the document must contain."""
    source: str
    found: bool


def lookup(data: Any, key: str) -> Any:
    """`a.b.0.c` into nested dicts and lists."""
    node = data
    for part in key.split("."):
        if isinstance(node, list):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise ConfigError(f"no '{part}' (of key '{key}') in the result")
    return node


def render_value(entry: dict, root: Path) -> str:
    """The entry's value as the document writes it; several files give `min-max` (one value when
    equal)."""
    files = entry.get("files") or [entry["file"]]
    fmt = entry.get("format", "{}")
    values = sorted(lookup(json.loads((root / f).read_text()), entry["key"]) for f in files)
    low, high = fmt.format(values[0]), fmt.format(values[-1])
    return low if low == high else f"{low}-{high}"


def grid_rows(entry: dict, root: Path) -> list[str]:
    """A `table: grid` entry's rows: `| label | cell | ... |`, a cell per file (`mean ± std` with
    `std: true`)."""
    fmt = entry.get("format", "{}")
    columns = [json.loads((root / f).read_text()) for f in entry["files"]]

    def cell(data: Any, key: str) -> str:
        if entry.get("std"):
            return (
                f"{fmt.format(lookup(data, key + '.0'))} ± {fmt.format(lookup(data, key + '.1'))}"
            )
        return fmt.format(lookup(data, key))

    return [
        f"| {label} | " + " | ".join(cell(data, key) for data in columns) + " |"
        for label, key in entry["rows"]
    ]


def quotes_of(entry: dict, root: Path) -> list[str]:
    if entry.get("table") == "compare":
        # lazy: start-up time (as the two below)
        from fedac.experiments.compare import markdown_table

        summary = json.loads((root / entry["file"]).read_text())
        return markdown_table(summary["runs"]).splitlines()[2:]  # the rows, not the header
    if entry.get("table") == "earlyexit":
        from fedac.experiments.earlyexit import markdown_table as exit_table

        summary = json.loads((root / entry["file"]).read_text())
        return exit_table([(r["dataset"], r["metric"], r["values"]) for r in summary["rows"]])[2:]
    if entry.get("table") == "grid":
        return grid_rows(entry, root)
    if entry.get("table") == "tuned":
        from fedac.experiments.pfl import tuned_row

        kept = json.loads((root / entry["file"]).read_text())
        return [tuned_row(row) for row in kept["datasets"][entry["dataset"]]]
    if entry.get("table") == "robustness":
        # lazy: start-up time (attacks import torch)
        from fedac.experiments.robustness import table_rows

        summary = json.loads((root / entry["file"]).read_text())
        return table_rows(summary, entry["algorithm"], entry["metric"])
    if "table" in entry:
        raise ConfigError(
            f"unknown figure table kind {entry['table']!r} (known: compare, earlyexit, grid, "
            "robustness, tuned)"
        )
    return [entry["quote"].replace("{}", render_value(entry, root))]


def figure_entries(root: Path, figures: Path = FIGURES) -> list[dict]:
    """The figures file's quotes (its `stale_ok` notes left out)."""
    path = root / figures
    if not path.is_file():
        raise ConfigError(f"no figures file at {path}")
    return [e for e in yaml.safe_load(path.read_text()) or [] if "stale_ok" not in e]


def stale_ok(root: Path, figures: Path = FIGURES) -> dict[str, str]:
    """{result file: why it may stay although stale}, from the figures file's `stale_ok` notes."""
    notes = [e for e in yaml.safe_load((root / figures).read_text()) or [] if "stale_ok" in e]
    for note in notes:
        if not str(note.get("reason", "")).strip():
            raise ConfigError(f"{figures}: stale_ok {note['stale_ok']} gives no reason")
    return {note["stale_ok"]: str(note["reason"]) for note in notes}


def collect(root: Path, figures: Path = FIGURES) -> list[Quote]:
    """Every quote of the figures file with whether its document contains it."""
    entries = figure_entries(root, figures)
    docs: dict[str, str] = {}
    out = []
    for entry in entries:
        doc = entry["doc"]
        if doc not in docs:
            docs[doc] = (root / doc).read_text()
        source = ", ".join(entry.get("files") or [entry["file"]]) + (
            f" [{entry['key']}]" if "key" in entry else ""
        )
        out += [Quote(doc, text, source, text in docs[doc]) for text in quotes_of(entry, root)]
    return out


def recorded_code(data: Any) -> list[str | None]:
    """The training-code hashes a result records: results.json's `code_version`, or in a
    comparison's summary.json each run's `source_sha256` (None for a run that records none); [] when
    it records none."""
    if not isinstance(data, dict):
        return []
    if isinstance(data.get("code_version"), dict):
        return [data["code_version"].get("source_sha256")]
    runs = data.get("runs")
    if isinstance(runs, dict) and all(isinstance(rs, list) for rs in runs.values()):
        hashes = [
            r.get("source_sha256") if isinstance(r, dict) else None
            for rs in runs.values()
            for r in rs
        ]
        return hashes if any(hashes) else []
    return []


def freshness(root: Path, file: str, current: str) -> tuple[str, str]:
    """("current", "") when `file` was made by the training code whose hash is `current`, else
    ("stale" or "unrecorded", a line saying why and how to remake it)."""
    path = root / file
    if not path.is_file():
        command: str | None = RERUN.get(file, "the command that made it")
        return "stale", f"stale: {file} does not exist: run `{command}` and commit it"
    data = json.loads(path.read_text())
    hashes = recorded_code(data)
    if hashes and all(h == current for h in hashes):
        return "current", ""
    command = RERUN.get(file) or (data.get("command") if isinstance(data, dict) else None)
    if command is None and (path.parent / "run.json").is_file():
        command = json.loads((path.parent / "run.json").read_text()).get("command")
    fix = (
        f"rerun `{command}` and commit it"
        if command
        else "rerun the command that made it and commit it"
    )
    if not hashes:
        return (
            "unrecorded",
            f"unrecorded: {file} records no code_version (made before fedac recorded one): {fix}",
        )
    made_by = ", ".join(sorted({h[:12] if h else "unrecorded" for h in hashes}))
    version = data.get("code_version") or {}
    if version.get("git_commit"):
        dirty = " with uncommitted changes" if version.get("git_dirty") else ""
        made_by += f" (commit {version['git_commit'][:7]}{dirty})"
    return "stale", (
        f"stale: {file} was produced by training code {made_by}; "
        f"the current training code is {current[:12]}: {fix}"
    )


def quoted_files(root: Path, figures: Path = FIGURES, doc: str | None = None) -> list[str]:
    """The result files the figures file quotes (in document `doc` only, when given)."""
    entries = [e for e in figure_entries(root, figures) if doc is None or e["doc"] == doc]
    return sorted({f for entry in entries for f in entry.get("files") or [entry["file"]]})


def readme_not_current(root: Path, states: dict[str, tuple[str, str]]) -> list[str]:
    """The README's quoted results that record other training code than the current one (or are
    missing), and that no `stale_ok` note excuses: each fails `--check`. (Results made before fedac
    recorded its code are counted apart, as unknown.)"""
    excused = stale_ok(root)
    return [
        file
        for file in quoted_files(root, doc="README.md")
        if states[file][0] == "stale" and file not in excused
    ]


def cmd_report(args: argparse.Namespace) -> int:
    root = Path(args.root)
    quotes = collect(root)
    for q in quotes:
        mark = "ok     " if q.found else "MISSING"
        print(f"{mark} {q.doc}: {q.text}\n        from {q.source}")
    missing = [q for q in quotes if not q.found]
    print(
        f"{len(quotes) - len(missing)} of {len(quotes)} quoted figures match their committed "
        "results"
    )
    current = source_sha256()
    states = {
        file: freshness(root, file, current) for file in sorted({*quoted_files(root), *RERUN})
    }
    # One line each for the stale and for RERUN's; the many results older than code_version,
    # counted.
    unrecorded = [
        file for file, (state, _) in states.items() if state == "unrecorded" and file not in RERUN
    ]
    for file, (state, line) in states.items():
        if state != "current" and file not in unrecorded:
            print(line)
    if unrecorded:
        print(
            f"{len(unrecorded)} quoted result files record no code_version (made before fedac "
            "recorded one): whether their training code is current is unknown"
        )
    for file, reason in stale_ok(root).items():
        if file in states and states[file][0] != "current":
            print(f"stale, may stay: {file}: {reason}")
    readme = readme_not_current(root, states)
    if readme:
        print(
            f"--check: the README quotes {len(readme)} stale result(s) ({', '.join(readme)}): "
            f"remake them (see above), or give each a stale_ok note with its reason in {FIGURES}"
        )
    not_fresh = [file for file in RERUN if states[file][0] != "current"]
    if args.fresh and not_fresh:
        print(
            f"--fresh: {', '.join(not_fresh)} must be remade by the current training code "
            f"({current[:12]})"
        )
    return 1 if (args.check and (missing or readme)) or (args.fresh and not_fresh) else 0


def add_report_parser(sub) -> None:
    p = sub.add_parser(
        "report", help="regenerate the README's quoted figures from committed results"
    )
    p.add_argument("--root", default=".", help="repository root (default: the current directory)")
    p.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when a document no longer quotes a figure, or the README quotes a stale "
        "result without a stale_ok reason",
    )
    p.add_argument(
        "--fresh",
        action="store_true",
        help="exit 1 when the default run's result was made by other training code than the "
        "current (run before committing a README that quotes it; CI runs --check alone)",
    )
    p.set_defaults(func=cmd_report)
