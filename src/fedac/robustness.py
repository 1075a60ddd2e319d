"""`fedac reproduce robustness`: attacks x malicious fractions (rows) against aggregators (columns), for
FedAvg and FedMLAC, with the clean accuracy as the first row and the backdoor's attack success rate.

Every row is a cell of `reproduce`'s protocol (24 clients of the dataset, all active, 5 local epochs,
40 rounds) run as one `fedac compare` grid (compare.py) in its own folder, so a killed table is
completed by running the same command again. Outputs: table.md (one table per algorithm and metric,
mean ± std over seeds, with the command line), results.csv (one line per run), heatmap.png and
summary.json (each cell's mean, std and seed count; per algorithm `runs`, the finished runs, and
`run_seconds`, their summed wall time).

Choices:
- Columns: mean (FedAvg's n_k-weighted mean; FedMLAC with fedmlac.lpa=false), LPA (FedAvg with
  aggregation.method=lpa; FedMLAC as published), and the robust rules of aggregation.py.
- Krum-family and Bulyan get the true number of attackers of the row as f (the server's best case),
  at least 1 and, for Bulyan, at most (n - 3) / 4 of the cohort n, which Bulyan requires; the clean row
  uses f = 1. Trimmed mean cuts `aggregation.trim_fraction` (0.2) at each end, norm bounding clips at
  `aggregation.clip_norm` (1.0).
- The malicious clients of a seed are the same in every column (a seeded choice of the run seed).
- The clean row sets `attack.measure_backdoor`: its success rate, the share of triggered clips that a
  model which never saw the trigger sends to the target, is the baseline of the backdoor rows' rate.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shlex
import time
from pathlib import Path

from fedac.compare import Method, cell_folder, comparison_passes, run_comparison
from fedac.attacks import ATTACKS
from fedac.config import load_config
from fedac.errors import ConfigError
from fedac.metrics import mean_std
from fedac.reproduce import DATASETS, PROTOCOL

ALGORITHMS = {"FedAvg": "fedavg", "FedMLAC": "fedmlac"}
#: column label -> (FedAvg settings, FedMLAC settings)
AGGREGATORS = {
    "mean": (["aggregation.method=mean"], ["fedmlac.lpa=false"]),
    "LPA": (["aggregation.method=lpa"], ["fedmlac.lpa=true"]),
    "median": (["aggregation.method=median"],) * 2,
    "trimmed mean": (["aggregation.method=trimmed_mean"],) * 2,
    "Multi-Krum": (["aggregation.method=multikrum"],) * 2,
    "Bulyan": (["aggregation.method=bulyan"],) * 2,
    "norm bounding": (["aggregation.method=norm_bound"],) * 2,
}
ROW_ATTACKS = [a for a in ATTACKS if a != "none"]
FRACTIONS = (0.1, 0.2, 0.3)
PARTIAL_WRITE_SECONDS = 30.0  # while training, table.md / results.csv / heatmap.png are rewritten this often
METRICS = {"accuracy": "Shared model on the test split: accuracy",
           "attack_success_rate": "Backdoor attack success rate (triggered test clips of other classes sent to the target; "
                                  "on the clean row by a model that never saw the trigger)"}


def server_f(fraction: float, clients: int, aggregator: str) -> int:
    """The f given to Krum/Bulyan: the row's attacker count (at least 1), capped for Bulyan."""
    f = max(1, int(round(fraction * clients)))
    return min(f, (clients - 3) // 4) if aggregator == "Bulyan" else f


def grid_methods(algorithms: list[str], aggregators: list[str], fraction: float, clients: int) -> list[Method]:
    methods = []
    for algo in algorithms:
        for agg in aggregators:
            settings = AGGREGATORS[agg][list(ALGORITHMS).index(algo)]
            methods.append(Method(f"{algo} {agg}", ALGORITHMS[algo],
                                  settings + [f"aggregation.num_malicious={server_f(fraction, clients, agg)}"]))
    return methods


def _choose(given: list | None, known, what: str) -> list:
    chosen = list(given or known)
    unknown = [g for g in chosen if g not in known]
    if unknown:
        raise ConfigError(f"unknown {what} {', '.join(map(str, unknown))}; choose from {', '.join(map(str, known))}")
    return chosen


def run_robustness(seeds: list[int], out: Path, overrides: list[str], attacks: list[str] | None = None,
                   fractions: list[float] | None = None, aggregators: list[str] | None = None,
                   algorithms: list[str] | None = None, dataset: str = "speech_commands", rounds: int | None = None,
                   command: str = "", progress: bool = True, finished_only: bool = False) -> dict:
    """Run (or complete) the grid and write table.md, results.csv and heatmap.png (from the finished runs
    alone with `finished_only`)."""

    attacks = _choose(attacks, ROW_ATTACKS, "attack(s)")
    fractions = [float(f) for f in (fractions or FRACTIONS)]
    if any(not 0 < f <= 1 for f in fractions):
        raise ConfigError(f"--fractions must lie in (0, 1], got {fractions}")
    aggregators = _choose(aggregators, list(AGGREGATORS), "aggregator(s)")
    algorithms = _choose(algorithms, list(ALGORITHMS), "algorithm(s)")
    if dataset not in DATASETS:
        raise ConfigError(f"unknown dataset {dataset}; choose from {', '.join(DATASETS)}")
    user = list(overrides) + ([f"train.rounds={rounds}"] if rounds is not None else [])
    settings = PROTOCOL + DATASETS[dataset]
    base = load_config(None, settings + user, dataset=dataset)
    clients = base.data.max_clients or 24
    rows = [("clean", "none", 0.0)] + [(f"{a} {int(round(100 * f))}%", a, f) for a in attacks for f in fractions]
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, list[dict]]] = {}
    last_written = started  # when the outputs were last written
    for wait_for_others in comparison_passes(finished_only):
        for label, kind, fraction in rows:
            if progress:
                print(f"=== robustness: {label}")
            methods = grid_methods(algorithms, aggregators, fraction, clients)
            # The clean row also measures the trigger's success rate: the backdoor rows' baseline.
            attack = [f"attack.kind={kind}", f"attack.fraction={fraction}"] + \
                (["attack.measure_backdoor=true"] if kind == "none" else [])
            results.setdefault(label, {m.label: [] for m in methods})  # a row with no run yet shows, as pending

            def on_run(runs: dict[str, list[dict]], label: str = label) -> None:
                nonlocal last_written
                results[label] = runs
                # Partial tables while training, at most every PARTIAL_WRITE_SECONDS: the heat-map takes
                # about a second, and writing after each run read back made --finished-only take minutes.
                if not finished_only and time.perf_counter() - last_written >= PARTIAL_WRITE_SECONDS:
                    write_outputs(out, results, algorithms, aggregators, seeds, command)
                    last_written = time.perf_counter()

            run_comparison(base, methods, seeds, out / cell_folder(label),
                           settings + attack, None, progress, last=user, on_run=on_run, finished_only=finished_only,
                           wait_for_others=wait_for_others)
    write_outputs(out, results, algorithms, aggregators, seeds, command)
    return {"rows": [r[0] for r in rows], "wall_seconds": time.perf_counter() - started}


def _stats(runs: list[dict], key: str) -> tuple[float, float, int]:
    values = [r[key] for r in runs if r.get(key) is not None]
    return (*mean_std(values), len(values)) if values else (math.nan, math.nan, 0)


def write_outputs(out: Path, results: dict, algorithms: list[str], aggregators: list[str], seeds: list[int],
                  command: str) -> None:
    with open(out / "results.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["row", "algorithm", "aggregator", "seed", *METRICS, "malicious_clients", "wall_seconds", "run_dir"])
        for row, runs in results.items():
            for algo in algorithms:
                for agg in aggregators:
                    for r in runs.get(f"{algo} {agg}", []):
                        writer.writerow([row, algo, agg, r["seed"], *[r.get(k, "") for k in METRICS],
                                         r.get("malicious_clients", 0), r["wall_seconds"], r["run_dir"]])
    # [mean, std, seeds] per row, algorithm, aggregator and metric: table.md and the figures the docs
    # quote (`fedac report`, `table: robustness`) are both rendered from it.
    cells = {row: {algo: {agg: {key: list(_stats(runs.get(f"{algo} {agg}", []), key)) for key in METRICS}
                          for agg in aggregators} for algo in algorithms} for row, runs in results.items()}
    finished = {algo: [r for runs in results.values() for agg in aggregators for r in runs.get(f"{algo} {agg}", [])]
                for algo in algorithms}
    summary = {"command": command, "seeds": seeds, "cells": cells,
               "runs": {algo: len(rs) for algo, rs in finished.items()},
               "run_seconds": {algo: sum(r["wall_seconds"] for r in rs) for algo, rs in finished.items()}}
    (out / "table.md").write_text(markdown(summary))
    heatmap(out / "heatmap.png", summary)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))


def table_rows(summary: dict, algo: str, key: str) -> list[str]:
    """One Markdown table's rows (`| row | cell | ... |`, a cell per aggregator, in percent as
    `mean ± std`, `(n=k)` while only k of the seeds have finished, the bare mean while only one has) from a
    summary's cells; the backdoor's success rate has the backdoor rows and the clean row (its baseline: a
    model that never saw the trigger)."""
    seeds, rows = len(summary["seeds"]), list(summary["cells"])
    if key != "accuracy":
        backdoor = [row for row in rows if row.startswith("backdoor")]
        rows = (["clean"] if "clean" in rows else []) + backdoor if backdoor else []
    lines = []
    for row in rows:
        by_algo = summary["cells"][row]
        cells = []
        for mean, std, n in (stats[key] for stats in by_algo[algo].values()):
            partial = f" (n={n})" if 0 < n < seeds else ""
            spread = "" if n == 1 and partial else f" ± {100 * std:.2f}"  # no std of one seed of several
            cells.append("pending" if n == 0 else f"{100 * mean:.2f}{spread}{partial}")
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return lines


def markdown(summary: dict) -> str:
    command, cells = summary["command"], summary["cells"]
    lines = ["# Robustness: attacks x malicious fraction against aggregators", "",
             f"Command: `{command}`" if command else "", "",
             f"Mean ± std over seeds {summary['seeds']} (`n=k` while only k have finished). Rows: the attack and "
             "the share of malicious clients; 'clean' has none.", ""]
    first = next(iter(cells.values()), {})
    for algo, by_aggregator in first.items():
        for key, title in METRICS.items():
            rows = table_rows(summary, algo, key)
            if not rows:
                continue
            lines += [f"## {algo}: {title}", "", "| Row | " + " | ".join(by_aggregator) + " |",
                      "|---" * (len(by_aggregator) + 1) + "|", *rows, ""]
    return "\n".join(lines)


def heatmap(path: Path, summary: dict) -> None:
    """Test accuracy (%) per row and aggregator, one panel per algorithm, from a summary's cells."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cells = summary["cells"]
    rows = list(cells)
    first = next(iter(cells.values()), {})
    algorithms, aggregators = list(first), list(next(iter(first.values()), {}))
    fig, axes = plt.subplots(1, len(algorithms), figsize=(1.2 * len(aggregators) * len(algorithms) + 2,
                                                          0.45 * len(rows) + 2), squeeze=False)
    for ax, algo in zip(axes[0], algorithms):
        grid = np.array([[100 * cells[r][algo][a]["accuracy"][0] for a in aggregators] for r in rows])
        top = float(np.nanmax(grid)) if np.isfinite(grid).any() else 1.0  # (a panel may be all pending)
        image = ax.imshow(grid, cmap="viridis", vmin=0, vmax=max(1.0, top))
        for (i, j), value in np.ndenumerate(grid):
            ax.text(j, i, "" if value != value else f"{value:.1f}", ha="center", va="center", fontsize=7, color="w")
        ax.set_xticks(range(len(aggregators)), aggregators, rotation=30, ha="right", fontsize=8)
        ax.set_yticks(range(len(rows)), rows, fontsize=8)
        ax.set_title(f"{algo}: test accuracy (%)", fontsize=9)
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def cmd_robustness(args: argparse.Namespace) -> int:
    out = Path(args.out or "runs/reproduce-robustness")
    command = "fedac " + " ".join(shlex.quote(a) for a in args.argv)
    datasets = args.datasets or ["speech_commands"]
    if len(datasets) != 1:
        raise ConfigError("reproduce robustness runs on one dataset; give --datasets NAME once")
    summary = run_robustness(args.seeds, out, args.overrides, args.attacks, args.fractions, args.aggregators,
                             args.methods, datasets[0], args.rounds, command, progress=not args.quiet,
                             finished_only=args.finished_only)
    print((out / "table.md").read_text())
    print(f"{len(summary['rows'])} rows in {summary['wall_seconds']:.0f} s; table.md, results.csv, heatmap.png in {out}")
    return 0
