"""`fedac memory`: measured training memory and step time of early-exit fine-tuning per exit depth
(algorithms/earlyexit.py `depth_memory`), written as memory.json, memory.md, memory.csv and
memory.png.

The early-exit paper reports memory growing by about 27 MB per layer of wav2vec 2.0 Base, which
equals the fp32 weights of one Base layer (7,087,872 parameters); both readings are reported: the
measured training memory per layer (`train_mb_per_layer`) and the fp32 weights per layer
(`weights_mb_per_layer`).
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from fedac.config import ModelConfig, TrainConfig
from fedac.models.ssl_sizes import SIZES

FRAMES_PER_SECOND = 49  # the wav2vec 2.0 CNN's frame rate at 16 kHz


def measure(
    model_name: str,
    encoder_path: str | None,
    kind: str,
    classes: int,
    exits: list[int],
    batch: int,
    seconds: float,
    optimizer: str,
    steps: int,
    progress: bool = True,
) -> dict:
    # lazy: start-up time (torch and the encoders load only when `fedac memory` measures, not for
    # --help)
    import torch

    # lazy: start-up time (torch; the parser feeds --help)
    from fedac.algorithms.earlyexit import depth_memory
    from fedac.models.early_exit import build_multi_exit
    from fedac.progress import bar as progress_bar

    torch.manual_seed(0)
    options = ModelConfig(name=model_name, encoder_path=encoder_path)
    model = build_multi_exit(model_name, kind, classes, exits, options, 0.0)
    train = TrainConfig(optimizer=optimizer, lr=1e-4)
    frames = max(1, round(seconds * FRAMES_PER_SECOND))
    rows = [
        depth_memory(model, depth, train, batch, frames, steps)
        for depth in progress_bar(model.exits, desc="depths", unit="depth", disable=not progress)
    ]
    span = rows[-1]["depth"] - rows[0]["depth"]
    per_layer = {
        key: (rows[-1][key] - rows[0][key]) / span if span else float("nan")
        for key in ("train_mb", "weights_mb", "step_seconds")
    }
    return {
        "model": model_name,
        "encoder_path": encoder_path,
        "kind": kind,
        "batch": batch,
        "seconds": seconds,
        "optimizer": optimizer,
        "device": "cpu",
        "layers": len(model.encoder.layers),
        "rows": rows,
        "train_mb_per_layer": per_layer["train_mb"],
        "weights_mb_per_layer": per_layer["weights_mb"],
        "step_seconds_per_layer": per_layer["step_seconds"],
    }


def write(result: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    (out / "memory.json").write_text(json.dumps(result, indent=2))
    rows = result["rows"]
    with open(out / "memory.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    lines = [
        f"# Memory per exit depth: {result['model']}",
        "",
        f"`{result.get('command', '')}`",
        "",
        "| Depth | Weights (MB) | Training (MB) | Step (s) |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {int(r['depth'])} | {r['weights_mb']:.2f} | {r['train_mb']:.2f} | "
        f"{r['step_seconds']:.3f} |"
        for r in rows
    ]
    lines += [
        "",
        f"Per layer: training {result['train_mb_per_layer']:.2f} MB, fp32 weights "
        f"{result['weights_mb_per_layer']:.2f} MB.",
    ]
    (out / "memory.md").write_text("\n".join(lines) + "\n")
    depths = [r["depth"] for r in rows]
    fig, (ax_mem, ax_time) = plt.subplots(1, 2, figsize=(10, 4))
    for key, label in (("train_mb", "training"), ("weights_mb", "weights")):
        ax_mem.plot(depths, [r[key] for r in rows], marker="o", label=label)
    (
        ax_mem.set_xlabel("exit depth (layers)"),
        ax_mem.set_ylabel("MB"),
        ax_mem.legend(),
        ax_mem.grid(alpha=0.3),
    )
    ax_time.plot(depths, [r["step_seconds"] for r in rows], marker="o", color="tab:red")
    (
        ax_time.set_xlabel("exit depth (layers)"),
        ax_time.set_ylabel("seconds per step"),
        ax_time.grid(alpha=0.3),
    )
    fig.suptitle(
        f"{result['model']}: batch {result['batch']} x {result['seconds']} s, {result['optimizer']}"
    )
    fig.tight_layout()
    fig.savefig(out / "memory.png", dpi=100)
    plt.close(fig)


def cmd_memory(args: argparse.Namespace) -> int:
    exits = [int(e) for e in args.exits.split(",") if e.strip()]
    result = measure(
        args.model,
        args.encoder_path,
        args.task,
        args.classes,
        exits,
        args.batch,
        args.seconds,
        args.optimizer,
        args.steps,
        not args.quiet,
    )
    result["command"] = "fedac " + " ".join(args.argv)
    out = Path(args.out)
    write(result, out)
    print((out / "memory.md").read_text())
    print(f"wrote {out / 'memory.json'}, memory.md, memory.csv, memory.png")
    return 0


def add_memory_parser(sub) -> None:
    p = sub.add_parser(
        "memory", help="training memory and step time of early-exit fine-tuning per exit depth"
    )
    p.add_argument(
        "--model",
        default="w2v2_s",
        help=f"named size ({', '.join(SIZES)}); with --encoder-path, the checkpoint sets the size",
    )
    p.add_argument(
        "--encoder-path", help="local Hugging Face wav2vec 2.0 / HuBERT checkpoint folder"
    )
    p.add_argument("--task", choices=("classification", "ctc"), default="classification")
    p.add_argument("--classes", type=int, default=12, help="classes of a classification head")
    p.add_argument("--exits", default="3,6,9,12", help="exit depths on the 12-layer scale")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seconds", type=float, default=1.0, help="clip length")
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    p.add_argument("--steps", type=int, default=3, help="timed steps per depth (median reported)")
    p.add_argument(
        "--out", required=True, help="folder for memory.json, memory.md, memory.csv, memory.png"
    )
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_memory)
