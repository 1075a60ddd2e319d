"""Round time of the personalised-FL baselines against FedAvg on the default run (the Speech
Commands stand-in at fedac's defaults: `fedac run --algorithm NAME`), and each method's state per
client. One command, writes JSON to benchmarks/results/pfl_rounds.json:

    .venv/bin/python benchmarks/bench_pfl.py                 # 6 rounds each
    .venv/bin/python benchmarks/bench_pfl.py --rounds 2      # smoke

A round here is the simulator's `run_round` (the cohort's training and the server's update; no
evaluation, whose cost for a personalised method grows with the clients that have trained). The
methods share one data build and take their rounds in turn, round 1 of each, then round 2, so the
machine's load falls on them alike; the first round of each (set-up) is dropped. Reported per
method: the median wall and process-CPU seconds per round, the ratio of each to FedAvg's (CPU
seconds are the number to read on a shared machine), the execution path and the bytes of one
client's persistent state. FedRep trains `fedrep.head_epochs` (10) + `train.local_epochs` (5) epochs
a round where FedAvg trains 5, so its ratio per epoch is also given.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from fedac.config import load_config
from fedac.engine.data import build_federated_data
from fedac.engine.simulator import Simulator
from fedac.training.device import nbytes
from workloads import cpu_info

METHODS = ("fedavg", "fedbn", "fedper", "fedrep", "lgfedavg", "local")
OUT = Path(__file__).parent / "results" / "pfl_rounds.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    methods = ["fedavg", *[m for m in args.methods if m != "fedavg"]]
    data = build_federated_data(load_config(), False)
    sims, states = {}, {}
    for name in methods:
        sims[name] = Simulator(
            load_config(algorithm=name), tempfile.mkdtemp(), data=data, progress=False
        )
        states[name] = sims[name].place_state(sims[name]._fresh_state())
    wall: dict[str, list[float]] = {m: [] for m in methods}
    cpu: dict[str, list[float]] = {m: [] for m in methods}
    for round_idx in range(1, args.rounds + 1):
        for name in methods:
            started, cpu_started = time.perf_counter(), time.process_time()
            sims[name].run_round(states[name], round_idx)
            wall[name].append(time.perf_counter() - started)
            cpu[name].append(time.process_time() - cpu_started)
    results = {}
    for name in methods:
        algo, cfg = sims[name].algorithm, sims[name].cfg
        epochs = cfg.train.local_epochs + (cfg.fedrep.head_epochs if name == "fedrep" else 0)
        results[name] = {
            "execution": algo.execution_path(),
            "wall_s_per_round": statistics.median(wall[name][1:]),
            "cpu_s_per_round": statistics.median(cpu[name][1:]),
            "epochs_per_round": epochs,
            "state_bytes_per_client": nbytes(algo.init_client_state(data.clients[0].name)),
        }
    base = results["fedavg"]
    for row in results.values():
        row["wall_ratio_to_fedavg"] = row["wall_s_per_round"] / base["wall_s_per_round"]
        row["cpu_ratio_to_fedavg"] = row["cpu_s_per_round"] / base["cpu_s_per_round"]
        row["cpu_ratio_per_epoch"] = row["cpu_ratio_to_fedavg"] * (
            base["epochs_per_round"] / row["epochs_per_round"]
        )
    report = {
        "machine": cpu_info(),
        "rounds": args.rounds,
        "clients_per_round": sims["fedavg"].cohort_size,
        "model": sims["fedavg"].cfg.model.name,
        "methods": results,
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    for name, row in results.items():
        print(
            f"{name:9s} {row['cpu_s_per_round']:6.2f} CPU s/round"
            f"  x{row['cpu_ratio_to_fedavg']:.2f}"
            f"  (x{row['cpu_ratio_per_epoch']:.2f} per epoch)  {row['execution']}"
        )


if __name__ == "__main__":
    main()
