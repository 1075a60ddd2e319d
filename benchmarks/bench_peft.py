"""What parameter-efficient fine-tuning (`model.peft`) costs or saves per local step on the CPU.

Workload: the shipped `w2v2_s` (12 layers) as the early-exit runs train it: a frozen CNN (cached
frames), the classification head at exit `--depth` (12 classes), AdamW, a batch of `--batch` clips
of `--seconds` s, one torch thread. Variants: full fine-tuning (model.peft=none), LoRA at each of
`--ranks` (alpha = 2 r, the default ratio, on q_proj and v_proj), and IA3. Each local step is
`algorithms.earlyexit.depth_memory`'s (forward, backward and the optimizer step, the memory
`fedac memory` reports); the variants run in alternating blocks in one process, and the median step
of each is compared with full fine-tuning's. Also per variant: the trainable parameters and the
bytes a client at that depth uploads (its trained tensors, fp32). Writes
benchmarks/results/peft.json.

    .venv/bin/python benchmarks/bench_peft.py [--ranks 4 16] [--depth 12] [--blocks 3] [--steps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from pathlib import Path

import torch


def variants(ranks: list[int]) -> dict[str, list[str]]:
    """Name -> the `--set` overrides of each fine-tuning choice."""
    out = {"full": ["model.peft=none"]}
    for r in ranks:
        out[f"lora_r{r}"] = ["model.peft=lora", f"model.peft_rank={r}", f"model.peft_alpha={2 * r}"]
    out["ia3"] = ["model.peft=ia3"]
    return out


def build(overrides: list[str], depth: int):
    """The early-exit model of `overrides` with its upload at `depth`: (model, trainable
    parameters, upload bytes)."""
    from fedac.algorithms.earlyexit import EarlyExitFL
    from fedac.config import load_config
    from fedac.models.early_exit import build_multi_exit
    from fedac.training.device import nbytes

    cfg = load_config(overrides=["model.name=w2v2_s", "model.head_norm=true", *overrides])
    torch.manual_seed(0)
    model = build_multi_exit("w2v2_s", "classification", 12, [3, 6, 9, 12], cfg.model, 0.0)
    upload = {k: v for k, v in model.state_dict().items() if EarlyExitFL.trained(k, depth)}
    trainable = sum(
        p.numel()
        for name, p in model.named_parameters()
        if name not in model.frozen and EarlyExitFL.trained(name, depth)
    )
    return model, trainable, nbytes(upload)


def main() -> None:
    from fedac.algorithms.earlyexit import depth_memory
    from fedac.config import TrainConfig

    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--depth", type=int, default=12)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="local steps per block")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "peft.json"))
    args = parser.parse_args()
    load_start = list(os.getloadavg())
    torch.set_num_threads(1)
    train = TrainConfig(optimizer="adamw", lr=2e-4)
    frames = max(1, round(args.seconds * 49))  # 49 CNN frames per second
    cases = {name: build(overrides, args.depth) for name, overrides in variants(args.ranks).items()}
    times: dict[str, list[float]] = {name: [] for name in cases}
    memory: dict[str, dict[str, float]] = {}
    for block in range(args.blocks):
        for name in list(cases)[:: 1 if block % 2 == 0 else -1]:
            row = depth_memory(cases[name][0], args.depth, train, args.batch, frames, args.steps)
            times[name].append(row["step_seconds"])
            memory[name] = {k: row[k] for k in ("weights_mb", "trainable_mb", "train_mb")}
    full = cases["full"]
    out = {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "load_avg_start": load_start,
        "torch": torch.__version__,
        "args": vars(args),
        "cases": {},
    }
    for name, (_, trainable, upload) in cases.items():
        median = statistics.median(times[name])
        ratio = median / statistics.median(times["full"])
        out["cases"][name] = {
            "overrides": variants(args.ranks)[name],
            "trainable_parameters": trainable,
            "upload_bytes": upload,
            "trainable_over_full": trainable / full[1],
            "upload_over_full": upload / full[2],
            "step_seconds_per_block": times[name],
            "median_step_seconds": median,
            "step_over_full": ratio,
            **memory[name],
        }
        print(
            f"{name:9s} trainable {trainable:>9,} ({trainable / full[1]:.4f})  upload "
            f"{upload:>10,} B  step {median * 1e3:7.1f} ms ({ratio:.3f}x)  "
            f"train memory {memory[name]['train_mb']:.1f} MB"
        )
    out["load_avg_end"] = list(os.getloadavg())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
