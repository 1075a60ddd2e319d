"""What the virtual clock costs: the default run's sync round with `system.*` on against the same
cohort without it, FedBuff's server update at `system.concurrency=100`, and the clock alone at the
Speech Commands stand-in's scale (2,618 clients).

    .venv/bin/python benchmarks/bench_system.py            # about 5 min on 2 busy cores
    .venv/bin/python benchmarks/bench_system.py --quick    # 2 timed rounds
    .venv/bin/python benchmarks/bench_system.py --gsc      # adds the GSC-scale rounds (~10 min)

Workload: the default run (`fedac run`: the Speech Commands stand-in, crnn_lite, 10% of the 240
clients a round, 5 local epochs, FedAvg), evaluation off, one torch thread.
- `off`: no clock; `sync`: synthetic devices, every client always online, no deadline (so the
  cohort trains the same clients' count as `off`: the ratio is the clock's own cost: its trace
  queries, its per-client times and the once-per-run FLOP count, which the warm-up round takes);
  `sync_trace`: synthetic devices and availability with a deadline and over-commitment 1.3 (the
  cohort differs: not a like-for-like time, reported for scale).
- `fedbuff`: one server update (buffer 10) with 100 clients in flight; the path it trains on (the
  results say "stacked") and how many clients each stacked call trained.
Per path: `Simulator.run_round` after one warm-up round, `--repeats` rounds interleaved round by
round in one process. `clock_2618`: `SystemClock.sync_round` alone for 2,618 clients (synthetic
devices and availability, over-commitment 1.3, K = 261), the median of 20 calls.
`gsc` (with --gsc): FedMLAC (CRNN-Base clients, CRNN-Lite Plug-in, 20 % a round: 524 clients) on
bench_cohort.py's GSC-scale federation (2,618 clients of 20-60 random windows), one warm-up and
`--gsc-rounds` timed rounds each of: no clock, synthetic devices (always online, no deadline: the
same 524 clients), and FedBuff with 524 clients in flight and a buffer of 262.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cohort import RESULTS, fedac_round, interleave, simulator, summarize  # noqa: E402
from fedac.config import load_config  # noqa: E402
from fedac.engine.clock.book import SystemBook  # noqa: E402
from fedac.engine.clock.virtual import SystemClock  # noqa: E402
from fedac.engine.data import build_federated_data  # noqa: E402
from workloads import FEDMLAC_SETTINGS, config, federated, gsc_scale_clients  # noqa: E402

QUIET = ["runtime.threads=1", "train.eval_every=1000000", "train.checkpoint_every=1000000"]
PATHS = {
    "off": [],
    "sync": ["system.devices=synthetic"],
    "sync_trace": [
        "system.devices=synthetic",
        "system.availability=synthetic",
        "system.deadline=5",
        "system.overcommit=1.3",
    ],
}
FEDBUFF = ["system.devices=synthetic", "system.mode=fedbuff", "system.concurrency=100"]
GSC_CLIENTS = 2618


def clock_at_scale(calls: int = 20) -> dict:
    """`SystemClock.sync_round` for GSC_CLIENTS clients of 30 clips each (its own cost only)."""
    cfg = load_config(
        overrides=[
            "system.devices=synthetic",
            "system.availability=synthetic",
            "system.overcommit=1.3",
            "system.deadline=30",
        ]
    )
    sizes = {f"speaker{i:04d}": 30 for i in range(GSC_CLIENTS)}
    started = time.perf_counter()
    clock = SystemClock(cfg, sizes, lambda _: "crnn_lite", lambda _: 7.0e6)
    built = time.perf_counter() - started
    book, samples = SystemBook(), []
    for round_idx in range(1, calls + 1):
        started = time.perf_counter()
        clock.sync_round(book, round_idx, GSC_CLIENTS // 10, 130_700, 130_700)
        samples.append(time.perf_counter() - started)
    return {"clients": GSC_CLIENTS, "build_s": built, "sync_round_s": statistics.median(samples)}


def gsc_scale(rounds: int, tmp: Path) -> dict:
    """FedMLAC at GSC scale with and without the clock (module docstring)."""
    data = federated(gsc_scale_clients())
    settings = [*FEDMLAC_SETTINGS, "runtime.threads=1", "runtime.execution=cohort"]
    paths = {
        "off": [],
        "sync": ["system.devices=synthetic"],
        "fedbuff": [
            "system.devices=synthetic",
            "system.mode=fedbuff",
            "system.concurrency=524",
            "system.buffer=262",
        ],
    }
    runs = {}
    for name, overrides in paths.items():
        sim, state = simulator(config(*settings, *overrides), data, tmp / f"gsc-{name}")
        runs[name] = fedac_round(sim, state)
    result = summarize(interleave(runs, list(range(1, rounds + 1))), floor="off")
    return {"clients": len(data.clients), "settings": settings, "paths": paths, "rounds": result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (after one warm-up)")
    parser.add_argument("--quick", action="store_true", help="2 timed rounds")
    parser.add_argument("--gsc", action="store_true", help="also the GSC-scale FedMLAC rounds")
    parser.add_argument("--gsc-rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="default: results/system-<utc>.json")
    args = parser.parse_args()
    repeats = 2 if args.quick else args.repeats
    torch.set_num_threads(1)
    data = build_federated_data(load_config(overrides=QUIET), progress=False)
    out: dict = {
        "settings": {
            "command": "fedac run (the default run), evaluation off",
            "overrides": QUIET,
            "paths": PATHS,
            "fedbuff": FEDBUFF,
            "repeats": repeats,
            "clients": len(data.clients),
            "host": platform.node(),
            "torch": torch.__version__,
            "load_average_start": os.getloadavg(),
        },
    }
    with tempfile.TemporaryDirectory() as tmp:
        rounds, sims = {}, {}
        for name, overrides in {**PATHS, "fedbuff": FEDBUFF}.items():
            sim, state = simulator(load_config(overrides=QUIET + overrides), data, Path(tmp) / name)
            rounds[name], sims[name] = fedac_round(sim, state), sim
        calls: list[int] = []
        real = sims["fedbuff"].plan.run
        sims["fedbuff"].plan.run = lambda payload, states, datas, *a: (
            calls.append(len(datas)) or real(payload, states, datas, *a)
        )
        samples = interleave(rounds, list(range(1, repeats + 1)))
        if args.gsc:
            out["gsc"] = gsc_scale(args.gsc_rounds, Path(tmp))
    result = summarize(samples, floor="off")
    result["fedbuff"].update(
        {
            "path": sims["fedbuff"].plan.path,
            "clients_per_stacked_call": calls,
        }
    )
    out["paths"] = result
    out["clock_2618"] = clock_at_scale()
    out["settings"]["load_average_end"] = os.getloadavg()
    for name, entry in result.items():
        ratio = f", {entry['vs_floor_cpu']:.3f}x off's CPU" if "vs_floor_cpu" in entry else ""
        print(f"{name}: {entry['wall_s']:.2f} s wall / {entry['cpu_s']:.2f} s CPU{ratio}")
    print(f"clock at {GSC_CLIENTS} clients: {out['clock_2618']}")
    for name, entry in out.get("gsc", {}).get("rounds", {}).items():
        print(f"gsc {name}: {entry['wall_s']:.2f} s wall / {entry['cpu_s']:.2f} s CPU")
    path = args.out or RESULTS / f"system-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
