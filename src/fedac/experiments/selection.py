"""The selection and fairness table (`fedac reproduce selection`): who trains and who benefits, on
the virtual clock (docs/system.md, "Who trains"). The default task (the Speech Commands stand-in:
240 speakers, 24 a round, a CRNN-Lite) on the seeded synthetic heavy-tailed device trace and the
diurnal availability trace, sync rounds with the systems table's deadline and over-commitment 1.3,
every run the same rounds:

- the selection rules under FedAvg: random (the default), Oort, power-of-choice, FedCS;
- the fairness objectives under random selection: q-FFL (q = 1 and q = 5), AFL, TERM (t = 1).

Per run: the virtual time at which validation accuracy first reached `TARGET`, the shared model's
test accuracy (selected on validation), the worst-10 % mean and the 10th percentile of the
speakers' held-out accuracy under the shared model (speakers with >= 4 held-out clips, as
`eval.min_client_clips` says), the share of the speakers never selected, and the Gini coefficient
of the times each speaker was selected (0: all alike; 1: one speaker took every slot). Times
selected are read from clients.csv's clock columns (arrived + late + dropped: every dispatch),
which random selection has too.

Schedule ("selection-quick"): `ROUNDS` rounds of the default 5 local epochs (one local epoch does
not move the default task off chance in 10 rounds: training loss 3.53 against ln 35 = 3.56),
evaluated every `EVAL_EVERY` rounds; the table's README says what was run and how it departs
from the paper's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fedac.experiments.compare import plot_accuracy_curves
from fedac.experiments.runner import grid_cells, seed_stats, write_csv
from fedac.experiments.spec import Cell, Cost, Experiment, Layout, Request
from fedac.experiments.system import DEADLINE_S, cell_text, clients_rows

#: Validation accuracy whose virtual time the table reports.
TARGET = 0.08
ROUNDS = 12
EVAL_EVERY = 2
METHODS = [
    "Random (FedAvg)=fedavg",
    "Oort=fedavg:selection.method=oort",
    "Power-of-choice=fedavg:selection.method=poc",
    "FedCS=fedavg:selection.method=fedcs",
    "q-FFL (q 1)=qffl:qffl.q=1",
    "q-FFL (q 5)=qffl:qffl.q=5",
    "AFL=afl",
    "TERM (t 1)=term:term.t=1",
]
QUICK = [
    "system.devices=synthetic",
    "system.availability=synthetic",
    f"system.deadline={DEADLINE_S:g}",
    "system.overcommit=1.3",
    f"system.target_accuracy={TARGET}",
    f"train.rounds={ROUNDS}",
    f"train.eval_every={EVAL_EVERY}",
    "train.checkpoint_every=50",
]
COLUMNS = {
    "time_to_target_s": (f"Virtual time to {100 * TARGET:g} % val. acc. (s)", "s"),
    "accuracy": ("Test acc. (%)", "%"),
    "worst10": ("Speakers' worst-10 % acc. (%)", "%"),
    "p10": ("Speakers' p10 acc. (%)", "%"),
    "never_selected": ("Never selected (%)", "%"),
    "gini": ("Gini of participation", "g"),
    "virtual_time_s": ("Virtual time (s)", "s"),
}


def gini(counts: list[float]) -> float:
    """The Gini coefficient of `counts`: sum_i sum_j |x_i - x_j| / (2 n^2 mean); 0 when all are
    equal (or all zero)."""
    x = np.sort(np.asarray(counts, dtype=float))
    n, total = len(x), x.sum()
    if n == 0 or total == 0:
        return 0.0
    ranks = np.arange(1, n + 1)
    return float((2 * ranks - n - 1) @ x / (n * total))


def participation(run_dir: Path) -> list[float]:
    """Times each client was selected by the end of the run: arrived + late + dropped in its last
    clients.csv row (the run evaluates its last round)."""
    last: dict[str, float] = {}
    for row in clients_rows(run_dir):
        last[row["client"]] = sum(float(row[k]) for k in ("arrived", "late", "dropped"))
    return list(last.values())


def run_figures(run_dir: Path) -> dict[str, float | None]:
    results = json.loads((Path(run_dir) / "results.json").read_text())
    spread = results["per_client"]["spreads"]["accuracy"]
    counts = participation(Path(run_dir))
    return {
        "time_to_target_s": results["system"]["time_to_target_s"],
        "worst10": spread["worst10_mean"],
        "p10": spread["p10"],
        "never_selected": float(np.mean([c == 0 for c in counts])),
        "gini": gini(counts),
        "virtual_time_s": results["system"]["virtual_time_s"],
    }


def write_selection(
    spec: Experiment, request: Request, cells: list[Cell], runs: dict[str, dict[str, list[dict]]]
) -> None:
    """table.md, results.csv, summary.json and figure.png (accuracy against rounds and virtual
    time)."""
    for by_method in runs.values():
        for method_runs in by_method.values():
            for run in method_runs:
                if "gini" not in run:
                    run.update(run_figures(Path(run["run_dir"])))
    out = request.out
    write_csv(out / "results.csv", runs, list(COLUMNS))
    summary = {
        cell: {m: seed_stats(rs, list(COLUMNS)) for m, rs in by_method.items()}
        for cell, by_method in runs.items()
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    lines = [f"# {spec.title}", "", f"Command: `{request.command}`" if request.command else ""]
    lines += [
        "",
        f"Protocol: {', '.join(spec.protocol)}; mean ± std over seeds {request.seeds}.",
        "",
    ]
    for cell, by_method in runs.items():
        lines += [f"## {cell}", ""]
        lines += ["| Method | " + " | ".join(t for t, _ in COLUMNS.values()) + " |"]
        lines += ["|---" * (len(COLUMNS) + 1) + "|"]
        for method, method_runs in by_method.items():
            texts = [
                gini_text([r.get(k) for r in method_runs])
                if unit == "g"
                else cell_text([r.get(k) for r in method_runs], unit, len(request.seeds))
                for k, (_, unit) in COLUMNS.items()
            ]
            lines.append(f"| {method} | " + " | ".join(texts) + " |")
        lines.append("")
    (out / "table.md").write_text("\n".join(lines))
    figure_runs = {m: rs for by_method in runs.values() for m, rs in by_method.items() if rs}
    if figure_runs:
        plot_accuracy_curves(figure_runs, out / "figure.png", spec.title)


def gini_text(values: list[float | None]) -> str:
    have = [v for v in values if v is not None]
    if not have:
        return "pending"
    return f"{np.mean(have):.3f}" + (f" ± {np.std(have):.3f}" if len(have) > 1 else "")


SPECS = [
    Experiment(
        "selection",
        "Who trains and who benefits",
        "-",
        "Client selection (random, Oort, power-of-choice, FedCS) and fairness objectives (q-FFL, "
        "AFL, TERM) on the virtual clock (selection-quick)",
        Cost(
            23,
            "docs/results/selection/results.csv: 16 runs (seeds 0 1), 908 s of wall time on the "
            "shared 2-core machine; x 1.5 for 3 seeds",
        ),
        METHODS,
        datasets=("speech_commands",),
        dataset_settings={"speech_commands": []},
        protocol=QUICK,
        tables={key: title for key, (title, _) in COLUMNS.items()},
        layout=Layout(cells=grid_cells, write=write_selection),
    )
]
