"""bench_gpu.py's `paper` workload: bench_paper.py's paper schedule (configs/paper.yaml on the
embedded Speech Commands stand-in, 48 of 240 clients a round, FedMLAC) through fedac's
`Simulator.run_round`, against `plain`: workloads.MutualFloor, the per-client mutual-learning loop a
user would write, on the same device and the same clients; fedac_cpu is fedac's CPU default. Target:
"paper schedule", fedac <= 0.06 s/round."""

from __future__ import annotations

from pathlib import Path

import torch

from bench_paper import SETTINGS as PAPER_SETTINGS
from fedac.config import load_config
from fedac.engine.data import build_federated_data
from gpu_timing import (
    cohort,
    device_settings,
    fedac_path,
    floor_path,
    run_cohort_paths,
    scale,
    step_flops,
    with_cpu,
)
from workloads import MutualFloor

REPO = Path(__file__).resolve().parents[2]


def workload_paper(args, tmp: Path) -> dict:
    fraction = scale(args, "paper_fraction")
    overrides = [*PAPER_SETTINGS, f"train.fraction={fraction}"]
    cfg = load_config(
        REPO / "configs" / "paper.yaml", overrides=[*overrides, *device_settings(args)]
    )
    cpu_cfg = lambda: load_config(
        REPO / "configs" / "paper.yaml", overrides=[*overrides, "runtime.device=cpu"]
    )  # noqa: E731
    data = lambda: build_federated_data(cpu_cfg(), progress=False)  # noqa: E731 - on the CPU: each Simulator places it
    sample = data()
    names = [c.name for c in sample.clients if c.num_samples > 0]
    t = cfg.train

    def floor(device):
        return MutualFloor(
            sample.clients,
            device=device,
            pick=cohort(cfg, names),
            lr=t.lr,
            batch=t.batch_size,
            classes=sample.task.num_classes,
        )

    flops = step_flops(
        MutualFloor(sample.clients[:1], classes=sample.task.num_classes),
        torch.randn(4, sample.task.num_features, sample.clients[0].x.shape[-1]),
        torch.zeros(4, dtype=torch.long),
    )
    paths = with_cpu(
        args,
        {
            "fedac": fedac_path(cfg, data, tmp / "paper"),
            "plain": floor_path(lambda: floor(args.device)),
        },
        lambda: fedac_path(cpu_cfg(), data, tmp / "paper-cpu"),
    )
    return run_cohort_paths(args, cfg, names, paths, flops)
