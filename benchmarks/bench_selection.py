"""What choosing the clients costs: `SystemClock.sync_round` (which now asks the selection rule) at
the Speech Commands scale of FedScale's Google Speech (2,618 clients of 30 clips, synthetic devices
and availability, a deadline and over-commitment 1.3, K = 261), for each rule, after every kept
client reported a (seeded, made-up) loss, so Oort and power-of-choice rank a full history.

    .venv/bin/python benchmarks/bench_selection.py          # about a minute on 2 busy cores

Per rule: the median CPU (and wall) time of `--calls` rounds (after `--warmup` rounds that fill
the history) of the clock's sync round, and its CPU excess over `random` (the rule's own cost: the
clock's trace queries and outcomes are the same work for every rule). The reference "default
round" is the CPU seconds of one default-run round (fedac run: 24 of 240 clients, 5 local epochs,
no evaluation) that docs/performance.md reports (`REFERENCE`, its `paths.off.cpu_s`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fedac.config import load_config  # noqa: E402
from fedac.engine.clock.book import SystemBook  # noqa: E402
from fedac.engine.clock.schedule import ScheduleContext  # noqa: E402
from fedac.engine.clock.sync import SyncSchedule  # noqa: E402
from fedac.engine.clock.virtual import SystemClock  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
CLIENTS = 2618
RULES = ("random", "oort", "poc", "fedcs")


def rule_round(rule: str, calls: int, warmup: int) -> dict:
    cfg = load_config(
        overrides=[
            "system.devices=synthetic",
            "system.availability=synthetic",
            "system.overcommit=1.3",
            "system.deadline=30",
            f"selection.method={rule}",
        ]
    )
    sizes = {f"speaker{i:04d}": 30 for i in range(CLIENTS)}
    clock = SystemClock(cfg, sizes, lambda _: "crnn_lite", lambda _: 7.0e6)
    schedule = SyncSchedule(ScheduleContext(cfg, sizes, CLIENTS // 10, None, clock))
    book, history, samples, cpu = SystemBook(), {}, [], []
    rng = np.random.default_rng(0)
    sent = (130_700, 130_700)
    for round_idx in range(1, warmup + calls + 1):
        schedule.selector.bind(history)
        key = ("cohort", round_idx)
        started, started_cpu = time.perf_counter(), time.process_time()
        kept, _ = clock.sync_round(
            book,
            round_idx,
            CLIENTS // 10,
            *sent,
            lambda online, k, _, key=key, r=round_idx: schedule.choose(online, k, key, r, sent),
        )
        losses = {o.client: float(rng.uniform(0.5, 3)) for o in kept}
        schedule.selector.observe(round_idx, losses)
        if round_idx > warmup:
            samples.append(time.perf_counter() - started)
            cpu.append(time.process_time() - started_cpu)
    return {
        "sync_round_s": statistics.median(samples),
        "sync_round_cpu_s": statistics.median(cpu),
        "all_s": [round(s, 5) for s in samples],
    }


#: The default round's cost as docs/performance.md ("Virtual clock") reports it: CPU seconds (the
#: machine is shared; wall times there vary 5x with the load).
REFERENCE = "system-20261128T224737Z.json"


def default_round() -> tuple[float | None, str | None]:
    path = RESULTS / REFERENCE
    if not path.exists():
        return None, None
    return json.loads(path.read_text())["paths"]["off"]["cpu_s"], path.name


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    out: dict = {
        "settings": {
            "clients": CLIENTS,
            "cohort": CLIENTS // 10,
            "overcommit": 1.3,
            "calls": args.calls,
            "warmup": args.warmup,
            "load_average_start": os.getloadavg(),
        },
        "rules": {},
    }
    for rule in RULES:
        out["rules"][rule] = rule_round(rule, args.calls, args.warmup)
    base = out["rules"]["random"]["sync_round_cpu_s"]
    reference, source = default_round()
    out["default_round_s"], out["default_round_source"] = reference, source
    for rule, entry in out["rules"].items():
        entry["selection_cpu_s"] = entry["sync_round_cpu_s"] - base
        if reference:
            entry["selection_share_of_default_round"] = entry["selection_cpu_s"] / reference
        print(
            f"{rule}: {entry['sync_round_cpu_s'] * 1e3:.1f} ms CPU a round, selection "
            f"{entry['selection_cpu_s'] * 1e3:+.1f} ms"
        )
    out["settings"]["load_average_end"] = os.getloadavg()
    path = args.out or RESULTS / f"selection-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"default round {reference} CPU s ({source}); written {path}")


if __name__ == "__main__":
    main()
