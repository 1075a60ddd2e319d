"""bench_gpu.py's workloads, one module each (its docstring describes them): each builds its paths,
puts its node in the report (`args.live`) and times the paths into it (gpu_timing.run_paths). `RUNS`
maps each `--only` name to its function; `python benchmarks/bench_gpu.py` puts benchmarks/ on
sys.path, so this package and its modules import gpu_timing and workloads as top-level modules."""

from __future__ import annotations

from .gru import workload_gru
from .gsc import workload_gsc
from .impressions import workload_impressions
from .kws import workload_kws
from .paper import workload_paper
from .torchrun import workload_torchrun
from .w2v2 import workload_w2v2

# (bench_gpu.py runs its WORKLOADS by default, torchrun only when named; an unknown --only lists
# these in this order)
RUNS = {
    "paper": workload_paper,
    "gsc": workload_gsc,
    "kws": workload_kws,
    "w2v2": workload_w2v2,
    "impressions": workload_impressions,
    "gru": workload_gru,
    "torchrun": workload_torchrun,
}
