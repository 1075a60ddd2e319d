"""`fedac report`: every figure that the README and docs quote, regenerated from committed results.

The figures are declared in `docs/results/figures.yaml`, one entry per quote:

    - doc: README.md                              # the document that quotes it
      file: docs/results/default-run/results.json # committed result (or `files:` for a range over several)
      key: final.accuracy                         # dotted path into the JSON (list items by index)
      format: "{:.2%}"                            # how the document writes the value
      quote: "reached {} test accuracy"           # the document's words around it; {} is the value

or, for a `fedac compare` table, `table: compare` with `file:` its summary.json: every row that
`fedac.compare.markdown_table` renders from the file must appear in the document verbatim (`table:
earlyexit` likewise for an early-exit table's summary.json, `fedac.earlyexit_tables.markdown_table`;
`table: robustness` for one table of `fedac reproduce robustness`'s summary.json, chosen by `algorithm:`
and `metric:`, `accuracy` or `attack_success_rate`: the rows of `fedac.robustness.table_rows`).

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

`fedac report` prints each figure as regenerated; `fedac report --check` exits 1 naming every quote a
document no longer contains (tests/test_figures.py runs it on this repository).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fedac.errors import ConfigError

FIGURES = Path("docs/results/figures.yaml")


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
    """The entry's value as the document writes it; several files give `min-max` (one value when equal)."""
    files = entry.get("files") or [entry["file"]]
    fmt = entry.get("format", "{}")
    values = sorted(lookup(json.loads((root / f).read_text()), entry["key"]) for f in files)
    low, high = fmt.format(values[0]), fmt.format(values[-1])
    return low if low == high else f"{low}-{high}"


def grid_rows(entry: dict, root: Path) -> list[str]:
    """A `table: grid` entry's rows: `| label | cell | ... |`, a cell per file (`mean ± std` with `std: true`)."""
    fmt = entry.get("format", "{}")
    columns = [json.loads((root / f).read_text()) for f in entry["files"]]

    def cell(data: Any, key: str) -> str:
        if entry.get("std"):
            return f"{fmt.format(lookup(data, key + '.0'))} ± {fmt.format(lookup(data, key + '.1'))}"
        return fmt.format(lookup(data, key))

    return [f"| {label} | " + " | ".join(cell(data, key) for data in columns) + " |" for label, key in entry["rows"]]


def quotes_of(entry: dict, root: Path) -> list[str]:
    if entry.get("table") == "compare":
        from fedac.compare import markdown_table

        summary = json.loads((root / entry["file"]).read_text())
        return markdown_table(summary["runs"]).splitlines()[2:]  # the rows, not the header
    if entry.get("table") == "earlyexit":
        from fedac.earlyexit_tables import markdown_table as exit_table

        summary = json.loads((root / entry["file"]).read_text())
        return exit_table([(r["dataset"], r["metric"], r["values"]) for r in summary["rows"]])[2:]
    if entry.get("table") == "grid":
        return grid_rows(entry, root)
    if entry.get("table") == "robustness":
        from fedac.robustness import table_rows

        summary = json.loads((root / entry["file"]).read_text())
        return table_rows(summary, entry["algorithm"], entry["metric"])
    if "table" in entry:
        raise ConfigError(f"unknown figure table kind {entry['table']!r} (known: compare, earlyexit, grid, robustness)")
    return [entry["quote"].replace("{}", render_value(entry, root))]


def collect(root: Path, figures: Path = FIGURES) -> list[Quote]:
    """Every quote of the figures file with whether its document contains it."""
    path = root / figures
    if not path.is_file():
        raise ConfigError(f"no figures file at {path}")
    entries = yaml.safe_load(path.read_text()) or []
    docs: dict[str, str] = {}
    out = []
    for entry in entries:
        doc = entry["doc"]
        if doc not in docs:
            docs[doc] = (root / doc).read_text()
        source = ", ".join(entry.get("files") or [entry["file"]]) + (f" [{entry['key']}]" if "key" in entry else "")
        out += [Quote(doc, text, source, text in docs[doc]) for text in quotes_of(entry, root)]
    return out


def cmd_report(args: argparse.Namespace) -> int:
    quotes = collect(Path(args.root))
    for q in quotes:
        mark = "ok     " if q.found else "MISSING"
        print(f"{mark} {q.doc}: {q.text}\n        from {q.source}")
    missing = [q for q in quotes if not q.found]
    print(f"{len(quotes) - len(missing)} of {len(quotes)} quoted figures match their committed results")
    return 1 if args.check and missing else 0


def add_report_parser(sub) -> None:
    p = sub.add_parser("report", help="regenerate the README's quoted figures from committed results")
    p.add_argument("--root", default=".", help="repository root (default: the current directory)")
    p.add_argument("--check", action="store_true", help="exit 1 when a document no longer quotes a figure")
    p.set_defaults(func=cmd_report)
