"""Did a table's runs converge? Continue some of them to more rounds and compare.

    .venv/bin/python scripts/probe_rounds.py runs/reproduce-pfl-tuned/speech_commands \
        --rounds 250 --out runs/probe-250 --jobs 2 \
        --runs FedDyn Ditto "FedProx_(untuned)" FedAvg "FedAvg_(untuned)" --seeds 0 1 2

Each run `<cell>/<run>-s<seed>` goes on in a copy, `fedac run --resume RUN --rounds N --out
OUT/<run>-s<seed>` (a copy already finished is read back; a killed one resumes), so the table's own
runs stay as they are. Then OUT/probe.md and OUT/probe.json: per run name, over the seeds, the
clients' models' held-out accuracy at the last round (as `fedac reproduce pfl` ranks it) and the
shared model's test accuracy, before and after, and per seed the flattening check of tuned.md (the
mean of the last 5 validation accuracies against the 5 before) at the new last round.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fedac.experiments.pfl import (
    FLAT_POINTS,
    FLAT_WINDOW,
    client_figures,
    validation_curve,
    window_move,
)
from fedac.training.metrics import mean_std

FEDAC = str(Path(sys.executable).with_name("fedac"))


def go_on(source: Path, copy: Path, rounds: int) -> None:
    """`source` continued to `rounds` in `copy` (nothing to do once `copy` has finished)."""
    if (copy / "results.json").is_file():
        return
    command = [FEDAC, "run", "--quiet", "--resume"]
    command += [str(copy)] if copy.is_dir() else [str(source), "--out", str(copy)]
    with open(copy.with_suffix(".log"), "w") as log:
        subprocess.run([*command, "--rounds", str(rounds)], stdout=log, stderr=log, check=True)
    print(f"finished {copy}", flush=True)


def figures(run: Path) -> dict[str, Any]:
    """The run's held-out mean (last round), test accuracy and last-window validation move."""
    results = json.loads((run / "results.json").read_text())
    return {
        "held_out": 100 * float(client_figures(run)["clients_last_mean"]),
        "test": 100 * float(results["final"]["accuracy"]),
        # (None: fewer than two windows of evaluations)
        "val_move": window_move(validation_curve(run)),
        "rounds": float(results["rounds"]),
    }


def shown(values: list[float]) -> str:
    """mean ± std as the tables show them (population std over seeds, `mean_std`)."""
    mean, std = mean_std(values)
    return f"{mean:.2f} ± {std:.2f}" if len(values) > 1 else f"{mean:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cell", type=Path, help="a table's cell folder of runs <name>-s<seed>")
    parser.add_argument("--runs", nargs="+", required=True, help="run names, without -s<seed>")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (one core each)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    pairs = [
        (args.cell / f"{name}-s{seed}", args.out / f"{name}-s{seed}")
        for seed in args.seeds
        for name in args.runs
    ]
    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(lambda pair: go_on(pair[0], pair[1], args.rounds), pairs))
    rows, lines = {}, []
    header = (
        "| Run | held-out mean, before | after | change | test, before | after "
        "| validation move, per seed |"
    )
    given = shlex.join(sys.argv[1:] if argv is None else argv)
    lines += [
        f"# {args.cell}: {len(args.seeds)} seeds continued to {args.rounds} rounds",
        "",
        f"Command: `python scripts/probe_rounds.py {given}`",
        "",
        "Held-out: the clients' models on their held-out clips at the last round, mean over "
        "clients (own models where the method keeps them); test: the shared model on the test "
        "split; "
        f"validation move: the mean of the last {FLAT_WINDOW} validation accuracies minus the "
        f"{FLAT_WINDOW} before, in points (flat: within {FLAT_POINTS}). Mean ± std over seeds.",
        "",
        header,
        "|---|---|---|---|---|---|---|",
    ]
    for name in args.runs:
        before = [figures(args.cell / f"{name}-s{s}") for s in args.seeds]
        after = [figures(args.out / f"{name}-s{s}") for s in args.seeds]
        # (mean, population std) over seeds, as the tables show them
        summary = {
            figure: {
                "before": mean_std([b[figure] for b in before]),
                "after": mean_std([a[figure] for a in after]),
            }
            for figure in ("held_out", "test")
        }
        rows[name] = {"before": before, "after": after, **summary}
        held = [a["held_out"] for a in after]
        change = statistics.mean(held) - statistics.mean(b["held_out"] for b in before)
        moves = ", ".join(
            "n/a" if a["val_move"] is None else f"{a['val_move']:+.2f}" for a in after
        )
        lines.append(
            f"| {name} | {shown([b['held_out'] for b in before])} | {shown(held)} | "
            f"{change:+.2f} | {shown([b['test'] for b in before])} | "
            f"{shown([a['test'] for a in after])} | {moves} |"
        )
    (args.out / "probe.md").write_text("\n".join(lines) + "\n")
    (args.out / "probe.json").write_text(json.dumps(rows, indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
