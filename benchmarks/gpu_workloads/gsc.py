"""bench_gpu.py's `gsc` workload: bench_cohort.py's GSC scale (2,618 clients of random 40 x 101
windows, 524 a round, FedMLAC, every personalized model resident) through fedac's
`Simulator.run_round`, against `plain`: workloads.MutualFloor, the per-client mutual-learning loop a
user would write, on the same device and the same clients. On CUDA also fedac_chunk16 (the CPU's
chunk against auto's packing) and fedac_gru_torch (the pure-torch GRU against the Triton kernel);
fedac_cpu is fedac's CPU default. Targets: "gsc round", fedac <= 0.3 s/round, and "gsc vs plain",
fedac >= 10x the plain loop (the number benchmarks/gpu/check.sh's gsc section waits for)."""

from __future__ import annotations

from pathlib import Path

import torch

from fedac.config import load_config
from gpu_timing import (
    NO_EVAL,
    SCHEDULE,
    cohort,
    device_settings,
    fedac_path,
    floor_path,
    run_cohort_paths,
    scale,
    step_flops,
    with_cpu,
)
from workloads import (
    FEATURES,
    FEDMLAC_SETTINGS,
    FRAMES,
    MutualFloor,
    federated,
    gsc_scale_clients,
)


def workload_gsc(args, tmp: Path) -> dict:
    count = scale(args, "gsc_clients")
    data = lambda: federated(gsc_scale_clients(count))  # noqa: E731
    settings = [*SCHEDULE, *FEDMLAC_SETTINGS, *NO_EVAL]
    cfg = load_config(overrides=[*settings, *device_settings(args)])
    clients = gsc_scale_clients(count)
    names = [c.name for c in clients]
    flops = step_flops(
        MutualFloor(clients[:1]), torch.randn(4, FEATURES, FRAMES), torch.zeros(4, dtype=torch.long)
    )
    # fedac and the plain loop first: their ratio is the number a lent machine's check waits for
    paths = {
        "fedac": fedac_path(cfg, data, tmp / "gsc", resident=True),
        "plain": floor_path(
            lambda: MutualFloor(clients, device=args.device, pick=cohort(cfg, names))
        ),
    }
    # packing's choice (auto: chunks from free memory) against the CPU's 16
    if args.device.type == "cuda":
        paths["fedac_chunk16"] = fedac_path(
            load_config(overrides=[*settings, *device_settings(args), "runtime.cohort_chunk=16"]),
            data,
            tmp / "gsc16",
            resident=True,
        )
        # the stacked GRU's recurrence: the Triton kernel (auto's choice on a GPU) against the
        # pure-torch loop
        paths["fedac_gru_torch"] = fedac_path(
            load_config(overrides=[*settings, *device_settings(args), "runtime.gru_kernel=torch"]),
            data,
            tmp / "gsc-gru",
            resident=True,
        )
    paths = with_cpu(
        args,
        paths,
        lambda: fedac_path(
            load_config(overrides=[*settings, "runtime.device=cpu"]),
            data,
            tmp / "gsc-cpu",
            resident=True,
        ),
    )
    return run_cohort_paths(args, cfg, names, paths, flops)
