"""How much slower this machine runs a fixed piece of CPU work than the machine check.sh's dry-run
budgets were set on: prints one number, the factor (>= 1) by which check.sh --dry-run scales its
section time limits, so the dry run's verdict does not depend on how busy the machine is, while a
hung section still runs into a (scaled, finite) limit.

    python benchmarks/gpu/calibrate.py          # e.g. 1.0 on an idle machine, 3.2 under load

The work: `REPS` rounds of a small convolution forward and backward and a few hundred small ops
(the mix of the dry run's sections), one thread, timed three times; the median wall time against
`REFERENCE_S`, what the work takes with a core to itself on the 2-core Intel Xeon (KVM,
AVX-512) the budgets were set on (its process CPU time there: 0.23-0.24 s, measured while the
machine was loaded, when the wall time was 0.5-0.9 s). Capped at `CAP`, so a machine slowed past it
still fails, and a hung section still meets a finite limit.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

REPS = 20
REFERENCE_S = 0.25
CAP = 8.0


def work() -> float:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 8, 40, 51, generator=g)
    w = torch.randn(16, 8, 3, 3, generator=g, requires_grad=True)
    started = time.perf_counter()
    for _ in range(REPS):
        y = F.conv2d(x, w, padding=1).relu()
        for _ in range(10):  # small ops: the per-op overhead a loaded machine also slows
            y = y * 0.5 + 0.1
        y.sum().backward()
    return time.perf_counter() - started


def factor() -> float:
    torch.set_num_threads(1)
    work()  # warm-up
    seconds = statistics.median(work() for _ in range(3))
    return min(max(seconds / REFERENCE_S, 1.0), CAP)


if __name__ == "__main__":
    print(f"{factor():.2f}")
