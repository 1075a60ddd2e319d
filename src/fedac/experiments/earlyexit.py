"""The early-exit paper's result tables (docs/earlyexit.md) as specs: error rates (classification
error, WER, EER, in %) of the shared model, mean ± std over seeds, written as table.md, results.csv,
figure.png and summary.json (the memory table is `fedac memory`, exit_memory.py).

- earlyexit-table1: every exit depth, centralised (one client holding all the training data) against
  homogeneous FL (every client at that depth); each row is trained to its depth and evaluated there.
  The centralised rows train as many epochs as an FL row's clients do in all (`central_epochs`;
  `--central-epochs` sets it).
- earlyexit-table2: homogeneous FL at the task's best depth T_task against heterogeneous FL (half
  the clients at depth 3, half at T_task) with the FedAvg baseline and with the depth-weighted
  aggregation (Eq. 1). T_task is the paper's Table 1 FL optimum (§3.3: 6 for keyword spotting, 9 for
  ASR, emotion and speaker ID; `TASK_DEPTH`); `--set earlyexit.depth=D` sets it for both, and
  `--set earlyexit.high_depth=D` the heterogeneous clients' alone.

A cell is a dataset; its methods come from the configured exits (table 1, `table1_methods`) or the
spec (table 2). Runs go through runner.py and compare.run_comparison (one run directory per method
and seed, data built once per seed, a killed table completed by running the same command again).
"""

from __future__ import annotations

import csv
import json
import re
from functools import partial
from pathlib import Path
from typing import Any

from fedac.config import load_config
from fedac.errors import ConfigError
from fedac.experiments.compare import Method, parse_method, runs_wall_seconds
from fedac.experiments.spec import Cell, Cost, Experiment, Layout, Request
from fedac.training.metrics import mean_std

PAPER = "early-exit SSL"
DATASETS = ("speech_commands", "voxceleb1", "librispeech")
#: Settings every table run starts from (the user's --set come after): AdamW as the paper's recipe,
#: the fresh heads at a larger rate than the pretrained encoder (the paper gives no rates).
BASE = [
    "model.name=w2v2_s",
    "train.optimizer=adamw",
    "train.lr=0.0002",
    "earlyexit.head_lr=0.003",
    "train.local_epochs=1",
    "train.batch_size=8",
]
#: Classification heads standardise the pooled vector (model.head_norm, beyond the paper): with the
#: paper's plain linear head the stand-in runs stay at the class prior (docs/earlyexit.md, "The
#: head").
CLASSIFICATION = ["model.head_norm=true"]
CTC_DATASETS = ("librispeech",)
#: T_task of §3.3, the paper's best FL exit (Table 1): homo FL's depth and the high-resource
#: clients'.
TASK_DEPTH = {"speech_commands": 6}
DEFAULT_TASK_DEPTH = 9  # ASR, emotion recognition, speaker identification and verification
CENTRAL = "earlyexit.mode=homo,data.partition=iid,data.num_clients=1,train.fraction=1"
TABLE2_METHODS = [
    "homo FL=earlyexit:earlyexit.mode=homo",
    "hetero FedAvg=earlyexit:earlyexit.mode=hetero,earlyexit.aggregation=fedavg",
    "hetero depth-weighted=earlyexit:earlyexit.mode=hetero,earlyexit.aggregation=depth_weighted",
]


def central_epochs(cfg) -> int:
    """Table 1's centralised budget: as many epochs as an FL row's clients take in all (rounds x
    train.fraction of the data per round, each at train.local_epochs), so both columns see the same
    number of training clips. The paper is silent on its centralised schedule; --central-epochs sets
    it."""
    return max(1, round(cfg.train.rounds * cfg.train.fraction))


def table1_methods(exits: list[int], central_rounds: int = 1) -> list[Method]:
    """Table 1: centralised and homo FL rows per exit (the centralised ones `central_rounds` rounds
    of train.local_epochs epochs, evaluated and checkpointed every round)."""
    rows = []
    central = [
        *CENTRAL.split(","),
        f"train.rounds={central_rounds}",
        "train.eval_every=1",
        "train.checkpoint_every=1",
    ]
    for depth in exits:
        rows.append(
            Method(f"central L={depth}", "earlyexit", [*central, f"earlyexit.depth={depth}"])
        )
        rows.append(
            Method(
                f"homo FL L={depth}",
                "earlyexit",
                ["earlyexit.mode=homo", f"earlyexit.depth={depth}"],
            )
        )
    return rows


def dataset_settings(dataset: str, overrides: list[str], task_depth: bool) -> list[str]:
    """A dataset's own table settings, each unless the user's --set already chose it: the
    pooled-head norm on classification tasks, and with `task_depth` (table 2) homo FL and the
    high-resource clients at T_task."""
    chosen = dict(o.split("=", 1) for o in overrides if "=" in o)
    settings = [] if dataset in CTC_DATASETS else list(CLASSIFICATION)
    if task_depth:
        depth = chosen.get("earlyexit.depth", TASK_DEPTH.get(dataset, DEFAULT_TASK_DEPTH))
        settings += [f"earlyexit.depth={depth}", f"earlyexit.high_depth={depth}"]
    return [s for s in settings if s.split("=", 1)[0] not in chosen]


def dataset_cells(spec: Experiment, request: Request, per_depth: bool) -> list[Cell]:
    """One cell per dataset (folder `<out>/<dataset>`); `per_depth` (table 1): a centralised and a
    homo FL method per configured exit, else the spec's methods at T_task."""
    if request.central_epochs is not None and request.central_epochs < 1:
        raise ConfigError(f"--central-epochs must be at least 1, got {request.central_epochs}")
    cells = []
    for dataset in request.datasets or list(spec.datasets):
        overrides = [
            *spec.protocol,
            *dataset_settings(dataset, request.overrides, not per_depth),
            *request.overrides,
        ]
        rounds: dict[str, Any] = {"train.rounds": request.rounds}  # (a dotted key: passed as **)
        cfg = load_config(None, overrides, algorithm="earlyexit", dataset=dataset, **rounds)
        methods = (
            table1_methods(cfg.earlyexit.exits, request.central_epochs or central_epochs(cfg))
            if per_depth
            else [parse_method(m) for m in spec.methods]
        )
        if request.methods:
            methods = [m for m in methods if m.label in request.methods]
            if not methods:
                raise ConfigError(
                    f"--methods {request.methods} names none of {spec.name}'s methods"
                )
        cells.append(Cell(dataset, dataset, request.out / dataset, cfg, overrides, methods))
    return cells


def write_table(
    spec: Experiment, request: Request, cells: list[Cell], runs: dict[str, dict[str, list[dict]]]
) -> None:
    """The layout's writer; each dataset's wall time is its runs' own (a resumed or --finished-only
    table still reports it)."""
    write(
        request.out,
        spec.title,
        request.command,
        runs,
        {d: runs_wall_seconds(rs) for d, rs in runs.items()},
    )


def error_rates(final: dict) -> dict[str, float]:
    """The paper's numbers for a run's shared model, in %: WER (clean, other) on ASR, else the
    classification error, plus the EER when the dataset has verification trials. ASR also reports
    the CER (beyond the paper): on a small stand-in the WER saturates near 100% long before the CER
    does."""
    if "wer" in final:
        out = {"WER": 100 * final["wer"]}
        if "test_other_wer" in final:
            out["WER other"] = 100 * final["test_other_wer"]
        for key, name in (("cer", "CER"), ("test_other_cer", "CER other")):
            if key in final:
                out[name] = 100 * final[key]
        return out
    out = {"error": 100 * (1 - final["accuracy"])}
    if "asv_eer" in final:
        out["EER"] = 100 * final["asv_eer"]
    return out


def _cell(values: list[float]) -> str:
    if not values:
        return "-"
    mean, std = mean_std(values)
    return f"{mean:.2f} ± {std:.2f}" if len(values) > 1 else f"{mean:.2f}"


def _column_and_depth(label: str) -> tuple[str, int | None]:
    """Table 1's "central L=6" -> ("central", 6): its rows are depths, its columns the training
    kind."""
    match = re.fullmatch(r"(.+) L=(\d+)", label)
    return (match[1], int(match[2])) if match else (label, None)


def rows(runs: dict[str, dict[str, list[dict]]]) -> list[tuple[str, str, dict[str, list[float]]]]:
    """(dataset, metric, {method: values over seeds}); table 1's per-depth methods become one row
    per metric and depth (deepest first, as the paper) with a column per kind of training."""
    out = []
    for dataset, by_method in runs.items():
        metrics = list(
            dict.fromkeys(k for rs in by_method.values() for r in rs for k in error_rates(r))
        )
        depths = sorted(
            {_column_and_depth(m)[1] for m in by_method}, key=lambda d: -1 if d is None else -d
        )
        for metric in metrics:
            for depth in depths:
                row = {
                    _column_and_depth(m)[0]: [error_rates(r)[metric] for r in rs]
                    for m, rs in by_method.items()
                    if _column_and_depth(m)[1] == depth
                }
                out.append((dataset, metric if depth is None else f"{metric}, L={depth}", row))
    return out


def markdown_table(table: list[tuple[str, str, dict[str, list[float]]]]) -> list[str]:
    """The table's Markdown lines (header, rule, one row per dataset and metric); `fedac report`
    ties the README's copy to summary.json through it."""
    labels = list(dict.fromkeys(m for _, _, by in table for m in by))
    return [
        "| Dataset | Metric | " + " | ".join(labels) + " |",
        "|---" * (len(labels) + 2) + "|",
        *[
            f"| {d} | {metric} | " + " | ".join(_cell(by.get(m, [])) for m in labels) + " |"
            for d, metric, by in table
        ],
    ]


def _write_results_csv(out: Path, runs: dict[str, dict[str, list[dict]]]) -> None:
    """results.csv: every run's error rates, one row per dataset, method, seed and metric."""
    with open(out / "results.csv", "w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["dataset", "method", "seed", "metric", "value", "run_dir"])
        for dataset, by_method in runs.items():
            for method, rs in by_method.items():
                for r in rs:
                    for metric, value in error_rates(r).items():
                        writer.writerow([dataset, method, r["seed"], metric, value, r["run_dir"]])


def _plot_bars(out: Path, title: str, table: list[tuple[str, str, dict[str, list[float]]]]) -> None:
    """figure.png: one group of bars per table row (dataset and metric), one bar per method, its
    mean over seeds with the std as error bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(dict.fromkeys(m for _, _, by in table for m in by))
    fig, ax = plt.subplots(figsize=(max(6, 1.5 * len(table)), 4))
    width = 0.8 / max(1, len(labels))
    for i, label in enumerate(labels):
        stats = [
            mean_std(by[label]) if by.get(label) else (float("nan"), 0.0) for _, _, by in table
        ]
        ax.bar(
            [j + i * width for j in range(len(table))],
            [s[0] for s in stats],
            width,
            yerr=[s[1] for s in stats],
            label=label,
        )
    ax.set_xticks(
        [j + 0.4 - width / 2 for j in range(len(table))],
        [f"{d}\n{m}" for d, m, _ in table],
        fontsize=8,
    )
    ax.set_ylabel("% (lower is better)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(out / "figure.png", dpi=100)
    plt.close(fig)


def write(
    out: Path,
    title: str,
    command: str,
    runs: dict[str, dict[str, list[dict]]],
    walls: dict[str, float],
) -> None:
    """An early-exit table's files in `out`: table.md, results.csv (one row per run and metric),
    figure.png (the bars) and summary.json."""
    table = rows(runs)
    lines = [
        f"# {title}",
        "",
        f"`{command}`",
        "",
        "Shared model on the test split, % (lower is better), mean ± std over seeds.",
        "",
        *markdown_table(table),
    ]
    lines += [
        "",
        "Wall time (the runs' own, summed): "
        + ", ".join(f"{d} {s:.0f} s" for d, s in walls.items()),
    ]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    _write_results_csv(out, runs)
    _plot_bars(out, title, table)
    (out / "summary.json").write_text(
        json.dumps(
            {
                "title": title,
                "command": command,
                "wall_seconds": walls,
                "rows": [
                    {
                        "dataset": d,
                        "metric": m,
                        "values": by,
                        "mean_std": {k: mean_std(v) for k, v in by.items() if v},
                    }
                    for d, m, by in table
                ],
            },
            indent=2,
        )
    )


TABLE1 = Layout(cells=partial(dataset_cells, per_depth=True), write=write_table)
TABLE2 = Layout(cells=partial(dataset_cells, per_depth=False), write=write_table)
_COMMITTED = "at the committed command's --rounds 30 --set data.task=12"
SPECS = [
    Experiment(
        "earlyexit-table1",
        PAPER,
        "Table 1",
        "Error per exit depth: centralised vs homogeneous FL",
        Cost(
            round(3207 * (3690 + 11590 + 10724) / 3690 * 3 / 60),
            "docs/results/reproduce-earlyexit-table1/summary.json: 3,207 s for Speech Commands, "
            "seed 0; x 7.05 for the three datasets (their ratio in earlyexit-table2's "
            "wall_seconds) x 3 seeds, " + _COMMITTED,
        ),
        datasets=DATASETS,
        protocol=BASE,
        options=("--methods", "--finished-only", "--central-epochs"),
        layout=TABLE1,
    ),
    Experiment(
        "earlyexit-table2",
        PAPER,
        "Table 2",
        "Homogeneous FL vs heterogeneous FedAvg vs heterogeneous depth-weighted",
        Cost(
            round((3690 + 11590 + 10724) / 60),
            "docs/results/reproduce-earlyexit-table2/summary.json wall_seconds: 26,004 s for the "
            "default grid (3 datasets, 3 seeds), " + _COMMITTED,
        ),
        TABLE2_METHODS,
        datasets=DATASETS,
        protocol=BASE,
        layout=TABLE2,
    ),
]
EXPERIMENTS: dict[str, Experiment] = {spec.name: spec for spec in SPECS}
