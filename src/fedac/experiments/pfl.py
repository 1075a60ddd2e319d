"""The personalised-FL table (`fedac reproduce pfl`): FedAvg, FedProx and FedMLAC against ten
personalised-FL baselines (FedBN, FedPer, FedRep, LG-FedAvg, Ditto, APFL, SCAFFOLD, FedDyn, MOON and
local training; docs/algorithms.md) on the Speech Commands stand-in (client = speaker, FedMLAC's
protocol) and the CREMA-D stand-in (client = actor), 3 seeds.

Each run reports the shared model on the test split and, for every client, **the client's model on
its own held-out data**: its own model for a method that keeps one (every personalised method), the
shared model for one that does not (FedAvg, FedProx, SCAFFOLD, FedDyn, MOON). Over the clients: the
mean, the 10th percentile and the mean of the worst 10 %, at the last round and at the best round
(the evaluated round with the highest mean, chosen on the same held-out data: an optimistic figure,
reported beside the last round's rather than instead of it). Per round, these come from the run's
clients.csv (every client, every round: `train.eval_every=1`).

Schedule (`QUICK`, "pfl-quick"): FedMLAC's protocol (fedmlac.PROTOCOL: 24 clients of the
stand-in, all active every round, `train.*` the same for every method) reduced so that the whole
table, 78 runs, trains on two cores in about 20 minutes: 10 rounds of 1 local epoch (not 40 of 5),
every network a CRNN-Lite (FedMLAC's clients too, not CRNN-Base) and FedRep's head phase 2 epochs
(its paper's 10 to 1 ratio would make a FedRep round 11 times a FedAvg one). Mutual learning needs
many visits per client (FedMLAC warns below 10), so FedMLAC's figures at this schedule say little
about its paper's regime; nor do 10 epochs in all bring the 35-word Speech Commands stand-in far
from chance (its full protocol's FedAvg reaches about 52 %, docs/results/reproduce-table4).
"""

from __future__ import annotations

import csv
from pathlib import Path

from fedac.experiments.compare import Method
from fedac.experiments.fedmlac import DATASETS
from fedac.experiments.runner import grid_cells, markdown, plot, write_run_tables
from fedac.experiments.spec import Cell, Cost, Experiment, Layout, Request
from fedac.training.metrics import spread

#: The reduced schedule: FedMLAC's protocol (fedmlac.PROTOCOL) cut to about 10 s a run.
QUICK = [
    "train.rounds=10",
    "train.fraction=1.0",
    "train.local_epochs=1",
    "data.max_clients=24",
    "train.eval_every=1",
    "train.checkpoint_every=10",
    "model.name=crnn_lite",
    "model.client_model=crnn_lite",
    "fedrep.head_epochs=2",
]
METHODS = [
    "FedAvg=fedavg",
    "FedProx=fedprox",
    "FedMLAC=fedmlac",
    "FedBN=fedbn",
    "FedPer=fedper",
    "FedRep=fedrep",
    "LG-FedAvg=lgfedavg",
    "Ditto=ditto",
    "APFL=apfl",
    # option II's control variate reads K lr as plain SGD's step (its run default, which a
    # comparison does not apply: every method runs one schedule)
    "SCAFFOLD=scaffold:train.momentum=0",
    "FedDyn=feddyn",
    "MOON=moon",
    "Local=local",
]
#: The figures per run: result key -> title. `accuracy` is the shared model's (results.json);
#: the others are computed here from clients.csv.
TABLES = {
    "accuracy": "Shared model on the test split (accuracy)",
    "clients_last_mean": "Clients' models on their held-out data, last round: mean",
    "clients_last_p10": "Clients' models on their held-out data, last round: 10th percentile",
    "clients_last_worst10": "Clients' models on their held-out data, last round: worst 10 % mean",
    "clients_best_mean": "Clients' models on their held-out data, best round: mean",
    "clients_best_p10": "Clients' models on their held-out data, best round: 10th percentile",
    "clients_best_worst10": "Clients' models on their held-out data, best round: worst 10 % mean",
}
CSV_KEYS = ["accuracy", *list(TABLES)[1:], "clients_model", "best_round", "wall_seconds"]


def client_rounds(run_dir: Path) -> tuple[str, dict[int, list[float]]]:
    """(which model, {round: every client's accuracy on its held-out data}) from a run's
    clients.csv: the clients' own models (`own_accuracy`) where the method keeps them, else the
    shared model (`accuracy`)."""
    with open(run_dir / "clients.csv") as handle:
        rows = list(csv.DictReader(handle))
    column = "own_accuracy" if any(r.get("own_accuracy") for r in rows) else "accuracy"
    rounds: dict[int, list[float]] = {}
    for row in rows:
        if row.get(column):
            rounds.setdefault(int(row["round"]), []).append(float(row[column]))
    return ("own" if column == "own_accuracy" else "shared"), rounds


def client_figures(run_dir: Path) -> dict[str, float | str]:
    """The run's last-round and best-round spreads of its clients' held-out accuracy."""
    model, rounds = client_rounds(run_dir)
    if not rounds:
        return {}
    spreads = {r: spread(values) for r, values in rounds.items()}
    last = max(spreads)
    best = max(spreads, key=lambda r: (spreads[r]["mean"], -r))  # the earliest of equal means
    out: dict[str, float | str] = {"clients_model": model, "best_round": float(best)}
    for tag, r in (("last", last), ("best", best)):
        out[f"clients_{tag}_mean"] = spreads[r]["mean"]
        out[f"clients_{tag}_p10"] = spreads[r]["p10"]
        out[f"clients_{tag}_worst10"] = spreads[r]["worst10_mean"]
    return out


def write_pfl(
    spec: Experiment, request: Request, cells: list[Cell], runs: dict[str, dict[str, list[dict]]]
) -> None:
    """table.md (one table per `TABLES` key, a column per dataset), results.csv (one line per run,
    with the clients' figures), summary.json (each figure's mean and std over seeds, by dataset and
    method) and figure.png."""
    out = request.out
    # what the docs quote (docs/results/figures.yaml): mean and std over seeds of every figure
    write_run_tables(out, runs, CSV_KEYS, ("clients_model", client_figures), list(TABLES))
    methods: list[Method] = cells[0].methods if cells else []
    notes = [
        "Clients' models: each client's own model for the methods that keep one (FedMLAC, FedBN, "
        "FedPer, FedRep, LG-FedAvg, Ditto, APFL, Local), the shared model for the others. Best "
        "round: the evaluated round with the highest mean, chosen on the same held-out data "
        "(optimistic)."
    ]
    (out / "table.md").write_text(
        markdown(spec, runs, [m.label for m in methods], request.seeds, request.command, notes)
    )
    plot(out / "figure.png", spec, runs, methods)


SPECS = [
    Experiment(
        "pfl",
        "pFL baselines",
        "-",
        "Personalised FL baselines: the shared model and the clients' own models (pfl-quick)",
        Cost(
            18,
            "docs/results/pfl/results.csv: 78 runs, 1,106 s (48 of them while the machine was "
            "far busier)",
        ),
        METHODS,
        datasets=("speech_commands", "cremad"),
        dataset_settings={name: DATASETS[name] for name in ("speech_commands", "cremad")},
        protocol=QUICK,
        tables=TABLES,
        layout=Layout(cells=grid_cells, write=write_pfl),
    )
]
