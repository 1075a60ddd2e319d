"""Stacked (training/functional.py's vmapped path) against sequential client updates for FedKWS-UI's
four KWS networks and one zero-shot CNN, under FedKWS-UI's local protocol (issue 56). One command,
writes JSON to benchmarks/results/stacked_models.json:

    .venv/bin/python benchmarks/bench_stacked_models.py            # 16 clients, E = 5, 3 repeats
    .venv/bin/python benchmarks/bench_stacked_models.py --quick    # 4 clients, E = 2, 1 repeat (a smoke run)

Protocol: FedKWS-UI's client update (private phase, ALT global steps, ALO loss), batch 32, clipping at
50, SGD (lr 0.1, momentum 0.9) for DSCNN, MHAttRNN, ResNet15 and cnn3_relu, AdamW (lr 1e-3) for KWT;
random 40 x 101 features, 64 samples per client; one torch thread. For each model the two paths run
side by side in one process, interleaved, `--repeats` times each (the first call of each warms up and
is dropped); reported are the median wall and process-CPU seconds per round and the ratio
stacked / sequential (below 1: stacked is faster). CPU seconds are the number to read on a shared
machine. Both paths train the same clients from the same payload, and the script checks that their
uploads agree (max abs difference reported).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from fedac.algorithms import build_algorithm
from fedac.algorithms.base import ClientData, Task
from fedac.config import load_config
from fedac.engine.cohort import run_clients

MODELS = {"dscnn": [], "mhattrnn": [], "resnet15": [], "kwt": ["train.optimizer=adamw", "train.lr=0.001"],
          "cnn3_relu": []}
FEATURES, FRAMES, CLASSES, SAMPLES = 40, 101, 12, 64


def clients(count: int) -> list[ClientData]:
    g = torch.Generator().manual_seed(0)
    return [ClientData(f"c{i}", torch.randn(SAMPLES, FEATURES, FRAMES, generator=g),
                       torch.randint(0, CLASSES, (SAMPLES,), generator=g), torch.zeros(0, FEATURES, FRAMES),
                       torch.zeros(0, dtype=torch.long)) for i in range(count)]


def algorithm(model: str, execution: str, steps: int, datas: list[ClientData]):
    counts = [torch.bincount(d.y, minlength=CLASSES).tolist() for d in datas]
    cfg = load_config(overrides=["algorithm=fedkwsui", f"model.name={model}", "train.batch_size=32", "train.device=cpu",
                                 "train.max_grad_norm=50", "train.lr=0.1", "train.momentum=0.9", "train.cohort_workers=1",
                                 f"fedkwsui.local_steps={steps}", f"train.execution={execution}", *MODELS[model]])
    return build_algorithm(cfg, Task(FEATURES, CLASSES, [d.name for d in datas], counts))


def timed(algo, datas):
    payload = algo.broadcast(algo.init_server())
    states = [algo.init_client_state(d.name) for d in datas]
    wall, cpu = time.perf_counter(), time.process_time()
    results = run_clients(algo, payload, states, datas, 1, 0)
    return time.perf_counter() - wall, time.process_time() - cpu, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5, help="FedKWS-UI's E (fedkwsui.local_steps)")
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "stacked_models.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    count, steps, repeats = (4, 2, 1) if args.quick else (args.clients, args.steps, args.repeats)
    datas = clients(count)
    report = {"clients": count, "global_steps": steps, "batch_size": 32, "threads": 1, "models": {}}
    for model in args.models:
        paths = {"stacked": algorithm(model, "cohort", steps, datas), "sequential": algorithm(model, "sequential", steps, datas)}
        times = {name: [] for name in paths}
        last = {}
        for r in range(repeats + 1):
            for name, algo in paths.items():
                wall, cpu, last[name] = timed(algo, datas)
                if r:  # the first call warms up (shape records, allocations)
                    times[name].append((wall, cpu))
        row = {name: {"wall_s": statistics.median(t[0] for t in ts), "cpu_s": statistics.median(t[1] for t in ts)}
               for name, ts in times.items()}
        row["ratio_wall"] = row["stacked"]["wall_s"] / row["sequential"]["wall_s"]
        row["ratio_cpu"] = row["stacked"]["cpu_s"] / row["sequential"]["cpu_s"]
        row["max_abs_diff"] = max(float((a.upload[n].float() - b.upload[n].float()).abs().max())
                                  for a, b in zip(last["stacked"], last["sequential"]) for n in a.upload)
        report["models"][model] = row
        print(f"{model:10s} stacked {row['stacked']['cpu_s']:.2f} s cpu, sequential {row['sequential']['cpu_s']:.2f} s cpu: "
              f"ratio {row['ratio_cpu']:.2f} (wall {row['ratio_wall']:.2f}); max |diff| {row['max_abs_diff']:.1e}", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
