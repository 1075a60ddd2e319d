"""bench_gpu.py's `kws` workload: FedAvg on each KWS network of experiments/fedkws.py (dscnn,
mhattrnn, resnet15, kwt) with FedKWS-UI's local training, 100 of 200 clients a round (random 40 x
101 windows, 12 classes), through fedac's `Simulator.run_round`, against `plain`:
workloads.SupervisedFloor, the per-client training loop a user would write with the same model,
optimizer and clipping, on the same device and the same clients; fedac_cpu is fedac's CPU default on
fewer clients a round. Target, per network: "kws NETWORK vs plain", fedac >= 5x the plain loop."""

from __future__ import annotations

from pathlib import Path

import torch

from fedac.config import load_config
from fedac.experiments.fedkws import KWS_NETWORKS, KWS_PROTOCOL
from fedac.models import build_model
from gpu_timing import (
    NO_EVAL,
    device_settings,
    fedac_path,
    floor_path,
    run_paths,
    scale,
    step_flops,
    supervised_floor,
    with_cpu,
)
from workloads import FEATURES, FRAMES, federated, gsc_scale_clients

KWS_CLASSES = 12
KWS_TRAIN = [
    s
    for s in KWS_PROTOCOL
    if s.startswith("train.")
    and not s.startswith(
        (
            "train.rounds=",
            "train.eval_every=",
            "train.checkpoint_every=",
            "train.select=",
            "train.test_curve=",
            "train.local_steps=",
            "train.fraction=",
        )
    )
]
"""FedKWS-UI's local training (batch 32, lr, weight decay, clipping at 50) without its schedule."""


def workload_kws(args, tmp: Path) -> dict:
    count, steps = scale(args, "kws_clients"), scale(args, "kws_steps")
    cpu_per_round = scale(args, "kws_cpu_per_round")
    data = lambda: federated(gsc_scale_clients(count, KWS_CLASSES), classes=KWS_CLASSES)  # noqa: E731
    clients = gsc_scale_clients(count, KWS_CLASSES)
    names = [c.name for c in clients]
    out: dict = args.live(
        {"clients": count, "per_round": count // 2, "local_steps": steps, "networks": {}}
    )
    for label, network in KWS_NETWORKS:
        print(f"  {label}", flush=True)
        base = [
            "algorithm=fedavg",
            *KWS_TRAIN,
            *network,
            f"train.local_steps={steps}",
            f"train.batch_size={scale(args, 'kws_batch')}",
            *NO_EVAL,
        ]
        cfg = load_config(overrides=[*base, "train.fraction=0.5", *device_settings(args)])
        cpu_cfg = lambda base=base: load_config(  # noqa: E731
            overrides=[*base, f"train.fraction={cpu_per_round / count}", "runtime.device=cpu"]
        )
        t = cfg.train

        def floor(device, cfg=cfg):
            model = build_model(cfg.model.name, FEATURES, KWS_CLASSES)
            return supervised_floor(cfg, clients, model, names, device)

        flops = step_flops(
            floor("cpu"), torch.randn(4, FEATURES, FRAMES), torch.zeros(4, dtype=torch.long)
        )
        paths = with_cpu(
            args,
            {
                "fedac": fedac_path(cfg, data, tmp / f"kws-{label}"),
                "plain": floor_path(lambda floor=floor: floor(args.device)),
            },
            (
                lambda cpu_cfg=cpu_cfg, label=label: fedac_path(
                    cpu_cfg(), data, tmp / f"kws-{label}-cpu"
                )
            )
            if cpu_per_round
            else None,
        )
        out["networks"][label] = {
            "model": cfg.model.name,
            "optimizer": t.optimizer,
            "flop_per_sample": flops,
            "paths": {},
        }
        run_paths(args, paths, flops, into=out["networks"][label]["paths"])
    return out
