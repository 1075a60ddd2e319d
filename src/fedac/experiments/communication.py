"""The accuracy-against-bytes frontier (`fedac reproduce communication`): how much test accuracy
each way of sending fewer bytes costs, 3 seeds, as two tables and one figure.

- Panel "fedavg": FedAvg on the default task (`fedac run`'s: the Speech Commands stand-in,
  CRNN-Lite) with its uploads compressed (docs/compression.md): none, top-k at 10 % and 1 % each
  with and without error feedback, QSGD at 4 and 16 levels (QSGD runs without error feedback), int8
  and bf16.
- Panel "earlyexit": the early-exit KWS task on the shipped `w2v2_s` (earlyexit.py's table
  settings: AdamW, head rate, head norm, 12-word task, T_task = exit 6) with each way of
  fine-tuning the encoder (docs/ssl.md): full fine-tuning, the head alone (`model.peft=head`), LoRA
  at ranks 4 and 16 (alpha = 2 r) and IA3, each with every client at exit 6 (homo) and with the
  depth split (hetero: half the clients at exit 3, half at 6, depth-weighted aggregation, Eq. 1).

Per run: the shared model's test accuracy (results.json) and the bytes its clients uploaded in all
(metrics.csv's last `upload_bytes_total`, the ledger of what would travel). Per setting: mean ± std
over seeds, the mean bytes and their ratio to the panel's first row (no compression; full
fine-tuning at exit 6), and on the early-exit panel the parameters a client at exit 6 trains.

Schedules (both reduced: the whole table, 57 runs, took 50 minutes of run time in all on two busy
cores, docs/results/communication):
- `FEDAVG_QUICK` ("comm-fedavg-quick"): the default run cut from 50 rounds to 20 (24 of 240
  clients a round, 1 local epoch): the default run's validation accuracy is about 39 % there (65 %
  at 50).
- `EARLYEXIT_QUICK` ("comm-ee-quick"): 8 clients (seeded choice), all active, 4 rounds of 1 local
  epoch, exits 3 and 6 only (deeper exits are never trained at T_task = 6; leaving them out halves
  the evaluation), evaluated at the end. Far from the early-exit table's 30 rounds
  (docs/results/reproduce-earlyexit-table2): it ranks the settings by how fast they learn.
"""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

from fedac.config import load_config
from fedac.errors import ConfigError
from fedac.experiments import earlyexit
from fedac.experiments.compare import Method, cell_folder, parse_method
from fedac.experiments.runner import seed_stats, write_run_tables
from fedac.experiments.spec import Cell, Cost, Experiment, Layout, Request

DATASET = "speech_commands"
#: The reduced schedule of the FedAvg panel ("comm-fedavg-quick"): `fedac run`'s defaults but the
#: rounds.
FEDAVG_QUICK = ["train.rounds=20"]
#: The reduced schedule of the early-exit panel ("comm-ee-quick"), after earlyexit.BASE.
EARLYEXIT_QUICK = [
    "data.task=12",
    "data.max_clients=8",
    "train.fraction=1.0",
    "train.rounds=4",
    "earlyexit.exits=[3,6]",
    "train.eval_every=4",
    "train.checkpoint_every=4",
]
#: T_task of the KWS task (earlyexit.TASK_DEPTH): homo FL's exit and the deep clients'.
TASK_DEPTH = earlyexit.TASK_DEPTH[DATASET]
EARLYEXIT_SETTINGS = [
    *earlyexit.BASE,
    *earlyexit.CLASSIFICATION,
    f"earlyexit.depth={TASK_DEPTH}",
    f"earlyexit.high_depth={TASK_DEPTH}",
    *EARLYEXIT_QUICK,
]
COMPRESSIONS = [
    "none=fedavg",
    "topk 10% EF=fedavg:compression.method=topk,compression.ratio=0.1",
    "topk 10% no EF=fedavg:compression.method=topk,compression.ratio=0.1,"
    "compression.error_feedback=false",
    "topk 1% EF=fedavg:compression.method=topk,compression.ratio=0.01",
    "topk 1% no EF=fedavg:compression.method=topk,compression.ratio=0.01,"
    "compression.error_feedback=false",
    "qsgd 4 levels=fedavg:compression.method=qsgd,compression.levels=4,"
    "compression.error_feedback=false",
    "qsgd 16 levels=fedavg:compression.method=qsgd,compression.levels=16,"
    "compression.error_feedback=false",
    "int8=fedavg:compression.method=int8",
    "bf16=fedavg:compression.method=bf16",
]
#: How the encoder is fine-tuned: label -> model settings.
FINE_TUNING = {
    "full": ["model.peft=none"],
    "head only": ["model.peft=head"],
    "LoRA r4": ["model.peft=lora", "model.peft_rank=4", "model.peft_alpha=8"],
    "LoRA r16": ["model.peft=lora", "model.peft_rank=16", "model.peft_alpha=32"],
    "IA3": ["model.peft=ia3"],
}
DEPTHS = {
    "homo": ["earlyexit.mode=homo"],
    "hetero": ["earlyexit.mode=hetero", "earlyexit.aggregation=depth_weighted"],
}
FINE_TUNINGS = [
    Method(f"{tuning} ({depths})", "earlyexit", settings + mode)
    for tuning, settings in FINE_TUNING.items()
    for depths, mode in DEPTHS.items()
]
#: Panel -> (title, settings every run starts from, its rows).
PANELS: dict[str, tuple[str, list[str], list[Method]]] = {
    "fedavg": (
        "FedAvg, CRNN-Lite, compressed uploads (comm-fedavg-quick)",
        FEDAVG_QUICK,
        [parse_method(m) for m in COMPRESSIONS],
    ),
    "earlyexit": (
        f"Early-exit KWS, w2v2_s, fine-tuning choices, exit {TASK_DEPTH} (comm-ee-quick)",
        EARLYEXIT_SETTINGS,
        FINE_TUNINGS,
    ),
}
CSV_KEYS = ["accuracy", "uar", "upload_bytes_total", "wall_seconds"]
#: The figures averaged over seeds: result key -> column title.
SCORES = {"accuracy": "Accuracy (%)", "uar": "UAR (%)"}


def cells(spec: Experiment, request: Request) -> list[Cell]:
    """One cell per panel, in its folder under --out; --methods picks rows of either panel."""
    if request.datasets not in (None, [DATASET]):
        raise ConfigError(
            f"communication runs on {DATASET} (a real copy: --set data.root=DIR), not "
            f"{request.datasets}"
        )
    labels = {m.label for _, _, methods in PANELS.values() for m in methods}
    unknown = set(request.methods or ()) - labels
    if unknown:
        raise ConfigError(
            f"communication has no method(s) {', '.join(sorted(unknown))}; its methods: "
            f"{', '.join(sorted(labels))}"
        )
    out = []
    for panel, (_, settings, methods) in PANELS.items():
        chosen = [m for m in methods if not request.methods or m.label in request.methods]
        if not chosen:
            continue
        algorithm = chosen[0].algorithm
        base = load_config(None, settings + request.user, algorithm=algorithm, dataset=DATASET)
        folder = request.out / cell_folder(panel)
        out.append(Cell(panel, DATASET, folder, base, settings, chosen, request.user))
    return out


def uploaded_bytes(run_dir: Path) -> float | None:
    """The bytes a run's clients uploaded in all: metrics.csv's last `upload_bytes_total`."""
    path = run_dir / "metrics.csv"
    if not path.is_file():
        return None
    with open(path) as handle:
        totals = [r["upload_bytes_total"] for r in csv.DictReader(handle)]
    return float(totals[-1]) if totals and totals[-1] else None


def trained_by_deep_client(method: Method, num_classes: int) -> int:
    """The parameters a client at exit T_task trains under `method`'s fine-tuning (counted on the
    meta device: the sizes, not the weights, matter)."""
    import torch  # lazy: the parser reads the specs

    from fedac.algorithms.earlyexit import EarlyExitFL
    from fedac.models.early_exit import build_multi_exit

    cfg = load_config(
        None, EARLYEXIT_SETTINGS + method.overrides, algorithm="earlyexit", dataset=DATASET
    )
    options = replace(cfg.model, encoder_path="random")
    with torch.device("meta"):
        model = build_multi_exit(
            cfg.model.name, "classification", num_classes, cfg.earlyexit.exits, options, 0.0
        )
    return sum(
        p.numel()
        for n, p in model.named_parameters()
        if n not in model.frozen and EarlyExitFL.trained(n, TASK_DEPTH)
    )


def summarise(runs: dict[str, dict[str, list[dict]]]) -> dict[str, dict[str, dict]]:
    """Per panel and setting: accuracy mean and std over seeds, mean uploaded bytes and their ratio
    to the panel's first row, the seeds; the early-exit rows add the parameters a client trains."""
    summary: dict[str, dict[str, dict]] = {}
    for panel, by_method in runs.items():
        rows: dict[str, dict] = {}
        methods = {m.label: m for m in PANELS[panel][2]}
        for label, method_runs in by_method.items():
            sent = [r["upload_bytes_total"] for r in method_runs if r.get("upload_bytes_total")]
            row: dict = {
                "seeds": [r["seed"] for r in method_runs],
                **seed_stats(method_runs, list(SCORES)),
            }
            if sent:
                row["upload_bytes"] = sum(sent) / len(sent)
            if panel == "earlyexit" and method_runs:
                results = Path(method_runs[0]["run_dir"]) / "results.json"
                classes = json.loads(results.read_text())["num_classes"]
                row["trainable_parameters"] = trained_by_deep_client(methods[label], classes)
            rows[label] = row
        reference = next(iter(rows.values()), {}).get("upload_bytes")
        for row in rows.values():
            if reference and "upload_bytes" in row:
                row["bytes_ratio"] = row["upload_bytes"] / reference
        summary[panel] = rows
    return summary


def majority_share(runs: dict[str, dict[str, list[dict]]]) -> dict[str, float]:
    """Per panel: the test split's share of its most frequent class (what a model that predicts it
    alone scores), from a run's confusion counts (rows: true classes)."""
    out = {}
    for panel, by_method in runs.items():
        first = next((rs[0] for rs in by_method.values() if rs), None)
        results = Path(first["run_dir"]) / "results.json" if first else None
        if results is None or not results.is_file():
            continue
        counts = json.loads(results.read_text()).get("confusion", {}).get("counts")
        if counts:
            out[panel] = max(map(sum, counts)) / sum(map(sum, counts))
    return out


def _score(row: dict, key: str, seeds: int) -> str:
    if key not in row:
        return "pending"
    mean, std = row[key]["mean"], row[key]["std"]
    partial = f" (n={len(row['seeds'])})" if len(row["seeds"]) < seeds else ""
    return f"{100 * mean:.2f} ± {100 * std:.2f}{partial}"


def markdown(
    request: Request, summary: dict[str, dict[str, dict]], majority: dict[str, float]
) -> str:
    lines = [
        "# Accuracy against uploaded bytes",
        "",
        f"Command: `{request.command}`" if request.command else "",
        "",
        "Shared model's test accuracy and UAR (unweighted average recall: the mean of the "
        "classes' recalls, which a model predicting the majority class alone keeps at 100 / "
        f"classes) in %, mean ± population std over seeds {request.seeds}; uploaded bytes: "
        "every client's uploads over the run (the byte ledger, metrics.csv `upload_bytes_total`), "
        "mean over seeds; '/ first row': the bytes over the panel's first row's.",
        "",
    ]
    for panel, rows in summary.items():
        title, settings, _ = PANELS[panel]
        extra = panel == "earlyexit"
        lines += [f"## {title}", "", f"Settings: {', '.join(settings)}", ""]
        if panel in majority:
            lines += [
                f"The test split's most frequent class is {100 * majority[panel]:.2f} % of it "
                "(the accuracy of predicting it alone).",
                "",
            ]
        header = f"| Setting | {' | '.join(SCORES.values())} | Uploaded bytes | / first row |"
        header += " Trained by a client at exit 6 |" if extra else ""
        lines += [header, "|---" * (header.count("|") - 1) + "|"]
        for label, row in rows.items():
            sent, ratio = row.get("upload_bytes"), row.get("bytes_ratio")
            cells = [
                label,
                *(_score(row, key, len(request.seeds)) for key in SCORES),
                f"{sent:,.0f}" if sent else "pending",
                f"{ratio:.4f}" if ratio is not None else "-",
            ]
            if extra:
                cells.append(
                    f"{row['trainable_parameters']:,}" if "trainable_parameters" in row else "-"
                )
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def plot(path: Path, summary: dict[str, dict[str, dict]], majority: dict[str, float]) -> None:
    """Accuracy against uploaded bytes (log x), one marker per setting with its std as error bar,
    one panel per table, the majority class's share as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(summary), figsize=(7 * len(summary), 5), squeeze=False)
    for ax, (panel, rows) in zip(axes[0], summary.items()):
        markers = "osD^vP*Xh<>p"
        for i, (label, row) in enumerate(rows.items()):
            if "accuracy" not in row or "upload_bytes" not in row:
                continue
            ax.errorbar(
                row["upload_bytes"],
                100 * row["accuracy"]["mean"],
                yerr=100 * row["accuracy"]["std"],
                fmt=markers[i % len(markers)],
                capsize=3,
                label=label,
            )
        if panel in majority:
            ax.axhline(100 * majority[panel], ls="--", color="grey", label="majority class")
        ax.set_xscale("log")
        ax.set_xlabel("uploaded bytes over the run (log)")
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(PANELS[panel][0], fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(
    spec: Experiment, request: Request, cells: list[Cell], runs: dict[str, dict[str, list[dict]]]
) -> None:
    """results.csv (one line per run), summary.json, table.md and figure.png."""
    filled = ("upload_bytes_total", lambda where: {"upload_bytes_total": uploaded_bytes(where)})
    summary = write_run_tables(request.out, runs, CSV_KEYS, filled, summarise)
    majority = majority_share(runs)
    (request.out / "table.md").write_text(markdown(request, summary, majority))
    plot(request.out / "figure.png", summary, majority)


SPECS = [
    Experiment(
        "communication",
        "-",
        "-",
        "Accuracy against uploaded bytes: compressed FedAvg and parameter-efficient early exits",
        Cost(
            50,
            "docs/results/communication/results.csv: 57 runs, 3,021 s (FedAvg 2,121 s, early "
            "exits 899 s), two copies side by side at load 4-8",
        ),
        datasets=(DATASET,),
        options=("--methods", "--finished-only"),
        layout=Layout(cells=cells, write=write),
    )
]
