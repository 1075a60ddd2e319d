"""A method written as a `LocalObjective` against FedAvg: round time on the default task under
`runtime.execution=auto`, the path auto takes, and the ratio, measured in one process.

    .venv/bin/python benchmarks/bench_objective.py                  # about 2 min on 2 cores
    .venv/bin/python benchmarks/bench_objective.py --methods fedavg scaffold feddyn

Workload: the default run's task (embedded Speech Commands stand-in, 240 speakers, CRNN-Lite, 10%
of the clients a round, 5 local epochs), one torch thread. Each method is a `Simulator` whose rounds
(`Simulator.run_round`: sampling, training, the server step) are interleaved round by round after
an untimed first round (auto's probe, where a method has one, happens there). Methods named here
that are not registered are skipped (`--methods`); `scaffold` is the plug-in example of
tests/plugin_example, loaded from there when no built-in of that name is registered.

The target (issue: a FedDyn-style objective must train stacked at no more than 1.5x FedAvg's round
time): `ratio_to_fedavg` per method, with the path results.json would name.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cohort import RESULTS, fedac_round, interleave, machine, simulator, summarize  # noqa: E402
from fedac.config import load_config  # noqa: E402
from fedac.engine.data import build_federated_data  # noqa: E402
from fedac.settings.algorithms import ALGORITHMS  # noqa: E402


def plugin_scaffold():
    """The SCAFFOLD plug-in example (a LocalObjective), registered for this process."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "plugin_example"))
    from fedac_example.entries import SCAFFOLD

    ALGORITHMS.register("scaffold", SCAFFOLD)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=["fedavg", "scaffold", "feddyn"])
    parser.add_argument("--rounds", type=int, default=4, help="timed rounds per method")
    parser.add_argument("--out", type=Path, default=RESULTS / "objective.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if "scaffold" in args.methods and "scaffold" not in ALGORITHMS:
        plugin_scaffold()
    methods = [m for m in args.methods if m in ALGORITHMS]
    skipped = sorted(set(args.methods) - set(methods))
    base = load_config(overrides=["runtime.device=cpu", "runtime.threads=1"])
    data = build_federated_data(base, progress=False, device=torch.device("cpu"))
    paths, executions = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for method in methods:
            cfg = load_config(
                overrides=[f"algorithm={method}", "runtime.device=cpu", "runtime.threads=1"]
            )
            sim, state = simulator(cfg, data, Path(tmp) / method)
            paths[method] = fedac_round(sim, state)
            executions[method] = sim
            paths[method](1)  # untimed: set-up, and auto's probe where the method has one
        samples = interleave(paths, list(range(2, 2 + args.rounds)), warmup=0)
    out = summarize(samples, floor="fedavg")
    report = {
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "rounds_timed": args.rounds,
        "skipped_not_registered": skipped,
        "methods": {
            m: {
                **out[m],
                "execution": executions[m].plan.path,
                "ratio_to_fedavg": out[m].get("vs_floor_wall", 1.0),
            }
            for m in methods
        },
        "note": "s per round (Simulator.run_round), one torch thread, rounds interleaved; "
        "ratio_to_fedavg: median round wall time / FedAvg's",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    for m in methods:
        row = report["methods"][m]
        ratio = row["ratio_to_fedavg"]
        print(f"{m:10s} {row['wall_s']:.3f} s/round x{ratio:.2f} {row['execution']}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
