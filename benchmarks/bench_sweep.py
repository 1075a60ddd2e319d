"""The overhead of a `fedac sweep` trial over a plain `fedac run` of the same settings. One command,
writes JSON to benchmarks/results/bench_sweep.json:

    .venv/bin/python benchmarks/bench_sweep.py              # 20 rounds of the default task
    .venv/bin/python benchmarks/bench_sweep.py --rounds 5   # a shorter measurement

The default task (`fedac run` with no settings: FedAvg on the Speech Commands stand-in) at
`--rounds` rounds, run three ways, each in a fresh process, interleaved `--repeats` times so that a
busy machine slows them alike:

- run: `fedac run --rounds R --seed 0` (start-up, data from the feature cache, the rounds, the
  final evaluation);
- sweep: `fedac sweep --trials 1 --rounds R --seed 0 --search train.lr=0.1,0.1000001 --pruner none`
  in a new folder: one trial of (to seven digits) the same settings, with the study's journal,
  trials.csv, sweep.png and best.yaml written;
- startup: `fedac sweep --help`, the interpreter and the parser alone.

Reported: each command's wall and CPU seconds (the child's user + sys), and the sweep's overhead
over the run, (sweep - run) / run, in both. On a machine other jobs load, a run's rounds vary by
more than the overhead itself, so the overhead is also reported from the fixed costs alone: each
command's wall time less its run's own `wall_seconds` (results.json: the rounds and the final
evaluation) is what it spends outside training (start-up, data, the study and its outputs), and
`overhead_fixed` = (sweep's fixed - run's fixed) / the run's whole wall time. The feature cache is
built once before the timings.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(args: list[str], env: dict[str, str]) -> dict[str, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "fedac", *args],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu}


def rounds_seconds(run_dir: Path) -> float:
    """The run's own wall time (results.json `wall_seconds`: its rounds and final evaluation)."""
    return float(json.loads((run_dir / "results.json").read_text())["wall_seconds"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    work = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    common = ["--rounds", str(args.rounds), "--seed", "0"]
    # the feature cache, once
    timed(["run", "--quiet", "--rounds", "1", "--out", str(work / "warm")], env)
    times: dict[str, list[dict[str, float]]] = {"run": [], "sweep": [], "startup": []}
    for k in range(args.repeats):
        times["run"].append(timed(["run", "--quiet", *common, "--out", str(work / f"run{k}")], env))
        times["run"][-1]["rounds_s"] = rounds_seconds(work / f"run{k}")
        times["sweep"].append(
            timed(
                [
                    "sweep",
                    "--quiet",
                    "--trials",
                    "1",
                    *common,
                    "--out",
                    str(work / f"sw{k}"),
                    "--search",
                    "train.lr=0.1,0.1000001",
                    "--pruner",
                    "none",
                ],
                env,
            )
        )
        times["sweep"][-1]["rounds_s"] = rounds_seconds(work / f"sw{k}" / "trials" / "0000")
        times["startup"].append(timed(["sweep", "--help"], env))
    for name in ("run", "sweep"):
        for t in times[name]:
            t["fixed_s"] = t["wall_s"] - t["rounds_s"]
    best = {
        name: {k: min(t[k] for t in ts) for k in ("wall_s", "cpu_s")} for name, ts in times.items()
    }
    overhead = {
        k: (best["sweep"][k] - best["run"][k]) / best["run"][k] for k in ("wall_s", "cpu_s")
    }
    fixed = {name: min(t["fixed_s"] for t in times[name]) for name in ("run", "sweep")}
    overhead["fixed"] = (fixed["sweep"] - fixed["run"]) / best["run"]["wall_s"]
    out = {
        "rounds": args.rounds,
        "repeats": args.repeats,
        "task": "fedac run defaults (FedAvg, Speech Commands stand-in)",
        "times": times,
        "best": best,
        "fixed_s": fixed,
        "overhead": overhead,
        "load_average": os.getloadavg(),
    }
    results = ROOT / "benchmarks" / "results"
    results.mkdir(exist_ok=True)
    (results / "bench_sweep.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({"best": best, "fixed_s": fixed, "overhead": overhead}, indent=1))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
