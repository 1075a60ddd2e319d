"""Run-directory outputs: metrics.csv (one row per evaluated round), results.json, curves.png, and
the final table printed by the CLI."""

from __future__ import annotations

import csv
import json
import math
import os
import textwrap
from pathlib import Path
from typing import Any

from fedac.config import Config
from fedac.engine.tracking import read_back, track
from fedac.settings.codecs import codec_spec
from fedac.version import code_version


def _atomic_write(path: Path, text: str | bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(text if isinstance(text, bytes) else text.encode())
    os.replace(tmp, path)


def json_safe(value: Any) -> Any:
    """JSON has no NaN: write null instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def write_history(
    run_dir: Path, history: list[dict[str, float]], name: str = "metrics.csv"
) -> None:
    """A CSV of per-round rows (metrics.csv; the virtual clock's system.csv), rewritten whole and
    atomically, the columns in the order they first appear."""
    columns: list[str] = []
    for row in history:
        columns += [key for key in row if key not in columns]
    path = Path(run_dir) / name
    tmp = path.with_name(f".{name}.tmp{os.getpid()}")
    with open(tmp, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        for row in history:
            writer.writerow({k: (int(v) if k == "round" else v) for k, v in row.items()})
    os.replace(tmp, path)


#: The left panel of curves.png: (metrics.csv column, label), each drawn when the run logged it.
#: A method without a shared model (FedRep, FedPer, LG-FedAvg, local) logs no val_* and draws
#: its own models' held-out accuracy alone; one that has both (Ditto, APFL) draws both.
SCORE_CURVES = (
    ("val_accuracy", "shared model: val accuracy"),
    ("val_macro_f1", "shared model: val macro-F1"),
    ("test_accuracy", "shared model: test accuracy (train.test_curve)"),
    ("local_accuracy", "own models: accuracy on their client's held-out clips (mean)"),
    ("val_wer", "shared model: val word error rate (lower is better)"),
    ("val_cer", "shared model: val character error rate (lower is better)"),
)


def curves_figure(history: list[dict[str, float]], title: str):
    """curves.png's figure: on the left every SCORE_CURVES column the history holds, on the right
    the mean client training loss. A run that logged no score says so in the left panel instead of
    drawing empty axes."""
    plt = pyplot()
    rounds = [row["round"] for row in history]
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(10, 4))
    drawn = [(key, label) for key, label in SCORE_CURVES if any(key in row for row in history)]
    for key, label in drawn:
        ax_acc.plot(rounds, [row.get(key, math.nan) for row in history], marker="o", label=label)
    if drawn:
        ax_acc.set_xlabel("round"), ax_acc.set_ylabel("score"), ax_acc.grid(alpha=0.3)
        ax_acc.legend(fontsize="small")
    else:
        ax_acc.axis("off")
        ax_acc.text(
            0.5, 0.5, "no model was scored during the rounds", ha="center", va="center", wrap=True
        )
    ax_loss.plot(
        rounds, [row.get("train_loss", math.nan) for row in history], marker="o", color="tab:red"
    )
    (
        ax_loss.set_xlabel("round"),
        ax_loss.set_ylabel("mean client training loss"),
        ax_loss.grid(alpha=0.3),
    )
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_curves(run_dir: Path, history: list[dict[str, float]], title: str) -> None:
    fig = curves_figure(history, title)
    fig.savefig(Path(run_dir) / "curves.png", dpi=100)
    pyplot().close(fig)


#: What each key of results.json's "final" means; written into every results.json as "legend".
FINAL_KEYS = {
    "has_global_model": "whether the method has a shared model (FedKAD has none)",
    "accuracy": "shared model (the one selected on validation) on the test split: clip accuracy",
    "macro_f1": "shared model on the test split: macro-F1 over classes",
    "uar": "shared model on the test split: unweighted average recall",
    "selected_round": "round of the evaluated shared model (train.select)",
    "client_accuracy_mean": "shared model on each client's own held-out windows: mean over clients",
    "client_accuracy_std": "shared model on each client's own held-out windows: std over clients",
    "personalized_accuracy_mean": (
        "each trained client's own model on the test split: mean over those clients"
    ),
    "personalized_accuracy_std": (
        "each trained client's own model on the test split: std over those clients"
    ),
    "personalized_macro_f1_mean": (
        "each trained client's own model on the test split: mean macro-F1"
    ),
    "personalized_macro_f1_std": (
        "each trained client's own model on the test split: std of macro-F1"
    ),
    "personalized_local_accuracy_mean": (
        "each trained client's own model on its own held-out windows: mean"
    ),
    "personalized_local_accuracy_std": (
        "each trained client's own model on its own held-out windows: std"
    ),
    "personalized_clients": (
        "clients whose own models the personalized_* means cover (trained at least once)"
    ),
    "clients_trained": "clients sampled and trained at least once in the run",
    "wer": (
        "shared model on the test split (CTC tasks): corpus word error rate of greedy transcripts"
    ),
    "cer": "shared model on the test split (CTC tasks): corpus character error rate",
    "test_other_wer": "shared model on LibriSpeech's test-other split: word error rate",
    "test_other_cer": "shared model on LibriSpeech's test-other split: character error rate",
    "asv_eer": (
        "shared model's pooled embeddings on the verification trials (cosine score): equal error "
        "rate"
    ),
    "visits_per_trained_client": "mean number of rounds in which a trained client trained",
    "fa": "shared model on the test split (12-class keyword spotting): false accepts / all clips",
    "fr": "shared model on the test split (12-class keyword spotting): false rejects / all clips",
    "test_last5_mean": (
        "shared model on the test split: mean accuracy of the last 5 evaluations (train.test_curve)"
    ),
    "clean_accuracy": (
        "shared model on the clean test split, when features.test_augment augments the test split"
    ),
    "malicious_clients": "clients poisoned by attack.kind (a seeded choice fixed for the run)",
    "attack_success_rate": (
        "backdoor (or attack.measure_backdoor): shared model on the triggered test clips of other "
        "classes: share predicted as attack.target"
    ),
    "dp_epsilon": (
        "differential privacy: epsilon spent over the rounds trained at dp_delta (opacus RDP "
        "accountant)"
    ),
    "dp_delta": "differential privacy: the delta of dp_epsilon (dp.delta)",
}


#: The scope of a run's wall_seconds (engine/run.py), as printed and in results.json's legend.
WALL_SCOPE = (
    "seconds of the rounds, their evaluations and checkpoints and the final evaluation, summed "
    "over every sitting of a resumed run; the data's generation and feature extraction are not "
    "counted"
)
WALL_LABEL = "wall time (rounds + evaluations, all sittings)"


#: Final keys measured on the clients' local held-out windows (data.local_holdout of each client's
#: clips).
HELD_OUT_KEYS = ("client_accuracy_mean", "personalized_local_accuracy_mean")


def no_holdout_reason(cfg: Config, ctc: bool, holds_clients: bool, any_holdout: bool) -> str:
    """Why a client (every client, when not `any_holdout`) has no held-out score, with the setting
    that gives it one."""
    holdout = cfg.data.local_holdout
    if ctc:
        return "a CTC task has no clip accuracy"
    if not holds_clients:
        return "this server holds no client's clips (the devices do)"
    if holdout == 0:
        return "data.local_holdout=0 holds back no clip; set it in (0, 1), e.g. 0.2"
    fewest = math.ceil(1 / holdout - 1e-9)  # floor(holdout * clips) = 0 below this many clips
    if any_holdout:
        return (
            f"fewer than {fewest} clips: a client keeps floor(data.local_holdout={holdout:g} x its "
            "clips) for held-out scoring"
        )
    return (
        f"no client holds back a clip: each keeps floor(data.local_holdout={holdout:g} x its "
        f"clips), none below {fewest} clips; give clients more clips (fewer "
        f"data.num_clients where clips are dealt) or raise data.local_holdout"
    )


def unavailable(results: dict[str, Any], cfg: Config) -> dict[str, str]:
    """Why each of HELD_OUT_KEYS that is NaN has no value, with the setting that gives it one."""
    final, why = results["final"], {}
    for key in (
        k for k in HELD_OUT_KEYS if isinstance(final.get(k), float) and math.isnan(final[k])
    ):
        # NaN only when no client holds back a clip
        why[key] = no_holdout_reason(
            cfg, "wer" in final, results.get("clients") != 0, any_holdout=False
        )
    return why


def per_client_legend(per_client: dict[str, Any]) -> str:
    """results.json's legend of `per_client`: how its spreads were computed, with the counts."""
    text = (
        "spreads of each per-client score on the clients' held-out clips (the selected shared "
        "model; own_*: the last own models): mean, n_k-weighted mean and std over every scored "
        f"client ({per_client['evaluated']} scored, {per_client['without_holdout']} without "
        "held-out clips)"
    )
    if "min_client_clips" not in per_client:
        return text + "; p10 / p50 / p90 and worst10_mean (the lowest 10 %'s mean) over them too"
    return text + (
        "; p10 / p50 / p90 and worst10_mean (the lowest 10 %'s mean) over the clients holding at "
        f"least eval.min_client_clips={per_client['min_client_clips']} held-out clips "
        f"(ranked_clients), leaving out the {per_client['unranked']} scored clients with fewer"
    )


def write_results(run_dir: Path, results: dict[str, Any], cfg: Config) -> None:
    """results.json, with the code that made it (version.py); `results` gains that `code_version`
    too, so what the caller keeps of the run (compare's summary.json) says the same as the file. A
    held-out metric that is NaN (null in the file) gets its reason under `unavailable` (shown by
    `final_table`)."""
    results["code_version"] = code_version()
    trackers = read_back(cfg, run_dir)  # log.tensorboard, log.mlflow
    if trackers:
        results["trackers"] = trackers
    why = unavailable(results, cfg)
    if why:
        results["unavailable"] = why
    legend = {k: v for k, v in FINAL_KEYS.items() if k in results.get("final", {})}
    if "per_client" in results:
        legend["per_client"] = per_client_legend(results["per_client"])
    if "system" in results:
        legend["system"] = SYSTEM_LEGEND
    legend["wall_seconds"] = WALL_SCOPE
    _atomic_write(
        Path(run_dir) / "results.json",
        json.dumps(json_safe({**results, "legend": legend}), indent=2),
    )
    title = f"{cfg.algorithm} on {cfg.dataset} (seed {cfg.seed})"
    plot_curves(run_dir, results["history"], title)
    rows = read_client_rows(run_dir)
    per_client = results.get("per_client", {})
    plot_clients(
        run_dir,
        rows,
        title,
        per_client.get("without_holdout_reason"),
        per_client.get("min_client_clips", 1),
    )
    if "confusion" in results:
        plot_confusion(
            run_dir,
            results["confusion"]["counts"],
            results["confusion"]["classes"],
            f"{title}\nshared model (round {results['final'].get('selected_round')}) on the test "
            "split",
        )
    track(run_dir, cfg, results, rows)  # log.tensorboard, log.mlflow


PRUNING_LOG = "lpa.jsonl"


def log_pruning(
    run_dir: Path, round_idx: int, layers: dict, clients: list[str], sizes: list[int]
) -> None:
    """Append one round of LPA decisions to lpa.jsonl: the cohort with its n_k and, per layer, the
    clients pruned (not in the trusted set)."""
    pruned = {
        layer: [c for k, c in enumerate(clients) if k not in trusted]
        for layer, trusted in ((layer, set(p.trusted)) for layer, p in layers.items())
    }
    row = {"round": round_idx, "n_k": dict(zip(clients, sizes)), "pruned": pruned}
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(run_dir) / PRUNING_LOG, "a") as handle:
        handle.write(json.dumps(row) + "\n")


def truncate_pruning_log(run_dir: Path, last_round: int) -> None:
    """On resume, drop the rounds after the checkpoint (they are trained again)."""
    path = Path(run_dir) / PRUNING_LOG
    if path.is_file():
        rows = [line for line in path.read_text().splitlines() if line.strip()]
        kept = [line for line in rows if json.loads(line)["round"] <= last_round]
        _atomic_write(path, "".join(line + "\n" for line in kept))


def format_table(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


#: Final keys of the speech tasks beyond classification (models/ssl.py), shown when present.
SPEECH_ROWS = (
    ("wer", "shared model: test WER"),
    ("cer", "shared model: test CER"),
    ("test_other_wer", "shared model: test-other WER"),
    ("test_other_cer", "shared model: test-other CER"),
    ("asv_eer", "shared model: verification EER"),
)


def _spread(results: dict[str, Any], key: str) -> str:
    """'mean ± std' of a per-client metric, or 'n/a (why)' when it is NaN (`unavailable`)."""
    final = results["final"]
    mean, std = final[key], final[key.replace("_mean", "_std")]
    if mean is None or math.isnan(mean):
        why = results.get("unavailable", {}).get(
            key, "no client holds back a clip (data.local_holdout)"
        )
        return f"n/a ({why})"
    return f"{mean:.4f} ± {std:.4f}"


def ranked_of(results: dict[str, Any], spread: dict[str, Any]) -> str:
    """Which clients a spread's percentiles rank: all of them, or those with enough held-out
    clips."""
    fewest = results.get("per_client", {}).get("min_client_clips", 1)
    ranked = spread.get("ranked_clients", spread["clients"])
    if fewest <= 1 or ranked == spread["clients"]:
        return f"{spread['clients']} clients"
    return f"{ranked} of {spread['clients']} clients: those with >= {fewest} held-out clips"


def _percentile_row(results: dict[str, Any], key: str, who: str) -> list[tuple[str, str]]:
    """The clients' held-out accuracy spread beyond mean ± std (results.json's per_client), when
    scored."""
    spread = results.get("per_client", {}).get("spreads", {}).get(key)
    if spread and spread["clients"] and spread.get("ranked_clients", 1) == 0:
        fewest = results["per_client"]["min_client_clips"]
        return [(f"{who}: clients' p10 / median / worst 10 %", f"n/a ({too_few_clips(fewest)})")]
    if not spread or spread["p50"] is None or math.isnan(spread["p50"]):
        return []
    return [
        (
            f"{who}: clients' p10 / median / worst 10 %",
            f"{spread['p10']:.4f} / {spread['p50']:.4f} / {spread['worst10_mean']:.4f} "
            f"({ranked_of(results, spread)})",
        )
    ]


def final_table(results: dict[str, Any]) -> str:
    final = results["final"]
    rows = [("algorithm", results["algorithm"]), ("dataset", results["dataset"])]
    if final["has_global_model"]:
        rows += [(label, f"{final[key]:.4f}") for key, label in SPEECH_ROWS if key in final]
    if final["has_global_model"] and "accuracy" in final:
        rows += [
            ("shared model: test accuracy", f"{final['accuracy']:.4f}"),
            ("shared model: test macro-F1", f"{final['macro_f1']:.4f}"),
            ("shared model: test UAR", f"{final['uar']:.4f}"),
        ]
    if final["has_global_model"]:
        rows += [
            ("selected round (val)", str(final["selected_round"])),
            ("shared model: client held-out acc.", _spread(results, "client_accuracy_mean")),
        ]
        rows += _percentile_row(results, "accuracy", "shared model")
    rows.append(("rounds", str(results["rounds"])))
    if "clients_trained" in final:
        rows.append(
            (
                "clients trained (mean visits)",
                f"{final['clients_trained']} ({final['visits_per_trained_client']:.1f})",
            )
        )
    if "personalized_accuracy_mean" in final:
        n = final["personalized_clients"]
        rows.append(
            (
                f"own models ({n}): test acc.",
                f"{final['personalized_accuracy_mean']:.4f} ± "
                f"{final['personalized_accuracy_std']:.4f}",
            )
        )
        rows.append(
            (
                f"own models ({n}): held-out acc.",
                _spread(results, "personalized_local_accuracy_mean"),
            )
        )
        rows += _percentile_row(results, "own_accuracy", f"own models ({n})")
    rows += system_rows(results)
    rows.append((WALL_LABEL, f"{results['wall_seconds']:.1f} s"))
    rows += [(f"{TRACKER_NAMES[k]} (read back)", v) for k, v in results.get("trackers", {}).items()]
    return format_table(rows)


def compression_note(compression: Any) -> str:
    """What the run's first line says of compressed uploads: `; uploads compressed: topk (ratio
    0.1), error feedback` ('' without compression). `compression`: the run's rules/compression.py
    `Compressor` when on, else None."""
    if compression is None:
        return ""
    c = compression.cfg
    reads = ", ".join(f"{key} {getattr(c, key)}" for key in codec_spec(c.method).reads)
    size = f" ({reads})" if reads else ""
    feedback = ", error feedback" if compression.feedback else ""
    both = ", the broadcast too" if compression.download else ""
    return f"; uploads compressed: {c.method}{size}{feedback}{both}"


#: results.json's legend of `system` (a run on the virtual clock, engine/clock/ `summary`).
SYSTEM_LEGEND = (
    "the virtual clock (system.*): virtual_time_s, the simulated seconds when the last round "
    "ended; time_to_target_s, the virtual time at which validation accuracy first reached "
    "target_accuracy (null: not reached, or no target); clients_never_contributed and "
    "never_contributed_fraction, the clients none of whose updates ever arrived; "
    "training_flops_per_sample, the compute the clock charges per training sample"
)


def system_rows(results: dict[str, Any]) -> list[tuple[str, str]]:
    """The closing table's rows of a run on the virtual clock (results.json's `system`)."""
    system = results.get("system")
    if not system:
        return []
    rows = [("virtual time", f"{system['virtual_time_s']:.1f} s ({system['mode']})")]
    target = system.get("target_accuracy")
    if target is not None:
        reached = system.get("time_to_target_s")
        rows.append(
            (
                f"virtual time to val accuracy {target:.2f}",
                "not reached" if reached is None else f"{reached:.1f} s",
            )
        )
    silent, share = system["clients_never_contributed"], system["never_contributed_fraction"]
    total = results.get("clients")
    rows.append(
        (
            "clients never heard from",
            f"{silent}" + (f" of {total}" if total else "") + f" ({share:.1%})",
        )
    )
    return rows


TRACKER_NAMES = {"tensorboard": "TensorBoard", "mlflow": "MLflow"}


CLIENTS_CSV = "clients.csv"


def ranked(row: dict[str, Any], min_clips: int) -> bool:
    """Whether a clients.csv row counts in the percentiles and the worst-10 % mean: it holds at
    least `min_clips` held-out clips (eval.min_client_clips), or its scores come with no count (a
    streaming user's)."""
    return bool(row.get("holdout", min_clips) >= min_clips)


def too_few_clips(min_clips: int) -> str:
    return (
        f"no client holds eval.min_client_clips={min_clips} held-out clips; lower it, or raise "
        "data.local_holdout"
    )


def append_client_rows(run_dir: Path, columns: list[str], rows: list[dict[str, Any]]) -> None:
    """Append one evaluation's per-client rows to clients.csv (its header written with the first
    rows). A cell left empty is a score the client has not got: an own model not trained yet."""
    path = Path(run_dir) / CLIENTS_CSV
    new, ending = not path.is_file(), "\n"
    if not new:  # the header the file began with, and its line ending: a resumed run appends alike
        with open(path, newline="") as handle:
            header = handle.readline()
        columns = next(csv.reader([header]), columns)
        ending = "\r\n" if header.endswith("\r\n") else "\n"
    with open(path, "a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, restval="", lineterminator=ending)
        if new:
            writer.writeheader()
        writer.writerows(rows)


def read_client_rows(run_dir: Path) -> list[dict[str, Any]]:
    """clients.csv's rows with numbers as numbers (an empty cell left out of its row)."""
    path = Path(run_dir) / CLIENTS_CSV
    if not path.is_file():
        return []
    with open(path, newline="") as handle:
        return [
            {k: (v if k == "client" else float(v)) for k, v in row.items() if v != ""}
            for row in csv.DictReader(handle)
        ]


def truncate_client_rows(run_dir: Path, last_round: int) -> None:
    """On resume, drop clients.csv's rows after the checkpoint (those rounds are evaluated
    again)."""
    path = Path(run_dir) / CLIENTS_CSV
    if path.is_file():
        # bytes in, bytes out: the kept rows keep their line endings
        lines = path.read_bytes().splitlines(keepends=True)
        kept = lines[:1] + [line for line in lines[1:] if int(line.split(b",", 1)[0]) <= last_round]
        _atomic_write(path, b"".join(kept))


def pyplot():
    """matplotlib's pyplot on the Agg backend (files only, no display)."""
    import matplotlib  # lazy: start-up time

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_confusion(run_dir: Path, counts: list[list[int]], classes: list[str], title: str) -> None:
    """confusion.png: the shared model's test-split confusion matrix, each row (true class) as
    shares of its clips, class names on both axes."""
    import numpy as np

    plt = pyplot()
    matrix = np.asarray(counts, dtype=float)
    shares = matrix / np.maximum(matrix.sum(1, keepdims=True), 1)
    size = min(4 + 0.25 * len(classes), 11)
    fig, ax = plt.subplots(figsize=(size + 1.5, size))
    image = ax.imshow(shares, cmap="Blues", vmin=0, vmax=1)
    ticks = range(len(classes))
    font = 8 if len(classes) <= 20 else 6
    ax.set_xticks(ticks, classes, rotation=90, fontsize=font)
    ax.set_yticks(ticks, classes, fontsize=font)
    ax.set_xlabel("predicted class"), ax.set_ylabel("true class")
    fig.colorbar(image, ax=ax, label="share of the true class's test clips")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(Path(run_dir) / "confusion.png", dpi=100)
    plt.close(fig)


#: clients.png's panels: a clients.csv column and what it scores, each drawn when the run has it.
CLIENT_PANELS = (
    ("accuracy", "shared model"),
    ("own_accuracy", "each client's own model"),
    ("global_acc", "shared score table, each user's labels"),
    ("local_acc", "each user's own model"),
)


def plot_clients(
    run_dir: Path,
    rows: list[dict[str, Any]],
    title: str,
    why_empty: str | None = None,
    min_clips: int = 1,
) -> None:
    """clients.png from clients.csv's rows: per evaluated round, the held-out accuracy of the
    clients with at least `min_clips` held-out clips (eval.min_client_clips) as percentile bands
    (10-90 and 25-75) around the median, with the worst-10 % mean dashed; the shared model, and next
    to it the clients' own models where the method keeps them. Without any client score the
    picture says why (`why_empty`)."""
    import numpy as np

    from fedac.training.metrics import spread

    if rows and not any(ranked(r, min_clips) for r in rows):
        why_empty = too_few_clips(min_clips)
    rows = [r for r in rows if ranked(r, min_clips)]
    panels = [(key, label) for key, label in CLIENT_PANELS if any(key in r for r in rows)]
    plt = pyplot()
    if not panels:
        fig, ax = plt.subplots(figsize=(7, 2.5))
        ax.axis("off")
        text = why_empty or "this run scores no client on held-out data"
        ax.text(
            0.5,
            0.5,
            "No per-client scores:\n" + "\n".join(textwrap.wrap(text, 70)),
            ha="center",
            va="center",
        )
        ax.set_title(title)
        fig.savefig(Path(run_dir) / "clients.png", dpi=100)
        plt.close(fig)
        return
    fig, axes = plt.subplots(
        1, len(panels), figsize=(5.5 * len(panels), 4), sharey=True, squeeze=False
    )
    for ax, (key, label) in zip(axes[0], panels):
        rounds = sorted({r["round"] for r in rows if key in r})
        values = [
            np.asarray([r[key] for r in rows if r["round"] == t and key in r]) for t in rounds
        ]
        p10, p25, p50, p75, p90 = np.stack(
            [np.percentile(v, [10, 25, 50, 75, 90]) for v in values]
        ).T
        ax.fill_between(rounds, p10, p90, alpha=0.2, color="tab:blue", label="10th-90th percentile")
        ax.fill_between(
            rounds, p25, p75, alpha=0.35, color="tab:blue", label="25th-75th percentile"
        )
        ax.plot(rounds, p50, marker="o", color="tab:blue", label="median")
        ax.plot(
            rounds,
            [spread(v)["worst10_mean"] for v in values],
            ls="--",
            color="tab:red",
            label="worst 10 % mean",
        )
        fewest = f", >= {min_clips} held-out clips" if min_clips > 1 else ""
        ax.set_title(f"{label} ({len(values[-1])} clients{fewest})")
        ax.set_xlabel("round"), ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("accuracy per client")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(Path(run_dir) / "clients.png", dpi=100)
    plt.close(fig)
