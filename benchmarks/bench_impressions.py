"""Data-impression synthesis (zero-shot FL, Eq. 3) before and after issue 12's batched path. One
command, writes JSON to benchmarks/results/:

    .venv/bin/python benchmarks/bench_impressions.py              # 1500 steps (paper): 15-30 min
    .venv/bin/python benchmarks/bench_impressions.py --steps 150  # a smoke run

The report models are real: round 4 of the homogeneous scenario (seed 0) is trained on each
stand-in, and the two Choice 2 uploads (u1 cnn2_softmax and u2 cnn3_relu, one new class each) are
kept. For that round, three paths run one after another in this one process, on one torch thread
each:
- before: the code of commit 15879bb (read from git), one `synthesize_impressions` per class, each
  optimising its batches of `zeroshot.di_batch` one after another;
- after_1_worker: this code's `ZeroShotFL.synthesize_reports` on one thread
  (`train.cohort_workers=1`): all batches of all of a report's classes in one tensor, reports one
  after another;
- after: the default, reports on `train.cohort_workers` threads (0: one per free core; 2 here).
Each path runs `--repeats` times in rotated blocks; seconds per class (medians) are wall and
process-CPU seconds, summed over the round's reports and divided by its classes (on one thread the
CPU time is the work itself, the one to read on a busy host; with 2 workers the gain is in wall
time, where a second core is free). The largest difference between the impressions of before and
after is reported too (same equations from the same starting points: float rounding at most).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from fedac.algorithms.zeroshot import ClassReport
from fedac.seeding import numpy_rng, torch_generator
from fedac.training.stacking import cohort_workers
from workloads import capture_reports

BASELINE = "15879bb"
ROOT = Path(__file__).resolve().parents[1]


def baseline_module():
    """algorithms/zeroshot.py as it was before the batched path."""
    source = subprocess.run(
        ["git", "show", f"{BASELINE}:src/fedac/algorithms/zeroshot.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path("/tmp") / f"fedac_zeroshot_{BASELINE}.py"
    path.write_text(source)
    # Its imports name two modules that have since moved; they are the same code at their new homes.
    import fedac.algorithms.zeroshot_kmedoids
    import fedac.training.local

    sys.modules.setdefault("fedac.algorithms.local", fedac.training.local)
    sys.modules.setdefault("fedac.kmedoids", fedac.algorithms.zeroshot_kmedoids)
    spec = importlib.util.spec_from_file_location("zeroshot_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


def before(module, alg, report: ClassReport, round_idx: int) -> list[torch.Tensor]:
    """The baseline's `_impressions` loop: one synthesis per class, batches one after another."""
    from fedac.models import build_model

    zs, K = alg.cfg.zeroshot, report.num_known
    model = build_model(report.arch, alg.task.num_features, K + len(report.local_ids))
    model.load_state_dict(report.state)
    similarity = module.class_similarity(model.head.weight).numpy()
    count = zs.di_per_class or int(np.bincount(alg.public_y).max())
    out = []
    for j, local_id in enumerate(report.local_ids):
        rng = numpy_rng(alg.cfg.seed, "zeroshot-dirichlet", round_idx, report.user, local_id)
        targets = torch.from_numpy(
            module.dirichlet_targets(similarity[K + j], count, zs.di_betas, rng)
        )
        gen = torch_generator(
            alg.cfg.seed, "zeroshot-impressions", round_idx, report.user, local_id
        )
        x, _ = module.synthesize_impressions(
            model,
            targets,
            tuple(alg.public_x.shape[1:]),
            zs.di_tau,
            zs.di_lr,
            zs.di_steps,
            zs.di_batch,
            gen,
        )
        out.append(x)
    return out


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument(
        "--repeats", type=int, default=2, help="timed blocks per path (medians are reported)"
    )
    parser.add_argument("--datasets", nargs="+", default=["speech_commands", "urbansound8k"])
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/impressions.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    module = baseline_module()
    rows = []
    for dataset in args.datasets:
        runner, reports = capture_reports(dataset, args.steps)
        alg = runner.algorithm
        classes = sum(len(r.local_ids) for r in reports)
        paths = ["before", "after_1_worker", "after"]
        runs: dict[str, list[tuple[float, float]]] = {p: [] for p in paths}
        xs = {}
        # rotated blocks, so a change in the host's load hits every path
        for block in range(args.repeats):
            for path in paths[block % 3 :] + paths[: block % 3]:
                if path == "before":
                    fn = lambda: [x for r in reports for x in before(module, alg, r, 4)]  # noqa: E731
                else:
                    workers = 1 if path == "after_1_worker" else cohort_workers(runner.cfg.train)
                    fn = lambda: [
                        x
                        for out, _, _ in alg.synthesize_reports(reports, 4, workers)  # noqa: E731
                        for x in out
                    ]
                xs[path], wall, cpu = timed(fn)
                runs[path].append((wall / classes, cpu / classes))
        median = lambda values: float(np.median(values))  # noqa: E731
        timings = {
            p: {
                "wall_s_per_class": median([w for w, _ in runs[p]]),
                "cpu_s_per_class": median([c for _, c in runs[p]]),
                "runs": runs[p],
            }
            for p in paths
        }
        row = {
            "dataset": dataset,
            "reports": [(r.user, r.arch, len(r.local_ids)) for r in reports],
            "impressions_per_class": len(xs["after"][0]),
            "steps": args.steps,
            "workers_after": cohort_workers(runner.cfg.train),
            **timings,
            "cpu_speedup_1_worker": timings["before"]["cpu_s_per_class"]
            / timings["after_1_worker"]["cpu_s_per_class"],
            "wall_speedup": timings["before"]["wall_s_per_class"]
            / timings["after"]["wall_s_per_class"],
            "max_abs_diff": max(
                float((a - b).abs().max()) for a, b in zip(xs["before"], xs["after"])
            ),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"command": " ".join(sys.argv), "baseline": BASELINE, "rows": rows}, indent=2)
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
