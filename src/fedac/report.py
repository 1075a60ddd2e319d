"""Run-directory outputs: metrics.csv (one row per evaluated round), results.json, curves.png, and
the final table printed by the CLI."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path
from typing import Any

from fedac.config import Config


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _clean(value: Any) -> Any:
    """JSON has no NaN: write null instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def write_history(run_dir: Path, history: list[dict[str, float]]) -> None:
    columns: list[str] = []
    for row in history:
        columns += [key for key in row if key not in columns]
    path = Path(run_dir) / "metrics.csv"
    tmp = path.with_name(f".metrics.csv.tmp{os.getpid()}")
    with open(tmp, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for row in history:
            writer.writerow({k: (int(v) if k == "round" else v) for k, v in row.items()})
    os.replace(tmp, path)


def plot_curves(run_dir: Path, history: list[dict[str, float]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = [row["round"] for row in history]
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(10, 4))
    for key, label in (("val_accuracy", "val accuracy"), ("val_macro_f1", "val macro-F1")):
        ax_acc.plot(rounds, [row.get(key, math.nan) for row in history], marker="o", label=label)
    ax_acc.set_xlabel("round"), ax_acc.set_ylabel("score"), ax_acc.legend(), ax_acc.grid(alpha=0.3)
    ax_loss.plot(rounds, [row.get("train_loss", math.nan) for row in history], marker="o", color="tab:red")
    ax_loss.set_xlabel("round"), ax_loss.set_ylabel("mean client training loss"), ax_loss.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(Path(run_dir) / "curves.png", dpi=100)
    plt.close(fig)


def write_results(run_dir: Path, results: dict[str, Any], cfg: Config) -> None:
    _atomic_write(Path(run_dir) / "results.json", json.dumps(_clean(results), indent=2))
    plot_curves(run_dir, results["history"], f"{cfg.algorithm} on {cfg.dataset} (seed {cfg.seed})")


def format_table(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def final_table(results: dict[str, Any]) -> str:
    final = results["final"]
    rows = [("algorithm", results["algorithm"]), ("dataset", results["dataset"])]
    if final["has_global_model"]:
        rows += [
            ("test accuracy", f"{final['accuracy']:.4f}"),
            ("test macro-F1", f"{final['macro_f1']:.4f}"),
            ("test UAR", f"{final['uar']:.4f}"),
            ("selected round (val)", str(final["selected_round"])),
            ("client acc. mean ± std", f"{final['client_accuracy_mean']:.4f} ± {final['client_accuracy_std']:.4f}"),
        ]
    rows.append(("rounds", str(results["rounds"])))
    if "personalized_accuracy_mean" in final:
        rows.append(("personalized test acc.", f"{final['personalized_accuracy_mean']:.4f} ± {final['personalized_accuracy_std']:.4f}"))
        rows.append(("personalized local acc.", f"{final['personalized_local_accuracy_mean']:.4f}"))
    rows.append(("wall time", f"{results['wall_seconds']:.1f} s"))
    return format_table(rows)
