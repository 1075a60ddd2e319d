"""Round time of the client-side pFL methods against FedAvg's on the default run, and each method's
state per client.

    .venv/bin/python benchmarks/bench_pfl.py            # about 15 min on 2 busy cores
    .venv/bin/python benchmarks/bench_pfl.py --quick    # 2 timed rounds, auto and cohort only

Workload: the default run (`fedac run --algorithm NAME`: the Speech Commands stand-in, crnn_lite,
10% of the clients a round, 5 local epochs), each method with its registry run defaults, under
`runtime.execution` auto (on the CPU FedAvg trains the hand-written stacked CRNN, a local objective
keeps the vmapped module's clients sequential), cohort (stacked: a local objective through the
vmapped module) and sequential. Per (method, execution): `Simulator.run_round` (sampling, training,
server update and bookkeeping; no evaluation), one warm-up round, then `--repeats` rounds
interleaved round by round in one process on one torch thread. `vs_fedavg_*`: the ratio of medians
to FedAvg's round under the same execution (`vs_fedavg_*_paired`: the median of per-round ratios,
which cancels slow phases of a shared machine). Wall and CPU seconds are both recorded: on a busy
machine, read the CPU time. `state_bytes_per_client`: one client's persistent state (what the
method keeps on every client between rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cohort import RESULTS, fedac_round, interleave, simulator, summarize  # noqa: E402
from fedac.config import load_config  # noqa: E402
from fedac.engine.data import build_federated_data  # noqa: E402
from fedac.errors import ConfigError  # noqa: E402
from fedac.training.device import nbytes  # noqa: E402

METHODS = (
    "fedavg",
    "scaffold",
    "feddyn",
    "moon",
    "ditto",
    "apfl",
    "fedbn",
    "fedper",
    "fedrep",
    "lgfedavg",
    "local",
)
EXECUTIONS = ("auto", "cohort", "sequential")
QUIET = ["runtime.threads=1", "train.eval_every=1000000", "train.checkpoint_every=1000000"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--executions", default=",".join(EXECUTIONS))
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (after one warm-up)")
    parser.add_argument("--quick", action="store_true", help="2 timed rounds, auto and cohort")
    parser.add_argument("--out", type=Path, default=None, help="default: results/pfl-<utc>.json")
    args = parser.parse_args()
    methods = args.methods.split(",")
    executions = ["auto", "cohort"] if args.quick else args.executions.split(",")
    repeats = 2 if args.quick else args.repeats
    torch.set_num_threads(1)
    data = build_federated_data(load_config(overrides=QUIET), progress=False)
    out: dict = {
        "settings": {
            "command": "fedac run --algorithm NAME (the default run), evaluation off",
            "overrides": QUIET,
            "repeats": repeats,
            "clients": len(data.clients),
            "host": platform.node(),
            "torch": torch.__version__,
            "load_average_start": os.getloadavg(),
        },
        "methods": {},
    }
    paths, sims = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for method in methods:
            entry = out["methods"].setdefault(method, {})
            for execution in executions:
                cfg = load_config(
                    overrides=[*QUIET, f"algorithm={method}", f"runtime.execution={execution}"]
                )
                try:
                    sim, state = simulator(cfg, data, Path(tmp) / f"{method}-{execution}")
                except ConfigError as error:  # no stacked path: say why
                    entry[execution] = {"refused": str(error)}
                    continue
                entry[execution] = {"path": sim.plan.path}
                paths[f"{method}/{execution}"] = fedac_round(sim, state)
                sims[method] = sim
            sim = sims[method]
            first = sim.trainable[0]
            per_client = nbytes(sim.algorithm.init_client_state(first))
            entry["state_bytes_per_client"] = per_client
            entry["state_bytes_all_clients"] = per_client * len(sim.trainable)
        samples = interleave(paths, list(range(1, repeats + 1)))
    for key, result in summarize(samples, floor=None).items():
        method, execution = key.split("/")
        base = samples.get(f"fedavg/{execution}")
        if base is not None:
            mine = samples[key]
            result["vs_fedavg_wall"] = result["wall_s"] / statistics.median(w for w, _ in base)
            result["vs_fedavg_cpu"] = result["cpu_s"] / statistics.median(c for _, c in base)
            result["vs_fedavg_cpu_paired"] = statistics.median(
                a[1] / b[1] for a, b in zip(mine, base)
            )
        out["methods"][method][execution].update(result)
        print(
            f"{key}: {result['wall_s']:.2f} s wall / {result['cpu_s']:.2f} s CPU"
            + (f", {result['vs_fedavg_cpu']:.2f}x FedAvg's CPU" if base is not None else ""),
            flush=True,
        )
    out["settings"]["load_average_end"] = os.getloadavg()
    path = args.out or RESULTS / f"pfl-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
