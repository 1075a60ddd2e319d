"""The one runner and the default writer of every paper table (`run_experiment`, `GRID`).

`run_experiment(spec, request)` builds the spec's cells (its `Layout.cells`, by default datasets x
variants with every method in each), runs every cell's methods x seeds (compare.run_comparison: one
run directory per method and seed, finished runs read back, killed ones resumed, runs another copy
of the command holds passed over and waited for at the end), and has the layout write its table.md,
results.csv and figure: after every run while training (a killed reproduction still shows what
finished) and once at the end. Which layout runs and writes is the spec's own; no experiment is
known here by name.
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from fedac.config import last_settings, load_config
from fedac.errors import ConfigError
from fedac.experiments.compare import (
    WORST_COLUMNS,
    Method,
    cell_folder,
    comparison_passes,
    parse_method,
    run_comparison,
)
from fedac.experiments.spec import Cell, Experiment, Layout, Request
from fedac.training.metrics import mean_std


def chosen_methods(spec: Experiment, request: Request) -> list[Method]:
    """The spec's methods, or those of them that --methods names."""
    methods = [parse_method(m) for m in spec.methods]
    if request.methods:
        unknown = set(request.methods) - {m.label for m in methods}
        if unknown:
            raise ConfigError(
                f"{spec.name} has no method(s) {', '.join(sorted(unknown))}; "
                f"its methods: {', '.join(m.label for m in methods)}"
            )
        methods = [m for m in methods if m.label in request.methods]
    return methods


def chosen_datasets(spec: Experiment, request: Request) -> list[str]:
    chosen = request.datasets or list(spec.datasets)
    unknown = [d for d in chosen if d not in spec.dataset_settings]
    if unknown:
        raise ConfigError(
            f"unknown dataset(s) {', '.join(unknown)}; choose from "
            f"{', '.join(spec.dataset_settings)}"
        )
    return chosen


def grid_cells(spec: Experiment, request: Request) -> list[Cell]:
    """Datasets x variants, every (chosen) method in each; a cell's folder is its label
    (compare.cell_folder)."""
    methods = chosen_methods(spec, request)
    out = []
    for dataset in chosen_datasets(spec, request):
        for label, settings in spec.variants or [("", [])]:
            name = f"{dataset} {label}".strip()
            # (a dataset's or variant's value replaces the protocol's: no repeated --set)
            cell_settings = last_settings(spec.protocol + spec.dataset_settings[dataset] + settings)
            base = load_config(None, cell_settings + request.user, dataset=dataset)
            out.append(
                Cell(
                    name,
                    dataset,
                    request.out / cell_folder(name),
                    base,
                    cell_settings,
                    methods,
                    request.user,
                )
            )
    return out


def run_experiment(spec: Experiment, request: Request) -> dict:
    """Run (or complete) every cell of `spec` and write its table.md, results.csv and figure;
    `request.finished_only` writes them from the runs that have ended and trains nothing. Returns
    the cells' labels, every run read or trained by cell and method, and the wall time."""
    from fedac.engine.distributed import current_world  # lazy: start-up time (torch)

    layout = spec.layout or GRID
    # torchrun: every rank runs the same runs (compare.run_comparison); rank 0 writes
    world = current_world()
    if world.distributed and layout.run_cell is not None:
        raise ConfigError(
            f"{spec.name} runs its cells its own way (not through compare.run_comparison), in one "
            "process: start `fedac reproduce` without torchrun"
        )
    started = time.perf_counter()
    cells = layout.cells(spec, request)
    request.out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict[str, list[dict]]] = {}
    # when the files were last written (a rerun reading every run back writes once)
    last_written = started

    def write() -> None:
        if world.writes:
            layout.write(spec, request, cells, runs)

    passes = comparison_passes(request.finished_only) if layout.two_passes else [True]
    for wait_for_others in passes:
        for cell in cells:
            if request.progress and world.writes:
                print(f"=== {spec.title}: {cell.label}")
            # pending until a run ends
            runs.setdefault(cell.label, {m.label: [] for m in cell.methods})

            def on_run(cell_runs: dict[str, list[dict]], label: str = cell.label) -> None:
                nonlocal last_written
                runs[label] = cell_runs
                # A table of what has finished so far (a killed reproduction still shows it), at
                # most every `partial_seconds`: a slow figure written after each run read back would
                # make a rerun crawl.
                if (
                    not request.finished_only
                    and time.perf_counter() - last_written >= layout.partial_seconds
                ):
                    write()
                    last_written = time.perf_counter()

            if layout.run_cell is not None:
                layout.run_cell(cell, request, on_run, wait_for_others)
            else:
                run_comparison(
                    cell.base,
                    cell.methods,
                    request.seeds,
                    cell.folder,
                    cell.settings,
                    None,
                    request.progress,
                    last=cell.last,
                    on_run=on_run,
                    finished_only=request.finished_only,
                    wait_for_others=wait_for_others,
                )
    write()
    return {
        "experiment": spec.name,
        "cells": list(runs),
        "runs": runs,
        "figure": layout.figure,
        "wall_seconds": time.perf_counter() - started,
    }


# --------------------------------------------------------------------------- the default writer

CSV_KEYS = [
    "accuracy",
    "macro_f1",
    "client_accuracy_mean",
    "personalized_local_accuracy_mean",
    "personalized_accuracy_mean",
    "personalized_clients",
    "visits_per_trained_client",
    "wall_seconds",
    "fa",
    "fr",
    "test_last5_mean",
    "clean_accuracy",
]


def every_method(cells: list[Cell]) -> list[Method]:
    """The methods of any cell, in first-seen order (cells may differ: a tuned table runs a
    method's untuned settings only on the datasets where its sweep moved them)."""
    seen: dict[str, Method] = {}
    for cell in cells:
        for method in cell.methods:
            seen.setdefault(method.label, method)
    return list(seen.values())


#: A table cell for a method its column did not run (`every_method`).
NOT_RUN = "not run"


def write_grid(
    spec: Experiment, request: Request, cells: list[Cell], runs: dict[str, dict[str, list[dict]]]
) -> None:
    """table.md (one table per `spec.tables` key, a column per cell), results.csv (one line per
    run), figure.png (bars per cell and method) and, for `spec.curves`, curves.png."""
    out = request.out
    methods = every_method(cells)
    notes = (
        spec.notes(cells[0].settings + cells[0].last, methods, cells[0].dataset, request.seeds)
        if spec.notes and cells
        else []
    )
    write_csv(out / "results.csv", runs)
    (out / "table.md").write_text(
        markdown(
            spec,
            runs,
            [m.label for m in methods],
            request.seeds,
            request.command,
            notes,
            request.worst,
        )
    )
    plot(out / "figure.png", spec, runs, methods)
    if spec.curves:
        plot_curves(out / "curves.png", spec, runs)


GRID = Layout(cells=grid_cells, write=write_grid)


def write_csv(
    path: Path, runs: dict[str, dict[str, list[dict]]], keys: list[str] = CSV_KEYS
) -> None:
    """results.csv: one row per run (cell, method, seed, `keys`, its run directory)."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["cell", "method", "seed", *keys, "run_dir"])
        for cell, by_method in runs.items():
            for method, method_runs in by_method.items():
                for run in method_runs:
                    writer.writerow(
                        [
                            cell,
                            method,
                            run["seed"],
                            *[run.get(k, "") for k in keys],
                            run["run_dir"],
                        ]
                    )


def seed_stats(runs: list[dict], keys: Sequence[str]) -> dict[str, dict[str, float]]:
    """summary.json's figures of one method's runs: for every key some run has, its mean and std
    over those runs and how many they are."""
    return {
        key: dict(zip(("mean", "std", "runs"), (*mean_std(values), len(values))))
        for key in keys
        if (values := [r[key] for r in runs if r.get(key) is not None])
    }


def write_run_tables(
    out: Path,
    runs: dict[str, dict[str, list[dict]]],
    keys: list[str],
    fill: tuple[str, Callable[[Path], dict]],
    figures: Sequence[str] | Callable[[dict[str, dict[str, list[dict]]]], dict],
) -> dict:
    """What every reproduce command writes beside its table: each run's own figures filled in
    once (`fill`: (a key the filled runs have, the figures of one run from its directory)),
    results.csv (`keys`) and summary.json, returned: per cell and method `seed_stats` of
    `figures`, or what `figures` makes of the runs when it is a function."""
    filled, figures_of = fill
    for by_method in runs.values():
        for method_runs in by_method.values():
            for run in method_runs:
                if filled not in run:
                    run.update(figures_of(Path(run["run_dir"])))
    write_csv(out / "results.csv", runs, keys)
    if callable(figures):
        summary = figures(runs)
    else:
        summary = {
            cell: {method: seed_stats(rs, list(figures)) for method, rs in by_method.items()}
            for cell, by_method in runs.items()
        }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def _cell_value(runs: list[dict], key: str, seeds: int) -> str:
    """mean ± std over seeds (the mean alone from one seed: no spread to show); `(n=k)` while only k
    of the seeds have finished; — without such a model."""
    values = [r[key] for r in runs if r.get(key) is not None]
    if not values:
        return "—" if runs else "pending"
    mean, std = mean_std(values)
    partial = f" (n={len(values)})" if len(values) < seeds else ""
    spread = f" ± {100 * std:.2f}" if len(values) > 1 else ""
    return "—" if mean != mean else f"{100 * mean:.2f}{spread}{partial}"


def markdown(
    spec: Experiment,
    runs: dict[str, dict[str, list[dict]]],
    methods: list[str],
    seeds: list[int],
    command: str,
    notes: Sequence[str] = (),
    worst: bool = False,
) -> str:
    """The table.md text: one table per `spec.tables` key, and with `worst` one per WORST_COLUMNS
    key that some run has (`fedac reproduce --worst`), then the wall times."""
    visits = sorted(
        {
            round(r.get("visits_per_trained_client", 0.0), 1)
            for by_method in runs.values()
            for rs in by_method.values()
            for r in rs
        }
    )
    lines = [
        f"# {spec.title}",
        "",
        f"Command: `{command}`" if command else "",
        "",
        f"Protocol: {', '.join(spec.protocol)}; "
        f"mean ± std over seeds {seeds}; visits per trained client: "
        f"{', '.join(str(v) for v in visits)}. '—': the method has no such model.",
        "",
        *(line for note in notes for line in (note, "")),
    ]
    tables = dict(spec.tables)
    if worst:
        every = [r for by_method in runs.values() for rs in by_method.values() for r in rs]
        tables.update(
            {k: v for k, v in WORST_COLUMNS.items() if any(r.get(k) is not None for r in every)}
        )
    for key, title in tables.items():
        lines += [
            f"## {title}",
            "",
            "| Method | " + " | ".join(runs) + " |",
            "|---" * (len(runs) + 1) + "|",
        ]
        for method in methods:
            lines.append(
                f"| {method} | "
                + " | ".join(
                    _cell_value(by_method[method], key, len(seeds))
                    if method in by_method
                    else NOT_RUN
                    for by_method in runs.values()
                )
                + " |"
            )
        lines.append("")
    lines += [
        "## Wall time per run (seconds, mean over finished seeds)",
        "",
        "| Method | " + " | ".join(runs) + " |",
        "|---" * (len(runs) + 1) + "|",
    ]
    for method in methods:
        walls = [
            [r["wall_seconds"] for r in by_method[method] if r.get("wall_seconds")]
            if method in by_method
            else None
            for by_method in runs.values()
        ]
        lines.append(
            f"| {method} | "
            + " | ".join(
                NOT_RUN if w is None else f"{sum(w) / len(w):.0f}" if w else "pending"
                for w in walls
            )
            + " |"
        )
    return "\n".join(lines) + "\n"


def plot(
    path: Path, spec: Experiment, runs: dict[str, dict[str, list[dict]]], methods: list[Method]
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cells = list(runs)
    fig, axes = plt.subplots(1, len(spec.tables), figsize=(5 * len(spec.tables), 4), squeeze=False)
    width = 0.8 / max(1, len(methods))
    for ax, (key, title) in zip(axes[0], spec.tables.items()):
        for i, method in enumerate(methods):
            stats = [  # (a column that did not run the method: no bar)
                mean_std([r[key] for r in runs[c].get(method.label, []) if r.get(key) is not None])
                for c in cells
            ]
            ax.bar(
                np.arange(len(cells)) + i * width,
                [100 * m for m, _ in stats],
                width,
                yerr=[100 * s for _, s in stats],
                label=method.label,
                capsize=2,
            )
        ax.set_xticks(
            np.arange(len(cells)) + 0.4 - width / 2, cells, rotation=30, ha="right", fontsize=8
        )
        ax.set_title(title, fontsize=9), ax.set_ylabel("accuracy (%)"), ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(spec.title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def seed_curve(runs: list[dict], column: str) -> tuple[list[int], list[float], list[float]]:
    """A metrics.csv column of the shared model (`test_accuracy`, logged with `train.test_curve` as
    in the paper's Fig. 2, or `val_accuracy`) per evaluated round, mean and std over the runs
    (seeds). Only the rounds every run evaluated are kept, so a point is never a mean over fewer
    seeds than its neighbours; no rounds when a run did not log the column."""
    per_run = []
    for run in runs:
        with open(Path(run["run_dir"]) / "metrics.csv") as handle:
            per_run.append(
                {int(r["round"]): float(r[column]) for r in csv.DictReader(handle) if r.get(column)}
            )
    rounds = sorted(set.intersection(*(set(c) for c in per_run))) if per_run else []
    stats = [mean_std([c[t] for c in per_run]) for t in rounds]
    return rounds, [m for m, _ in stats], [s for _, s in stats]


def plot_curves(path: Path, spec: Experiment, runs: dict[str, dict[str, list[dict]]]) -> None:
    """Fig. 2 of FedKWS-UI as fedac draws it: one panel per cell, one colour per method, its mean
    test accuracy over the finished seeds per evaluated round with a band of ± one std (solid) and
    its mean validation accuracy (dashed; the solid line is validation when no test curve was
    logged); the legend gives the mean of the last 5 evaluations (the paper's legend numbers) where
    the runs report it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4), squeeze=False)
    for ax, (cell, by_method) in zip(axes[0], runs.items()):
        for method, method_runs in by_method.items():
            val = seed_curve(method_runs, "val_accuracy")
            test = seed_curve(method_runs, "test_accuracy")
            rounds, mean, std = test if test[0] else val
            if not rounds:
                continue
            last5 = [
                r["test_last5_mean"] for r in method_runs if r.get("test_last5_mean") is not None
            ]
            label = f"{method} ({100 * np.mean(last5):.1f})" if last5 else method
            mean_pct, std_pct = 100 * np.array(mean), 100 * np.array(std)
            (line,) = ax.plot(rounds, mean_pct, label=label)
            ax.fill_between(
                rounds, mean_pct - std_pct, mean_pct + std_pct, alpha=0.2, color=line.get_color()
            )
            if test[0] and val[0]:
                ax.plot(val[0], 100 * np.array(val[1]), "--", linewidth=0.8, color=line.get_color())
        (
            ax.set_title(cell, fontsize=9),
            ax.set_xlabel("round"),
            ax.set_ylabel("shared model accuracy (%)"),
        )
        ax.grid(alpha=0.3), ax.legend(fontsize=7)
    fig.suptitle(
        f"{spec.title}\nsolid: test (± std over the finished seeds), dashed: validation",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
