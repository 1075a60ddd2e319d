"""Robustness (fedac's own table, docs/robustness.md) as a spec: attacks x malicious fractions
(rows) against aggregators (columns), for FedAvg and FedMLAC, with the clean accuracy as the first
row and the backdoor's attack success rate.

Every row is a cell of the FedMLAC tables' protocol (fedmlac.PROTOCOL: 24 clients of the dataset,
all active, 5 local epochs, 40 rounds) run as one `fedac compare` grid (compare.py) in its own
folder, so a killed table is completed by running the same command again. Outputs: table.md (one
table per algorithm and metric, mean ± std over seeds, with the command line), results.csv (one line
per run), heatmap.png and summary.json (each cell's mean, std and seed count; per algorithm `runs`,
the finished runs, and `run_seconds`, their summed wall time). The spec's layout (`LAYOUT`) builds
the rows (`row_cells`) and writes these files (`write_outputs`); runner.py runs them.

Choices:
- Columns: mean (FedAvg's n_k-weighted mean; FedMLAC with fedmlac.lpa=false), LPA (FedAvg with
  aggregation.method=lpa; FedMLAC as published), and the robust rules of aggregation.py.
- Krum-family and Bulyan get the true number of attackers of the row as f (the server's best case),
  at least 1 and, for Bulyan, at most (n - 3) / 4 of the cohort n, which Bulyan requires; the clean
  row uses f = 1. Trimmed mean cuts `aggregation.trim_fraction` (0.2) at each end, norm bounding
  clips at `aggregation.clip_norm` (1.0).
- The malicious clients of a seed are the same in every column (a seeded choice of the run seed).
- The clean row sets `attack.measure_backdoor`: its success rate, the share of triggered clips that
  a model which never saw the trigger sends to the target, is the baseline of the backdoor rows'
  rate.
- `--methods` chooses the algorithms (FedAvg, FedMLAC), `--attacks`, `--fractions` and
  `--aggregators` the rest of the grid; one dataset (`--datasets NAME`, default speech_commands).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from fedac.config import load_config
from fedac.errors import ConfigError
from fedac.experiments.compare import Method, cell_folder
from fedac.experiments.fedmlac import DATASETS, PROTOCOL
from fedac.experiments.spec import Cell, Cost, Experiment, Layout, Request
from fedac.training.metrics import mean_std

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
FRACTIONS = (0.1, 0.2, 0.3)
METRICS = {
    "accuracy": "Shared model on the test split: accuracy",
    "attack_success_rate": "Backdoor attack success rate (triggered test clips of other classes "
    "sent to the target; on the clean row by a model that never saw the trigger)",
}


def server_f(fraction: float, clients: int, aggregator: str) -> int:
    """The f given to Krum/Bulyan: the row's attacker count (at least 1), capped for Bulyan."""
    f = max(1, int(round(fraction * clients)))
    return min(f, (clients - 3) // 4) if aggregator == "Bulyan" else f


def grid_methods(
    algorithms: list[str], aggregators: list[str], fraction: float, clients: int
) -> list[Method]:
    methods = []
    for algo in algorithms:
        for agg in aggregators:
            settings = AGGREGATORS[agg][list(ALGORITHMS).index(algo)]
            methods.append(
                Method(
                    f"{algo} {agg}",
                    ALGORITHMS[algo],
                    settings + [f"aggregation.num_malicious={server_f(fraction, clients, agg)}"],
                )
            )
    return methods


def _choose(given: list | None, known, what: str) -> list:
    chosen = list(given or known)
    unknown = [g for g in chosen if g not in known]
    if unknown:
        raise ConfigError(
            f"unknown {what} {', '.join(map(str, unknown))}; choose from "
            f"{', '.join(map(str, known))}"
        )
    return chosen


def row_attacks() -> list[str]:
    """Every registered attack but `none` (plug-ins included): the default rows."""
    # lazy: start-up time (attacks import torch; the parser lists this spec)
    from fedac.rules.attacks import ATTACKS

    return [a for a in ATTACKS if a != "none"]


def row_cells(spec: Experiment, request: Request) -> list[Cell]:
    """The clean row, then every attack x fraction; each row's methods are algorithms x
    aggregators."""
    fractions = [float(f) for f in (request.fractions or FRACTIONS)]
    if any(not 0 < f <= 1 for f in fractions):
        raise ConfigError(f"--fractions must lie in (0, 1], got {fractions}")
    known_attacks = row_attacks()
    attacks = _choose(request.attacks, known_attacks, "attack(s)")
    aggregators = _choose(request.aggregators, list(AGGREGATORS), "aggregator(s)")
    algorithms = _choose(request.methods, list(ALGORITHMS), "algorithm(s)")
    datasets = request.datasets or list(spec.datasets)
    if len(datasets) != 1:
        raise ConfigError("reproduce robustness runs on one dataset; give --datasets NAME once")
    dataset = datasets[0]
    if dataset not in spec.dataset_settings:
        raise ConfigError(
            f"unknown dataset {dataset}; choose from {', '.join(spec.dataset_settings)}"
        )
    settings = spec.protocol + spec.dataset_settings[dataset]
    base = load_config(None, settings + request.user, dataset=dataset)
    clients = base.data.max_clients or 24
    rows = [("clean", "none", 0.0)] + [
        (f"{a} {int(round(100 * f))}%", a, f) for a in attacks for f in fractions
    ]
    cells = []
    for label, kind, fraction in rows:
        # The clean row also measures the trigger's success rate: the backdoor rows' baseline.
        attack = [f"attack.kind={kind}", f"attack.fraction={fraction}"] + (
            ["attack.measure_backdoor=true"] if kind == "none" else []
        )
        cells.append(
            Cell(
                label,
                dataset,
                request.out / cell_folder(label),
                base,
                settings + attack,
                grid_methods(algorithms, aggregators, fraction, clients),
                request.user,
            )
        )
    return cells


def write_table(
    spec: Experiment, request: Request, cells: list[Cell], runs: dict[str, dict[str, list[dict]]]
) -> None:
    """The layout's writer: the grid's algorithms and aggregators, as the request chose them."""
    algorithms = _choose(request.methods, list(ALGORITHMS), "algorithm(s)")
    aggregators = _choose(request.aggregators, list(AGGREGATORS), "aggregator(s)")
    write_outputs(request.out, runs, algorithms, aggregators, request.seeds, request.command)


def _stats(runs: list[dict], key: str) -> tuple[float, float, int]:
    values = [r[key] for r in runs if r.get(key) is not None]
    return (*mean_std(values), len(values)) if values else (math.nan, math.nan, 0)


def write_outputs(
    out: Path,
    results: dict,
    algorithms: list[str],
    aggregators: list[str],
    seeds: list[int],
    command: str,
) -> None:
    with open(out / "results.csv", "w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(
            [
                "row",
                "algorithm",
                "aggregator",
                "seed",
                *METRICS,
                "malicious_clients",
                "wall_seconds",
                "run_dir",
            ]
        )
        for row, runs in results.items():
            for algo in algorithms:
                for agg in aggregators:
                    for r in runs.get(f"{algo} {agg}", []):
                        writer.writerow(
                            [
                                row,
                                algo,
                                agg,
                                r["seed"],
                                *[r.get(k, "") for k in METRICS],
                                r.get("malicious_clients", 0),
                                r["wall_seconds"],
                                r["run_dir"],
                            ]
                        )
    # [mean, std, seeds] per row, algorithm, aggregator and metric: table.md and the figures the
    # docs quote (`fedac report`, `table: robustness`) are both rendered from it.
    cells = {
        row: {
            algo: {
                agg: {key: list(_stats(runs.get(f"{algo} {agg}", []), key)) for key in METRICS}
                for agg in aggregators
            }
            for algo in algorithms
        }
        for row, runs in results.items()
    }
    finished = {
        algo: [
            r
            for runs in results.values()
            for agg in aggregators
            for r in runs.get(f"{algo} {agg}", [])
        ]
        for algo in algorithms
    }
    summary = {
        "command": command,
        "seeds": seeds,
        "cells": cells,
        "runs": {algo: len(rs) for algo, rs in finished.items()},
        "run_seconds": {algo: sum(r["wall_seconds"] for r in rs) for algo, rs in finished.items()},
    }
    (out / "table.md").write_text(markdown(summary))
    heatmap(out / "heatmap.png", summary)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))


def table_rows(summary: dict, algo: str, key: str) -> list[str]:
    """One Markdown table's rows (`| row | cell | ... |`, a cell per aggregator, in percent as
    `mean ± std`, `(n=k)` while only k of the seeds have finished, the bare mean while only one has)
    from a summary's cells; the backdoor's success rate has the backdoor rows and the clean row (its
    baseline: a model that never saw the trigger)."""
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
            # no std of one seed of several
            spread = "" if n == 1 and partial else f" ± {100 * std:.2f}"
            cells.append("pending" if n == 0 else f"{100 * mean:.2f}{spread}{partial}")
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return lines


def markdown(summary: dict) -> str:
    command, cells = summary["command"], summary["cells"]
    lines = [
        "# Robustness: attacks x malicious fraction against aggregators",
        "",
        f"Command: `{command}`" if command else "",
        "",
        f"Mean ± std over seeds {summary['seeds']} (`n=k` while only k have finished). Rows: the "
        "attack and the share of malicious clients; 'clean' has none.",
        "",
    ]
    first: dict = next(iter(cells.values()), {})
    for algo, by_aggregator in first.items():
        for key, title in METRICS.items():
            rows = table_rows(summary, algo, key)
            if not rows:
                continue
            lines += [
                f"## {algo}: {title}",
                "",
                "| Row | " + " | ".join(by_aggregator) + " |",
                "|---" * (len(by_aggregator) + 1) + "|",
                *rows,
                "",
            ]
    return "\n".join(lines)


def heatmap(path: Path, summary: dict) -> None:
    """Test accuracy (%) per row and aggregator, one panel per algorithm, from a summary's cells."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cells = summary["cells"]
    rows = list(cells)
    first: dict = next(iter(cells.values()), {})
    algorithms, aggregators = list(first), list(next(iter(first.values()), {}))
    fig, axes = plt.subplots(
        1,
        len(algorithms),
        figsize=(1.2 * len(aggregators) * len(algorithms) + 2, 0.45 * len(rows) + 2),
        squeeze=False,
    )
    for ax, algo in zip(axes[0], algorithms):
        grid = np.array(
            [[100 * cells[r][algo][a]["accuracy"][0] for a in aggregators] for r in rows]
        )
        # (a panel may be all pending)
        top = float(np.nanmax(grid)) if np.isfinite(grid).any() else 1.0
        image = ax.imshow(grid, cmap="viridis", vmin=0, vmax=max(1.0, top))
        for (i, j), value in np.ndenumerate(grid):
            ax.text(
                j,
                i,
                "" if value != value else f"{value:.1f}",
                ha="center",
                va="center",
                fontsize=7,
                color="w",
            )
        ax.set_xticks(range(len(aggregators)), aggregators, rotation=30, ha="right", fontsize=8)
        ax.set_yticks(range(len(rows)), rows, fontsize=8)
        ax.set_title(f"{algo}: test accuracy (%)", fontsize=9)
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


#: Partial tables while training at most every 30 s: the heat-map takes about a second, and writing
#: after each run read back made --finished-only take minutes.
LAYOUT = Layout(cells=row_cells, write=write_table, figure="heatmap.png", partial_seconds=30.0)
SPECS = [
    Experiment(
        "robustness",
        "fedac (robustness.md)",
        "-",
        "Robustness: attacks x malicious fraction against aggregators",
        Cost(
            round(89760 / 60),
            "docs/results/reproduce-robustness/summary.json run_seconds: 924 runs "
            "(FedAvg 15,976 s, FedMLAC 73,784 s), the default grid",
        ),
        methods=[f"{label}={name}" for label, name in ALGORITHMS.items()],
        datasets=("speech_commands",),
        dataset_settings=DATASETS,
        protocol=PROTOCOL,
        tables=dict(METRICS),
        options=("--methods", "--finished-only", "--attacks", "--fractions", "--aggregators"),
        layout=LAYOUT,
    )
]
EXPERIMENTS: dict[str, Experiment] = {spec.name: spec for spec in SPECS}
