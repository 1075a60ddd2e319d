"""The systems table (`fedac reproduce system`): federated learning on devices, on the virtual
clock (docs/system.md), with the seeded synthetic heavy-tailed device trace and the diurnal
availability trace (docs/traces.md). Five ways to run FedAvg on the default task (the Speech
Commands stand-in: 240 speakers, 24 a round, 5 local epochs of a CRNN-Lite), 3 seeds:

- sync FedAvg, no deadline (a round waits for its slowest client);
- sync with a deadline (`DEADLINE_S`: a client that has not reported by then contributes nothing);
- sync with the deadline and over-commitment 1.3 (sample 32, keep the first 24 to report);
- FedBuff (buffer 12 = K / 2 of the sync cohort K = 24, 24 clients training at once);
- FedAsync at its defaults (alpha 0.6, staleness weight 1 / sqrt(1 + s), at most 10 server steps
  stale, as many clients training at once as the sync cohort).

Per run: the virtual time at which validation accuracy first reached `TARGET`, the test accuracy
of the selected round (results.json's `final`), the share of the 240 clients never heard from, the
run's whole virtual time, its rounds (server updates) and its wall time; mean ± std over seeds.

Schedule ("system-quick"): the async modes count `train.rounds` as server updates, and each mode
spends a different virtual time on one, so each is given the rounds that cover about `HORIZON_S`
virtual seconds (`rounds_for`) at the pace `STEP_S` measured on seed 0 before the table was run;
the table compares the modes at (about) equal virtual time, not at equal rounds, and its virtual
time column says what each covered. Evaluation about every `EVAL_EVERY_S` virtual seconds (every
round in the sync modes), so the time to target is read to within one evaluation's spacing.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np

from fedac.config import load_config
from fedac.data.traces import load_availability
from fedac.experiments.compare import plot_accuracy_curves
from fedac.experiments.runner import grid_cells, write_run_tables
from fedac.experiments.spec import Cell, Cost, Experiment, Layout, Request
from fedac.training.metrics import mean_std

#: Validation accuracy whose virtual time the table reports: sync FedAvg without a deadline reaches
#: it after about 12 of its 16 rounds (the default run's FedAvg: 15.8 % at round 10, 25.2 % at 15).
TARGET = 0.2
#: Virtual seconds every mode covers (about 16 no-deadline sync rounds).
HORIZON_S = 120.0
#: Sync rounds' deadline, chosen near the 75th percentile of a client's update time (compute +
#: download + upload) without a deadline; table.md states where it falls in the table's own
#: no-deadline runs.
DEADLINE_S = 2.5
DEADLINE_QUANTILE = 0.75
#: Virtual seconds per round (sync) or server update (async), measured on seed 0: sync rounds
#: 5-round mean; with a deadline a round lasts the deadline, or less once K have reported;
#: FedBuff's mean over 10 updates, FedAsync's over 20.
STEP_S = {"sync": 7.44, "deadline": 2.5, "overcommit": 2.4, "fedbuff": 1.0, "fedasync": 0.116}
#: Evaluations about this often in virtual time (the sync rounds evaluate every round).
EVAL_EVERY_S = 2.3


def rounds_for(mode: str) -> int:
    """Rounds (server updates) that cover about HORIZON_S virtual seconds in `mode`."""
    return math.ceil(HORIZON_S / STEP_S[mode])


def eval_every(mode: str) -> int:
    return max(1, round(EVAL_EVERY_S / STEP_S[mode]))


def _schedule(mode: str) -> str:
    return f"train.rounds={rounds_for(mode)},train.eval_every={eval_every(mode)}"


DEADLINE = f"system.deadline={DEADLINE_S:g}"
METHODS = [
    f"Sync=fedavg:{_schedule('sync')}",
    f"Sync + deadline=fedavg:{DEADLINE},{_schedule('deadline')}",
    f"Sync + deadline + over-commit 1.3=fedavg:{DEADLINE},system.overcommit=1.3,"
    f"{_schedule('overcommit')}",
    f"FedBuff=fedavg:system.mode=fedbuff,system.buffer=12,system.concurrency=24,"
    f"{_schedule('fedbuff')}",
    f"FedAsync=fedavg:system.mode=fedasync,{_schedule('fedasync')}",
]
#: The reduced schedule: the default task (FedAvg's default settings) on the clock.
QUICK = [
    "system.devices=synthetic",
    "system.availability=synthetic",
    f"system.target_accuracy={TARGET}",
    "train.checkpoint_every=50",
]
#: The table's columns: key -> (title, unit). Accuracies and shares in %, times in seconds.
COLUMNS = {
    "time_to_target_s": (f"Virtual time to {100 * TARGET:g} % val. acc. (s)", "s"),
    "accuracy": ("Test acc. (%)", "%"),
    "never_contributed_fraction": ("Clients never heard from (%)", "%"),
    "offline_fraction": ("Clients offline for the whole run (%)", "%"),
    "virtual_time_s": ("Virtual time (s)", "s"),
    "server_updates": ("Rounds / server updates", "n"),
    "wall_seconds": ("Wall time (s)", "s"),
}
CSV_KEYS = [*COLUMNS, "clients_never_contributed", "visits_per_trained_client"]


def run_figures(run_dir: Path) -> dict[str, float | None]:
    """The clock's figures of one run, from its results.json `system` block, and the share of its
    clients that its availability trace keeps offline for the whole run (`offline_throughout`)."""
    results = json.loads((Path(run_dir) / "results.json").read_text())
    system = results["system"]
    return {
        "time_to_target_s": system["time_to_target_s"],
        "never_contributed_fraction": system["never_contributed_fraction"],
        "offline_fraction": offline_throughout(Path(run_dir), system["virtual_time_s"]),
        "clients_never_contributed": system["clients_never_contributed"],
        "virtual_time_s": system["virtual_time_s"],
        "server_updates": results["rounds"],
    }


def clients_rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "clients.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def offline_throughout(run_dir: Path, horizon_s: float) -> float:
    """The share of the run's clients (clients.csv) that its availability trace (config.yaml's
    system.availability) has offline from virtual time 0 to `horizon_s`: no mode can hear from
    them within the run."""
    cfg = load_config(str(run_dir / "config.yaml"), algorithm_defaults=False)
    clients = sorted({r["client"] for r in clients_rows(run_dir)})
    trace = load_availability(cfg.system.availability, clients, cfg.seed, cfg.system.fill)
    return float(np.mean([trace.next_online(c, 0.0) >= horizon_s for c in clients]))


def client_times(run_dir: Path) -> list[float]:
    """Every update that arrived, its modelled time (compute + communication seconds): a client's
    growth in clients.csv's cumulative compute_s + comm_s between two consecutive rows of it in
    which its `arrived` count grew by one and it was neither late nor dropped (a run that logs
    every round: the no-deadline sync runs evaluate every round)."""
    before: dict[str, tuple[float, float, float, float]] = {}
    times = []
    for row in clients_rows(run_dir):
        now = tuple(float(row[k]) for k in ("compute_s", "comm_s", "arrived", "late", "dropped"))
        spent, arrived, late, dropped = now[0] + now[1], now[2], now[3], now[4]
        last = before.get(row["client"], (0.0, 0.0, 0.0, 0.0))
        if arrived == last[1] + 1 and (late, dropped) == last[2:]:
            times.append(spent - last[0])
        before[row["client"]] = (spent, arrived, late, dropped)
    return times


def cell_text(values: list[float | None], unit: str, seeds: int) -> str:
    """mean ± std of the values a run has; `(k of n)` when only k of the n runs have one (the
    others never reached the target, or have not finished)."""
    have = [v for v in values if v is not None]
    if not have:
        return "not reached" if values else "pending"
    mean, std = mean_std(have)
    scale, digits = (100.0, 2) if unit == "%" else (1.0, 1 if unit == "s" else 0)
    text = f"{scale * mean:,.{digits}f}"
    if len(have) > 1:
        text += f" ± {scale * std:,.{digits}f}"
    if len(have) < max(len(values), seeds):
        text += f" ({len(have)} of {max(len(values), seeds)})"
    return text


def write_system(
    spec: Experiment, request: Request, cells: list[Cell], runs: dict[str, dict[str, list[dict]]]
) -> None:
    """table.md (a row per mode, a column per figure), results.csv (one line per run), summary.json
    (each figure's mean and std over the seeds that have it, by cell and mode) and figure.png
    (validation accuracy against rounds and against virtual time, every run)."""
    out = request.out
    write_run_tables(out, runs, CSV_KEYS, ("virtual_time_s", run_figures), list(COLUMNS))
    lines = [
        f"# {spec.title}",
        "",
        f"Command: `{request.command}`" if request.command else "",
        "",
        f"Protocol: {', '.join(spec.protocol)}; mean ± std over seeds {request.seeds} (over the "
        "seeds that reached the target, where '(k of n)' says not all did).",
        "",
    ]
    for cell, by_method in runs.items():
        lines += [f"## {cell}", "", *deadline_note(by_method), ""]
        lines += [
            "| Mode | " + " | ".join(title for title, _ in COLUMNS.values()) + " |",
            "|---" * (len(COLUMNS) + 1) + "|",
        ]
        for method, method_runs in by_method.items():
            cells_text = [
                cell_text([r.get(k) for r in method_runs], unit, len(request.seeds))
                for k, (_, unit) in COLUMNS.items()
            ]
            lines.append(f"| {method} | " + " | ".join(cells_text) + " |")
        lines.append("")
    (out / "table.md").write_text("\n".join(lines))
    if runs:
        figure_runs = {m: rs for by_method in runs.values() for m, rs in by_method.items() if rs}
        if figure_runs:
            plot_accuracy_curves(figure_runs, out / "figure.png", spec.title)


def deadline_note(by_method: dict[str, list[dict]]) -> list[str]:
    """The line saying where the deadline lies in the no-deadline runs' client times."""
    times = [t for r in by_method.get("Sync", []) for t in client_times(Path(r["run_dir"]))]
    if not times:
        return []
    below = float(np.mean(np.array(times) <= DEADLINE_S))
    quantile = float(np.quantile(times, DEADLINE_QUANTILE))
    return [
        f"Deadline {DEADLINE_S:g} s: in the no-deadline runs ({len(times)} client updates) the "
        f"{100 * DEADLINE_QUANTILE:g}th percentile of a client's time is {quantile:.2f} s, and "
        f"{100 * below:.1f} % of the updates took at most the deadline."
    ]


SPECS = [
    Experiment(
        "system",
        "FL on devices",
        "-",
        "FL on devices: sync, deadline, over-commitment, FedBuff, FedAsync on the virtual clock "
        "(system-quick)",
        Cost(
            58,
            "docs/results/system/results.csv: 15 runs, 3,488 s (two copies of the command side by "
            "side, the machine shared with three other sessions)",
        ),
        METHODS,
        datasets=("speech_commands",),
        dataset_settings={"speech_commands": []},
        protocol=QUICK,
        tables={key: title for key, (title, _) in COLUMNS.items()},
        layout=Layout(cells=grid_cells, write=write_system),
    )
]
