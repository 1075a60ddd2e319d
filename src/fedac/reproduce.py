"""`fedac reproduce NAME`: the experiments of fedmlac.md, one command each, on the stand-ins (or on real
copies with `--set data.root=...`), written as Markdown, CSV and PNG with mean ± std over seeds.

An experiment is a grid: cells (a dataset, possibly with a varied setting such as the active ratio or
the SNR) x methods x seeds. Each cell is a `fedac compare` (compare.py) in its own folder, so every run
keeps its run directory and a killed reproduction is completed by running the same command again:
finished runs are read back, killed ones resume from their checkpoint.

Protocol (`PROTOCOL`, scaled to two CPU cores): the paper trains 5,000 rounds at 20% active, so each
client trains about 1,000 times. Mutual learning needs many visits with real local training before the
clients' models are confident teachers (README, FedMLAC section), and two cores afford about 5,000
client-epochs per run: so 24 clients per dataset (`data.max_clients`, a seeded choice), all active,
5 local epochs, 40 rounds, i.e. 40 visits per client. Table 5 varies the active ratio at the same 40
rounds, so its 10% column has 4 visits per client, as the paper's design implies.

Columns are never mixed: the shared model on the test split, and the clients' own models on their own
held-out data, are separate tables (report.FINAL_KEYS).
"""

from __future__ import annotations

import argparse
import csv
import importlib
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

from fedac.compare import (PRESET_SETTINGS, PRESETS, Method, add_grid_arguments, cell_folder, comparison_passes,
                           parse_method, run_comparison)
from fedac.config import load_config
from fedac.errors import ConfigError
from fedac.metrics import mean_std

PROTOCOL = ["train.rounds=40", "train.fraction=1.0", "train.local_epochs=5", "data.max_clients=24",
            "train.eval_every=5", "train.checkpoint_every=5"]
#: Per dataset settings of the protocol: Urban Sound at the paper's alpha = 0.5 unless a cell varies it,
#: split over the protocol's 24 clients rather than the paper's 50: the stand-in has 1,202 training clips
#: (the paper 8,732), and 50 Dirichlet(0.1) clients of ~24 clips leave some client empty in every draw.
#: IEMOCAP: the paper activates all its clients, as the protocol does (its stand-in has 8 training speakers).
DATASETS = {"speech_commands": [], "urbansound8k": ["data.alpha=0.5", "data.num_clients=24"], "cremad": [],
            "iemocap": []}
STAND_INS = ("speech_commands", "urbansound8k", "cremad", "iemocap")

#: fedmlac.md Section 5.2's schedule as written (configs/paper.yaml): 5,000 rounds, 20% of all 240 stand-in
#: speakers a round (about 1,000 visits per client), 1 local epoch, batch 16, lr 0.01, plain SGD. Measured
#: on two cores (docs/results/reproduce-paper-regime/): median 1.08 s per FedMLAC round and 0.69 s per
#: FedAvg round, about 90 and 57 minutes a run; a killed run resumes from its last checkpoint.
PAPER_REGIME = ["train.rounds=5000", "train.fraction=0.2", "train.local_epochs=1", "train.batch_size=16",
                "train.lr=0.01", "train.momentum=0.0", "data.max_clients=null", "train.eval_every=100",
                "train.checkpoint_every=100", "train.test_curve=true"]

# Homogeneous clients (Section 5.3): every model a CRNN-Base; FedMLAC's Plug-in a CRNN-Lite.
HOMOGENEOUS = [
    "FedAvg=fedavg:model.name=crnn_base",
    "FedProx=fedprox:model.name=crnn_base",
    "FedOPT=fedadam:model.name=crnn_base",
    "FedKAD=fedkad:model.client_model=crnn_base",
    "FedMLAC=fedmlac:model.client_model=crnn_base",
]
# Noisy audio and label errors (Tables 6 and 7): the paper adds FedMLAC w/o LPA to Table 4's methods,
# since LPA is what it credits with the robustness.
NOISY = [*HOMOGENEOUS[:-1], "FedMLAC w/o LPA=fedmlac:model.client_model=crnn_base,fedmlac.lpa=false",
         HOMOGENEOUS[-1]]
# Heterogeneous clients (Section 5.4, Fig. 2): each client draws a CRNN from the zoo.
HETEROGENEOUS = [
    "FedKAD=fedkad:model.heterogeneous=true",
    "FedMLAC w/o LPA=fedmlac:model.heterogeneous=true,fedmlac.lpa=false",
    "FedMLAC=fedmlac:model.heterogeneous=true",
]
# Ablation (Fig. 3). The paper's text says homogeneous models, its caption heterogeneous; we follow the
# caption, like Fig. 2 (`--set model.heterogeneous=false` gives the other reading).
ABLATION = [
    "FedMLAC=fedmlac:model.heterogeneous=true",
    "FedMLAC w/o ML=fedmlac:model.heterogeneous=true,fedmlac.ml=false",
    "FedMLAC w/o LPA=fedmlac:model.heterogeneous=true,fedmlac.lpa=false",
]

# FedMLAC's options beyond the paper (issue 10), each alone on Table 4's homogeneous setting: a CE term on
# the Plug-in (deep mutual learning's Eq. 4), CE-only warm-up rounds, a distillation temperature, and LPA's
# step-normalised deviation. The first row is Table 4's FedMLAC, the same runs.
OPTIONS = [
    HOMOGENEOUS[-1],
    "FedMLAC + Plug-in CE=fedmlac:model.client_model=crnn_base,fedmlac.plugin_ce_weight=1.0",
    "FedMLAC + 10 warm-up rounds=fedmlac:model.client_model=crnn_base,fedmlac.warmup_rounds=10",
    "FedMLAC temperature 3=fedmlac:model.client_model=crnn_base,fedmlac.temperature=3.0",
    "FedMLAC per-step LPA=fedmlac:model.client_model=crnn_base,aggregation.deviation=per_step",
]


@dataclass(frozen=True)
class Experiment:
    title: str
    methods: list[str]
    #: (column label, settings) varied within each dataset; one unlabeled column when empty.
    variants: list[tuple[str, list[str]]] = field(default_factory=list)
    datasets: tuple[str, ...] = STAND_INS
    #: Settings every run of the experiment starts from; None: fedmlac.md's PROTOCOL.
    protocol: list[str] | None = None
    #: Result key -> table title; None: TABLES.
    tables: dict[str, str] | None = None
    #: Also write curves.png: each run's validation (and test, with train.test_curve) accuracy per round.
    curves: bool = False


EXPERIMENTS: dict[str, Experiment] = {
    "table4": Experiment("Table 4: homogeneous models", HOMOGENEOUS),
    "fig2": Experiment("Fig. 2 / heterogeneous table: heterogeneous models", HETEROGENEOUS),
    # Table 5 leaves IEMOCAP out, as the paper does: it activates all of IEMOCAP's clients (`--datasets
    # iemocap` runs it anyway; its stand-in's 8 clients make the 10% column one client a round).
    "table5": Experiment("Table 5: active ratio", HOMOGENEOUS,
                         [(f"{int(100 * r)}%", [f"train.fraction={r}"]) for r in (0.1, 0.2, 0.5, 1.0)],
                         datasets=("speech_commands", "cremad", "urbansound8k")),
    "table6": Experiment("Table 6: SNR", NOISY,
                         [(f"{db} dB", [f"data.snr_db={db}"]) for db in (100, 30, 20, 10)]),
    "table7": Experiment("Table 7: label error rate", NOISY,
                         [(f"E.R. {e}", [f"data.label_error={e}"]) for e in (0.0, 0.1, 0.3, 0.5)]),
    "fig3": Experiment("Fig. 3: ablation w/o ML and w/o LPA", ABLATION),
    "fedmlac-options": Experiment("FedMLAC's options beyond the paper (homogeneous models)", OPTIONS),
    "alpha": Experiment("Urban Sound Dirichlet alpha sweep", HOMOGENEOUS,
                        [(f"alpha {a}", [f"data.alpha={a}"]) for a in (0.1, 0.3, 0.5, 1.0)],
                        datasets=("urbansound8k",)),
    "paper-regime": Experiment("One long run in the paper's regime: FedAvg against FedMLAC",
                               [HOMOGENEOUS[0], HOMOGENEOUS[-1]], datasets=("speech_commands",),
                               protocol=PAPER_REGIME, curves=True),
}
EXPERIMENTS["hetero"] = EXPERIMENTS["fig2"]


def replaced(protocol: list[str], changes: list[str]) -> list[str]:
    """`protocol` with the keys of `changes` set to their new values (each key once: the table's
    Protocol line lists what the runs used)."""
    keys = {c.split("=")[0] for c in changes}
    return [s for s in protocol if s.split("=")[0] not in keys] + changes


# FedKWS-UI (Li et al., Interspeech 2022) on its own 12-class Speech Commands (data.gsc12=fedkws): the
# paper's local protocol (batch 32, SGD momentum 0.9, weight decay 1e-5, gradient norm clipped at 50,
# E = 50 local steps for every method, 300 rounds, test accuracy every 3 rounds, the last model) with 10%
# of the clients a round (the stand-in has 200 speakers of 5 clips or more, not 2,234). "Two-head FedAvg" is FedAvg on
# FedKWS-UI's two-head model (mu = lambda = 0, no ALT): the control for the extra projection layer. The
# methods are compare.PRESETS["fedkws"]. Every method's server takes the unweighted mean, as in the paper
# and its code (compare.PRESET_SETTINGS; `--set aggregation.weighting=n_k` weights them all by n_k).
# ALT's r0 is Sec. 4's rule K / sum_k rbar_k over the run's clients (fedkwsui.r0=sum), so
# sum_k r0 rbar_k E = K E holds on whatever data runs: the code's r0 = 3.5 was fitted to real Speech
# Commands (mean n_k 20.4) and on the stand-in (mean n_k 14.4) leaves the median client 5 of E = 10 steps.
KWS_PROTOCOL = ["data.task=12", "data.gsc12=fedkws", "data.min_speaker_clips=5", "train.rounds=300", "train.fraction=0.1",
                "train.batch_size=32", "train.lr=0.01", "train.weight_decay=1e-5", "train.max_grad_norm=50",
                "train.local_steps=50", "fedkwsui.local_steps=50", "train.eval_every=3", "train.checkpoint_every=3",
                "train.select=last", "train.test_curve=true", "features.style=fedkws", "features.augment=true",
                "features.test_augment=true", "fedkwsui.r0=sum", *PRESET_SETTINGS["fedkws"]]
KWS_NETWORKS = [("DSCNN", ["model.name=dscnn"]), ("MHAttRNN", ["model.name=mhattrnn"]),
                ("ResNet15", ["model.name=resnet15"]),
                # the paper trains its Transformer with AdamW (lr grid 0.005 / 0.002 / 0.0008: the middle one)
                ("KWT", ["model.name=kwt", "train.optimizer=adamw", "train.lr=0.002"])]
# The paper's protocol costs 8-20 CPU-hours a run here (300 rounds x 20 clients x 50 steps; DSCNN about
# 0.1 s a step), so the 3-seed table of 7 methods runs scaled to two cores: 100 of the 200 speakers (a
# seeded choice: sizes and class mixes as heterogeneous as the whole), 10 a round for 40 rounds (4 visits
# per client), E = 10 (ALT's s_k = floor(r0 rbar_k E) and the private phase floor(0.2 E) + 1 scale with
# it), evaluated every 4 rounds; DSCNN and the cheapest other network, MHAttRNN. Measured over the 42
# runs of the 3-seed table: 444-1,290 s a DSCNN run and 150-298 s a MHAttRNN run, two runs sharing two cores.
KWS_SCALED = replaced(KWS_PROTOCOL, ["data.max_clients=100", "train.rounds=40", "train.local_steps=10",
                                     "fedkwsui.local_steps=10", "train.eval_every=4", "train.checkpoint_every=4"])
KWS_CENTRAL = ["algorithm=central", "train.rounds=50", "train.batch_size=128", "train.local_steps=0",
               "train.local_epochs=1", "central.warmup_epochs=5", "train.eval_every=1", "train.checkpoint_every=1"]
KWS_ALO_OFF = "fedkwsui.ls_mu=0,fedkwsui.adv_lambda=0"
FEDKWS = PRESETS["fedkws"]
KWS_TABLES = {"accuracy": "Shared model on the test split (accuracy)",
              "test_last5_mean": "Shared model on the test split: mean accuracy of the last 5 evaluations",
              "fa": "Shared model on the test split: false accepts (% of clips)",
              "fr": "Shared model on the test split: false rejects (% of clips)",
              "clean_accuracy": "Shared model on the clean test split (accuracy; the tables above use the fixed augmented one)"}
#: Kept apart from fedmlac.md's EXPERIMENTS (whose toy-size test runs FedMLAC in every one); `fedac
#: reproduce` finds both (`experiment_named`).
KWS_EXPERIMENTS: dict[str, Experiment] = {
    "fedkws12": Experiment("FedKWS-UI Fig. 2 (task 12) and Table 3 (FA / FR)", FEDKWS, KWS_NETWORKS,
                           ("speech_commands",), KWS_PROTOCOL, KWS_TABLES, curves=True),
    "fedkws12-scaled": Experiment("FedKWS-UI Fig. 2 (task 12) and Table 3 (FA / FR), scaled to two CPU cores",
                                  FEDKWS, KWS_NETWORKS[:2], ("speech_commands",), KWS_SCALED, KWS_TABLES, curves=True),
    "fedkws-alt": Experiment("FedKWS-UI Fig. 3 left: ALT only (task 35)",
                             ["FedAvg=fedavg", "FedKWS-UI=fedkwsui", f"ALT only=fedkwsui:{KWS_ALO_OFF}"],
                             KWS_NETWORKS, ("speech_commands",), replaced(KWS_PROTOCOL, ["data.task=35"]),
                             {"accuracy": KWS_TABLES["accuracy"]}),
    "fedkws-mu": Experiment("FedKWS-UI Fig. 3 middle: label smoothing mu (task 12)",
                            [f"mu {m}=fedkwsui:fedkwsui.ls_mu={m}" for m in (0.0, 0.1, 0.2, 0.3, 0.5)],
                            KWS_NETWORKS[::2], ("speech_commands",), KWS_PROTOCOL, KWS_TABLES),
    "fedkws-lambda": Experiment("FedKWS-UI Fig. 3 right: negative distillation lambda (task 12)",
                                [f"lambda {v}=fedkwsui:fedkwsui.adv_lambda={v}" for v in (0.0, 1e-4, 1e-3, 1e-2, 0.1)],
                                KWS_NETWORKS[::2], ("speech_commands",), KWS_PROTOCOL, KWS_TABLES),
    # Table 2's column (train_classify.py): one pooled client, 50 epochs of batch 128 (a round is one epoch),
    # 5 warm-up epochs then quadratic decay; the code gives no lr, so the federated protocol's (KWT: AdamW).
    "fedkws-central": Experiment("FedKWS-UI Table 2: centralised training (task 12; --set data.task=35 for the other)",
                                 ["Centralised=central"], KWS_NETWORKS, ("speech_commands",),
                                 replaced(KWS_PROTOCOL, KWS_CENTRAL), {k: KWS_TABLES[k] for k in ("accuracy", "clean_accuracy")}),
}


def kws_notes(settings: list[str], methods: list[Method], dataset: str) -> list[str]:
    """A KWS table's notes, from its methods' resolved settings: the weighting of each federated method's
    server mean (one for all, or each method's) and ALT's r0."""
    from fedac.algorithms import algorithm_class  # lazy: imports torch

    configs = {m.label: load_config(None, settings + m.overrides, algorithm_defaults=False, algorithm=m.algorithm,
                                    dataset=dataset) for m in methods}
    weights = {label: algorithm_class(cfg.algorithm).server_weighting(cfg)
               for label, cfg in configs.items() if cfg.algorithm != "central"}
    words = {"uniform": "unweighted (1/|S| per upload)", "n_k": "n_k-weighted"}
    notes = []
    if len(set(weights.values())) == 1:
        weighting = next(iter(weights.values()))
        notes.append(f"Server mean: {words[weighting]} for every method (aggregation.weighting={weighting}).")
    elif weights:
        notes.append("Server mean: " + "; ".join(f"{label} {words[w]}" for label, w in weights.items()) + ".")
    alt = [cfg.fedkwsui for cfg in configs.values() if cfg.algorithm == "fedkwsui" and cfg.fedkwsui.alt]
    if alt:
        r0 = alt[0].r0
        notes.append(f"ALT: r0 = K / sum_k rbar_k over each run's clients (fedkwsui.r0=sum), so sum_k r0 rbar_k E = "
                     f"K E and a client takes E = {alt[0].local_steps} steps on average before flooring (`fedac data "
                     f"stats` with the protocol's data settings prints the mean)." if r0 == "sum" else
                     f"ALT: r0 = {r0} (fedkwsui.r0; `fedac data stats` prints the mean steps per client).")
    return notes


def experiment_named(name: str) -> Experiment:
    known = {**EXPERIMENTS, **KWS_EXPERIMENTS}
    if name not in known:
        raise ConfigError(f"unknown experiment '{name}'. Experiments: {', '.join(known)}")
    return known[name]

#: The tables written, one per kind of model and split (report.FINAL_KEYS).
TABLES = {
    "accuracy": "Shared model on the test split (accuracy)",
    "personalized_local_accuracy_mean": "Clients' own models on their own held-out data (mean accuracy over clients)",
    "personalized_accuracy_mean": "Clients' own models on the test split (mean accuracy over clients)",
}


@dataclass
class Cell:
    label: str
    dataset: str
    settings: list[str]


def cells(experiment: Experiment, datasets: list[str] | None) -> list[Cell]:
    chosen = datasets or list(experiment.datasets)
    unknown = [d for d in chosen if d not in DATASETS]
    if unknown:
        raise ConfigError(f"unknown dataset(s) {', '.join(unknown)}; choose from {', '.join(DATASETS)}")
    out = []
    for dataset in chosen:
        for label, settings in experiment.variants or [("", [])]:
            name = f"{dataset} {label}".strip()
            out.append(Cell(name, dataset, DATASETS[dataset] + settings))
    return out


def run_experiment(name: str, seeds: list[int], out: Path, overrides: list[str], datasets: list[str] | None = None,
                   rounds: int | None = None, command: str = "", progress: bool = True,
                   only: list[str] | None = None, finished_only: bool = False) -> dict:
    """Run (or complete) every cell of an experiment and write table.md, results.csv and figure.png;
    `finished_only` writes them from the runs that have ended and trains nothing."""
    experiment = experiment_named(name)
    methods = [parse_method(m) for m in experiment.methods]
    if only:
        unknown = set(only) - {m.label for m in methods}
        if unknown:
            raise ConfigError(f"{name} has no method(s) {', '.join(sorted(unknown))}; "
                              f"its methods: {', '.join(m.label for m in methods)}")
        methods = [m for m in methods if m.label in only]
    # The user's settings come last, after the protocol's and each method's own.
    user = list(overrides) + ([f"train.rounds={rounds}"] if rounds is not None else [])
    started = time.perf_counter()
    summaries: dict[str, dict] = {}
    out.mkdir(parents=True, exist_ok=True)

    first = cells(experiment, datasets)[0]
    notes = kws_notes((experiment.protocol or []) + first.settings + user, methods, first.dataset) \
        if name in KWS_EXPERIMENTS else []

    def write_outputs() -> None:
        write_csv(out / "results.csv", summaries)
        (out / "table.md").write_text(markdown(experiment, summaries, seeds, command, notes))
        plot(out / "figure.png", experiment, summaries, methods)
        if experiment.curves:
            plot_curves(out / "curves.png", experiment, summaries)

    for wait_for_others in comparison_passes(finished_only):
        for cell in cells(experiment, datasets):
            settings = (PROTOCOL if experiment.protocol is None else experiment.protocol) + cell.settings
            base = load_config(None, settings + user, dataset=cell.dataset)
            folder = out / cell_folder(cell.label)
            if progress:
                print(f"=== {experiment.title}: {cell.label}")
            summaries.setdefault(cell.label, {"methods": [m.__dict__ for m in methods],
                                              "runs": {m.label: [] for m in methods}})

            def on_run(runs: dict[str, list[dict]], label: str = cell.label) -> None:
                summaries[label]["runs"] = runs
                write_outputs()  # a table of what has finished so far: a killed reproduction still shows it

            run_comparison(base, methods, seeds, folder, settings, None, progress, last=user, on_run=on_run,
                           finished_only=finished_only, wait_for_others=wait_for_others)
    write_outputs()
    return {"experiment": name, "cells": list(summaries), "wall_seconds": time.perf_counter() - started}


def write_csv(path: Path, summaries: dict[str, dict]) -> None:
    keys = ["accuracy", "macro_f1", "client_accuracy_mean", "personalized_local_accuracy_mean",
            "personalized_accuracy_mean", "personalized_clients", "visits_per_trained_client", "wall_seconds",
            "fa", "fr", "test_last5_mean", "clean_accuracy"]
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["cell", "method", "seed", *keys, "run_dir"])
        for cell, summary in summaries.items():
            for method, runs in summary["runs"].items():
                for run in runs:
                    writer.writerow([cell, method, run["seed"], *[run.get(k, "") for k in keys], run["run_dir"]])


def _cell_value(runs: list[dict], key: str, seeds: int) -> str:
    """mean ± std over seeds (the mean alone from one seed: no spread to show); `(n=k)` while only k of the
    seeds have finished; — without such a model."""
    values = [r[key] for r in runs if r.get(key) is not None]
    if not values:
        return "—" if runs else "pending"
    mean, std = mean_std(values)
    partial = f" (n={len(values)})" if len(values) < seeds else ""
    spread = f" ± {100 * std:.2f}" if len(values) > 1 else ""
    return "—" if mean != mean else f"{100 * mean:.2f}{spread}{partial}"


def markdown(experiment: Experiment, summaries: dict[str, dict], seeds: list[int], command: str,
             notes: list[str] = ()) -> str:
    first = next(iter(summaries.values()))
    methods = [m["label"] for m in first["methods"]]
    visits = sorted({round(r.get("visits_per_trained_client", 0.0), 1)
                     for s in summaries.values() for rs in s["runs"].values() for r in rs})
    lines = [f"# {experiment.title}", "", f"Command: `{command}`" if command else "", "",
             f"Protocol: {', '.join(PROTOCOL if experiment.protocol is None else experiment.protocol)}; "
             f"mean ± std over seeds {seeds}; visits per trained client: "
             f"{', '.join(str(v) for v in visits)}. '—': the method has no such model.", "",
             *(line for note in notes for line in (note, ""))]
    for key, title in (experiment.tables or TABLES).items():
        lines += [f"## {title}", "", "| Method | " + " | ".join(summaries) + " |", "|---" * (len(summaries) + 1) + "|"]
        for method in methods:
            lines.append(f"| {method} | " + " | ".join(_cell_value(s["runs"][method], key, len(seeds))
                                                       for s in summaries.values()) + " |")
        lines.append("")
    lines += ["## Wall time per run (seconds, mean over finished seeds)", "",
              "| Method | " + " | ".join(summaries) + " |", "|---" * (len(summaries) + 1) + "|"]
    for method in methods:
        walls = [[r["wall_seconds"] for r in s["runs"][method] if r.get("wall_seconds")] for s in summaries.values()]
        lines.append(f"| {method} | " + " | ".join(f"{sum(w) / len(w):.0f}" if w else "pending" for w in walls) + " |")
    return "\n".join(lines) + "\n"


def plot(path: Path, experiment: Experiment, summaries: dict[str, dict], methods: list[Method]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cells_ = list(summaries)
    tables = experiment.tables or TABLES
    fig, axes = plt.subplots(1, len(tables), figsize=(5 * len(tables), 4), squeeze=False)
    width = 0.8 / len(methods)
    for ax, (key, title) in zip(axes[0], tables.items()):
        for i, method in enumerate(methods):
            stats = [mean_std([r[key] for r in summaries[c]["runs"][method.label] if r.get(key) is not None])
                     for c in cells_]
            ax.bar(np.arange(len(cells_)) + i * width, [100 * m for m, _ in stats], width,
                   yerr=[100 * s for _, s in stats], label=method.label, capsize=2)
        ax.set_xticks(np.arange(len(cells_)) + 0.4 - width / 2, cells_, rotation=30, ha="right", fontsize=8)
        ax.set_title(title, fontsize=9), ax.set_ylabel("accuracy (%)"), ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(experiment.title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def seed_curve(runs: list[dict], column: str) -> tuple[list[int], list[float], list[float]]:
    """A metrics.csv column of the shared model (`test_accuracy`, logged with `train.test_curve` as in
    the paper's Fig. 2, or `val_accuracy`) per evaluated round, mean and std over the runs (seeds). Only
    the rounds every run evaluated are kept, so a point is never a mean over fewer seeds than its
    neighbours; no rounds when a run did not log the column."""
    per_run = []
    for run in runs:
        with open(Path(run["run_dir"]) / "metrics.csv") as handle:
            per_run.append({int(r["round"]): float(r[column]) for r in csv.DictReader(handle) if r.get(column)})
    rounds = sorted(set.intersection(*(set(c) for c in per_run))) if per_run else []
    stats = [mean_std([c[t] for c in per_run]) for t in rounds]
    return rounds, [m for m, _ in stats], [s for _, s in stats]


def plot_curves(path: Path, experiment: Experiment, summaries: dict[str, dict]) -> None:
    """Fig. 2 of FedKWS-UI as fedac draws it: one panel per cell, one colour per method, its mean test
    accuracy over the finished seeds per evaluated round with a band of ± one std (solid) and its mean
    validation accuracy (dashed; the solid line is validation when no test curve was logged); the legend
    gives the mean of the last 5 evaluations (the paper's legend numbers) where the runs report it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, len(summaries), figsize=(6 * len(summaries), 4), squeeze=False)
    for ax, (cell, summary) in zip(axes[0], summaries.items()):
        for method, runs in summary["runs"].items():
            val = seed_curve(runs, "val_accuracy")
            test = seed_curve(runs, "test_accuracy")
            rounds, mean, std = test if test[0] else val
            if not rounds:
                continue
            last5 = [r["test_last5_mean"] for r in runs if r.get("test_last5_mean") is not None]
            label = f"{method} ({100 * np.mean(last5):.1f})" if last5 else method
            mean, std = 100 * np.array(mean), 100 * np.array(std)
            (line,) = ax.plot(rounds, mean, label=label)
            ax.fill_between(rounds, mean - std, mean + std, alpha=0.2, color=line.get_color())
            if test[0] and val[0]:
                ax.plot(val[0], 100 * np.array(val[1]), "--", linewidth=0.8, color=line.get_color())
        ax.set_title(cell, fontsize=9), ax.set_xlabel("round"), ax.set_ylabel("shared model accuracy (%)")
        ax.grid(alpha=0.3), ax.legend(fontsize=7)
    fig.suptitle(f"{experiment.title}\nsolid: test (± std over the finished seeds), dashed: validation", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


#: The other papers' experiments, whose grids and tables are their own: name -> "module:function", the
#: function taking the parsed arguments and returning the exit code.
OTHER_EXPERIMENTS = {
    "robustness": "fedac.robustness:cmd_robustness",  # attacks x aggregators
    "zeroshot-table3": "fedac.zeroshot_tables:reproduce", "zeroshot-table4": "fedac.zeroshot_tables:reproduce",
    "earlyexit-table1": "fedac.earlyexit_tables:reproduce", "earlyexit-table2": "fedac.earlyexit_tables:reproduce",
}


def cmd_reproduce(args: argparse.Namespace) -> int:
    # An option the experiment does not read is refused, not silently dropped.
    robustness_only = {"--attacks": args.attacks, "--fractions": args.fractions, "--aggregators": args.aggregators}
    unused = [option for option, given in robustness_only.items() if given and args.experiment != "robustness"]
    zeroshot = args.experiment.startswith("zeroshot")  # its own grid: no method list, nothing to resume from
    unused += [option for option, given in (("--methods", args.methods), ("--finished-only", args.finished_only))
               if given and zeroshot]
    if args.central_epochs is not None and args.experiment != "earlyexit-table1":
        unused.append("--central-epochs")
    elif args.central_epochs is not None and args.central_epochs < 1:
        raise ConfigError(f"--central-epochs must be at least 1, got {args.central_epochs}")
    if unused:
        raise ConfigError(f"{args.experiment} does not use {', '.join(unused)}"
                          + (" (rerun the command to complete a killed zero-shot table)" if zeroshot else ""))
    if args.experiment in OTHER_EXPERIMENTS:
        module, function = OTHER_EXPERIMENTS[args.experiment].split(":")
        args.progress = not args.quiet
        return getattr(importlib.import_module(module), function)(args)
    out = Path(args.out or f"runs/reproduce-{args.experiment}")
    command = "fedac " + " ".join(shlex.quote(a) for a in args.argv)
    summary = run_experiment(args.experiment, args.seeds, out, args.overrides, args.datasets, args.rounds,
                             command, progress=not args.quiet, only=args.methods, finished_only=args.finished_only)
    print((out / "table.md").read_text())
    print(f"{len(summary['cells'])} cells in {summary['wall_seconds']:.0f} s; table.md, results.csv, figure.png in {out}")
    return 0


def add_reproduce_parser(sub) -> None:
    p = sub.add_parser("reproduce", help="a paper's experiment: fedmlac.md's Tables 4-7, Figs. 2-3 and alpha sweep, "
                                         "FedKWS-UI's, the zero-shot and early-exit papers' tables, the robustness table")
    p.add_argument("experiment", help=f"one of: {', '.join([*EXPERIMENTS, *KWS_EXPERIMENTS, *OTHER_EXPERIMENTS])}")
    p.add_argument("--datasets", nargs="+", help=f"default {' '.join(STAND_INS)}; a real copy: --set data.root=DIR")
    p.add_argument("--methods", nargs="+", metavar="LABEL", help="only these of the experiment's methods (by label)")
    p.add_argument("--attacks", nargs="+", help="robustness: attack rows (default all kinds of attack.kind)")
    p.add_argument("--fractions", nargs="+", type=float, help="robustness: malicious fractions (default 0.1 0.2 0.3)")
    p.add_argument("--aggregators", nargs="+", help="robustness: aggregator columns (default all; quote names with spaces)")
    p.add_argument("--central-epochs", type=int, help="earlyexit-table1: the centralised rows' epochs (default: "
                   "rounds x train.fraction, the clips an FL row trains on in all)")
    add_grid_arguments(p, "output folder (default runs/reproduce-<experiment>); rerun to resume")
    p.set_defaults(func=cmd_reproduce)
