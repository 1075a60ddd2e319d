"""Peak RSS and step time of one SSL training step by encoder size and depth (issue 16).

Each (size, depth, CNN) case runs in a fresh process: build the model (models/ssl.py), take
`--steps` AdamW steps on a batch of 8 x 1 s (frozen CNN: its cached frames, 49 x C; trained CNN:
waveforms) with the statistics-pooling classifier, and report the process's peak RSS (ru_maxrss) and
the median step time. One torch thread. Writes benchmarks/results/ssl_memory.json.

    .venv/bin/python benchmarks/bench_ssl.py [--sizes w2v2_s] [--depths 12 3] [--steps 5]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


def one_case(size: str, depth: int, freeze_cnn: bool, steps: int) -> dict:
    import torch

    from fedac.config import ModelConfig
    from fedac.data.waveform import Padded
    from fedac.models import build_model

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model(
        size,
        0,
        35,
        0.1,
        "classification",
        ModelConfig(name=size, freeze_cnn=freeze_cnn, encoder_depth=depth),
    )
    conv = model.config.conv_dim[-1]
    x = (
        Padded(torch.randn(8, 16000), torch.full((8,), 16000))
        if not freeze_cnn
        else Padded(torch.randn(8, 49, conv), torch.full((8,), 49))
    )
    y = torch.randint(0, 35, (8,))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = model.task_loss(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
    return {
        "size": size,
        "depth": depth,
        "freeze_cnn": freeze_cnn,
        "steps": steps,
        "parameters": sum(p.numel() for p in model.parameters()),
        "median_step_seconds": statistics.median(times[1:] or times),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", nargs="+", default=["w2v2_s"])
    parser.add_argument("--depths", nargs="+", type=int, default=[12, 3])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--case", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        size, depth, freeze = args.case
        print(json.dumps(one_case(size, int(depth), freeze == "1", args.steps)))
        return
    rows = []
    for size in args.sizes:
        for depth in args.depths:
            for freeze in ("1", "0"):
                out = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--steps",
                        str(args.steps),
                        "--case",
                        size,
                        str(depth),
                        freeze,
                    ],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
                rows.append(json.loads(out.strip().splitlines()[-1]))
                print(rows[-1])
    path = Path(__file__).parent / "results" / "ssl_memory.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "command": "python benchmarks/bench_ssl.py " + " ".join(sys.argv[1:]),
                "machine": platform.processor() or platform.machine(),
                "cases": rows,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
