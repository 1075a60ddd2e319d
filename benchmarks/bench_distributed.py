"""Round time of one `fedac run` in 1 and in 2 processes (torchrun, gloo, CPU), side by side in one
run:

    .venv/bin/python benchmarks/bench_distributed.py                       # default run, 8 rounds
    .venv/bin/python benchmarks/bench_distributed.py --rounds 6 --set train.fraction=0.2 ...

Each configuration is a fresh `python -m torch.distributed.run --standalone --nproc-per-node P -m
fedac run` (P = 1 is the one-process path: torchrun sets no WORLD_SIZE above 1), the two interleaved
`--repeats` times so both see the same machine load. A round's time is the median gap between the
wall_seconds of consecutive rounds in metrics.csv from round 2 on (the first carries one-off set-up:
templates, the auto probe), and includes rank 0's validation (`train.eval_every=1`). The JSON also
has the start-up (launch to the end of round 1), the load average, each run's final accuracy (the
two must agree: engine/distributed.py) and, measured for P = 2 (FEDAC_TRAFFIC_LOG:
engine/distributed.py logs each collective's payload), the bytes each rank sends and receives per
round by kind of collective: the all-gather of the clients' results (pickled: uploads, new client
states, metrics) and, for the weighted-sum methods, the all-reduce of the float64 weighted sums (its
buffer; gloo's wire traffic for a ring of two is about that size each way). Evaluation's gathers are
counted apart. `held_states` gives, per rank, the client states it holds after the last round (count
and bytes; FEDAC_TRAFFIC_LOG's held<R>.jsonl): a client's state lives on its owner alone.

On a machine with C cores one process already trains its chunks on C worker threads
(`runtime.cohort_workers` auto); P processes get C / P workers each (LOCAL_WORLD_SIZE), so on one
machine the comparison is of the same cores used two ways. The gain of several processes is more
cores and more machines than one process can reach.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def traffic(folder: Path) -> dict:
    """Mean payload bytes per rank per round, sent and received, by collective (the gathers of the
    evaluation summed under 'evaluation'); {} without a log (one process)."""
    per: dict[str, dict[str, list[int]]] = {}
    for path in folder.glob("rank*.jsonl"):
        for line in path.read_text().splitlines():
            item = json.loads(line)
            if item["round"] is None:
                continue  # the start (the shared state) and the final evaluation
            kind = (
                "evaluation"
                if "evaluation" in item["what"]
                or "scores" in item["what"]
                or "accuracy" in item["what"]
                else item["what"]
            )
            entry = per.setdefault(kind, {"sent": [], "received": []})
            entry["sent"].append(item["sent"])
            entry["received"].append(item["received"])
    ranks = max(1, len(list(folder.glob("rank*.jsonl"))))
    rounds = {
        json.loads(line)["round"]
        for path in folder.glob("rank*.jsonl")
        for line in path.read_text().splitlines()
    }
    rounds.discard(None)
    return {
        kind: {k: sum(v) / ranks / max(1, len(rounds)) for k, v in entry.items()}
        for kind, entry in per.items()
    }


def held(folder: Path) -> dict:
    """Per rank: the client states it held after the last round (its held<R>.jsonl's last line)."""
    return {
        path.stem[len("held") :]: {
            k: v for k, v in json.loads(path.read_text().splitlines()[-1]).items() if k != "round"
        }
        for path in sorted(folder.glob("held*.jsonl"))
    }


def run(processes: int, rounds: int, sets: list[str], out: Path) -> dict:
    args = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(processes),
        "-m",
        "fedac",
        "run",
        "--rounds",
        str(rounds),
        "--seed",
        "1",
        "--quiet",
        "--out",
        str(out),
        "--set",
        "train.eval_every=1",
        "--set",
        f"train.checkpoint_every={rounds}",
    ]
    for item in sets:
        args += ["--set", item]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "FEDAC_TRAFFIC_LOG": str(out / "traffic")}
    started = time.perf_counter()
    done = subprocess.run(args, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(
            f"{processes} process(es) failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    stamps = [float(r["wall_seconds"]) for r in rows]
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    results = json.loads((out / "results.json").read_text())
    return {
        "processes": processes,
        "round_s": statistics.median(gaps),
        "round_s_all": gaps,
        "launch_to_round1_s": wall
        - (stamps[-1] - stamps[0])
        - (results["wall_seconds"] - stamps[-1]),
        "wall_s": wall,
        "final_accuracy": results["final"].get("accuracy"),
        "upload_bytes_per_round": statistics.mean(float(r["upload_bytes"]) for r in rows),
        "clients_per_round": statistics.mean(float(r["clients"]) for r in rows),
        "bytes_per_rank_per_round": traffic(out / "traffic"),
        "held_states": held(out / "traffic"),
    }


def state_bytes(run_dir: Path) -> float:
    """Mean bytes of one client's persistent state in the checkpoint (0: the method keeps none)."""
    import torch

    from fedac.training.device import nbytes

    states = torch.load(run_dir / "checkpoint.pt", weights_only=False)["clients"]
    return statistics.mean(nbytes(s) for s in states.values()) if states else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "distributed.json"))
    parser.add_argument(
        "--run-dirs", help="keep the run directories here (default: a temporary folder)"
    )
    args = parser.parse_args()
    runs: dict[int, list[dict]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.run_dirs or scratch
        for repeat in range(args.repeats):
            for processes in (1, 2):
                out = Path(tmp) / f"p{processes}-r{repeat}"
                runs[processes].append(run(processes, args.rounds, args.sets, out))
                runs[processes][-1]["client_state_bytes"] = state_bytes(out)
                print(
                    json.dumps(
                        {k: v for k, v in runs[processes][-1].items() if k != "round_s_all"}
                    ),
                    flush=True,
                )
    summary = {}
    for processes, items in runs.items():
        summary[processes] = {
            "round_s": statistics.median(r["round_s"] for r in items),
            "final_accuracy": [r["final_accuracy"] for r in items],
            "bytes_per_rank_per_round": items[0]["bytes_per_rank_per_round"],
        }
    report = {
        "rounds": args.rounds,
        "repeats": args.repeats,
        "sets": args.sets,
        "cpus": os.cpu_count(),
        "loadavg_after": os.getloadavg(),
        "summary": summary,
        "runs": runs,
        "speedup_2_over_1": summary[1]["round_s"] / summary[2]["round_s"],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(
        json.dumps(
            {
                "summary": summary,
                "speedup_2_over_1": report["speedup_2_over_1"],
                "loadavg_after": report["loadavg_after"],
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
