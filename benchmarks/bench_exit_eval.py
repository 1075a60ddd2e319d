"""Evaluation of every exit of an early-exit model: one encoder pass per batch against one per exit.

An early-exit run evaluates the shared model at `earlyexit.eval_exit` and at every exit, each
validation round and on every test split at the end. Before, that took one `evaluate` per view (the
headline exit, then each exit: 9 + 3 + 6 + 9 + 12 = 39 layer passes per batch on a 12-layer encoder
at eval_exit 9); `evaluate_exits` (training/evaluate.py) scores all exits on one pass (12 layers).

Workload: `w2v2_s` (12 layers) with a frozen CNN (cached frames, as the runs use), exits 3/6/9/12,
on a split of `--clips` utterances of `--seconds` s, eval batch 512, one torch thread, for a
classification head (pooled, as KWS / SID) and a CTC head (BiLSTM, as ASR). Both paths run in
alternating blocks in one process; each path's metrics are checked equal. Writes
benchmarks/results/exit_eval.json.

    .venv/bin/python benchmarks/bench_exit_eval.py [--clips 256] [--seconds 2] [--blocks 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch


def workload(kind: str, clips: int, seconds: float):
    from fedac.data.waveform import Padded
    from fedac.engine.data import EvalSplit
    from fedac.models.early_exit import MultiExitSSL
    from fedac.models.ssl import build_encoder

    torch.manual_seed(0)
    backbone = build_encoder("w2v2_s", None)
    model = MultiExitSSL(backbone, kind, 29 if kind == "ctc" else 12, [3, 6, 9, 12])
    frames = int(49 * seconds)
    lengths = torch.randint(frames // 2, frames + 1, (clips,))
    x = Padded(torch.randn(clips, frames, backbone.config.conv_dim[-1]), lengths)
    texts = ["a b" * (i % 5 + 1) for i in range(clips)] if kind == "ctc" else None
    return model, EvalSplit(
        x, torch.arange(clips), torch.randint(0, 12, (clips,)), kind, texts=texts
    )


def main() -> None:
    from fedac.training.evaluate import evaluate, evaluate_exits

    parser = argparse.ArgumentParser()
    parser.add_argument("--clips", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--eval-exit", type=int, default=9)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "exit_eval.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = {
        "host": platform.node(),
        "load_avg_start": list(os.getloadavg()),
        "args": vars(args),
        "cases": {},
    }
    for kind in ("classification", "ctc"):
        model, split = workload(kind, args.clips, args.seconds)

        def per_view():  # what the runs did before: the headline exit, then each exit alone
            headline = evaluate(model.use_exit(args.eval_exit), split)
            return headline, {d: evaluate(model.use_exit(d), split) for d in model.exits}

        def shared():
            by_exit = evaluate_exits(model, split)
            return by_exit[args.eval_exit], by_exit

        times = {"per_view": [], "shared": []}
        results = {}
        for block in range(args.blocks):
            for name, path in (("per_view", per_view), ("shared", shared))[
                :: 1 if block % 2 == 0 else -1
            ]:
                start = time.perf_counter()
                results[name] = path()
                times[name].append(time.perf_counter() - start)
        assert results["per_view"] == results["shared"], "the two paths' metrics differ"
        medians = {name: statistics.median(t) for name, t in times.items()}
        out["cases"][kind] = {
            "seconds": times,
            "median_seconds": medians,
            "shared_over_per_view": medians["shared"] / medians["per_view"],
        }
        print(
            kind,
            {k: round(v, 2) for k, v in medians.items()},
            f"ratio {medians['shared'] / medians['per_view']:.3f}",
        )
    out["load_avg_end"] = list(os.getloadavg())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
