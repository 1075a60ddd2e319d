"""bench_gpu.py's `w2v2` workload: early-exit fine-tuning (algorithms/earlyexit.py) of a w2v2_base
encoder with random weights (nothing downloaded), every client at exit 3, 6, 9, then 12, on clips of
1 s held as the frozen CNN's frames, through fedac's `Simulator.run_round`. At exit 12 against
`plain`: HFExitClassifier (a Hugging Face Wav2Vec2Model's projection and encoder with a stats-pool
head) in workloads.SupervisedFloor's per-client loop, on the same device and the same clients; and
fedac_cpu, fedac's CPU default on fewer clients a round. Target: "w2v2 exit 12 vs plain HF", fedac's
s/round <= 1.2x the plain loop's."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from fedac.algorithms.base import ClientData, Task
from fedac.config import load_config
from fedac.data.waveform import Padded
from fedac.engine.data import FederatedData
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

SSL_CLIPS, SSL_FRAMES, SSL_CLASSES = 16, 49, 35


class HFExitClassifier(nn.Module):
    """The plain Hugging Face model at an exit: Wav2Vec2Model's feature projection and encoder with
    its layers cut at `depth`, on the frozen CNN's frames, [mean; std] pooling and a linear head."""

    def __init__(self, size: str, depth: int, classes: int):
        from transformers import Wav2Vec2Model

        # the same sizes as fedac's (a transformers Wav2Vec2Config)
        from fedac.models.ssl import size_config

        super().__init__()
        backbone = Wav2Vec2Model(size_config(size))
        self.projection, self.encoder = backbone.feature_projection, backbone.encoder
        self.encoder.layers = self.encoder.layers[:depth]
        self.head = nn.Linear(2 * backbone.config.hidden_size, classes)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        hidden = self.projection(frames.float())[0]
        hidden = self.encoder(hidden).last_hidden_state
        pooled = torch.cat([hidden.mean(1), (hidden.var(1, unbiased=False) + 1e-5).sqrt()], dim=-1)
        return self.head(pooled)


def ssl_clients(count: int, conv: int) -> list[torch.Tensor]:
    """Each client's 16 clips of 1 s as CNN frames (49 x conv, float16 as the engine caches
    them)."""
    g = torch.Generator().manual_seed(0)
    return [
        torch.randn(SSL_CLIPS, SSL_FRAMES, conv, generator=g).to(torch.float16)
        for _ in range(count)
    ]


def workload_w2v2(args, tmp: Path) -> dict:
    from fedac.models.ssl_sizes import SIZES

    size, count = scale(args, "ssl_size"), scale(args, "ssl_clients")
    cpu_per_round = scale(args, "ssl_cpu_per_round")
    conv = SIZES[size].conv
    frames = ssl_clients(count, conv)
    labels = [
        torch.randint(0, SSL_CLASSES, (SSL_CLIPS,), generator=torch.Generator().manual_seed(i))
        for i in range(count)
    ]
    lengths = torch.full((SSL_CLIPS,), SSL_FRAMES)
    names = [f"client{i:04d}" for i in range(count)]

    def data() -> FederatedData:
        clients = [
            ClientData(
                n,
                Padded(x, lengths.clone()),
                y,
                Padded.stack([], (conv,)),
                torch.zeros(0, dtype=torch.long),
            )
            for n, x, y in zip(names, frames, labels)
        ]
        return FederatedData(Task(conv, SSL_CLASSES, names), None, clients, None, None)  # type: ignore[arg-type]

    plain_clients = [ClientData(n, x, y, x[:0], y[:0]) for n, x, y in zip(names, frames, labels)]
    base = [
        "algorithm=earlyexit",
        f"model.name={size}",
        "model.encoder_path=random",
        "earlyexit.mode=homo",
        "train.batch_size=8",
        "train.local_epochs=1",
        "train.local_steps=0",
        *NO_EVAL,
    ]
    out: dict = args.live(
        {
            "size": size,
            "clients": count,
            "per_round": count // 2,
            "clips_per_client": SSL_CLIPS,
            "frames_per_clip": SSL_FRAMES,
            "depths": {},
        }
    )
    last = SIZES[size].layers
    for depth in (3, 6, 9, 12):
        print(f"  exit {depth}", flush=True)
        settings = [*base, f"earlyexit.depth={depth}"]
        cfg = load_config(overrides=[*settings, "train.fraction=0.5", *device_settings(args)])
        layer = max(1, round(depth * last / 12))

        def floor(device, layer=layer, cfg=cfg):
            model = HFExitClassifier(size, layer, SSL_CLASSES)
            return supervised_floor(cfg, plain_clients, model, names, device)

        flops = step_flops(floor("cpu"), frames[0][:2], labels[0][:2])
        paths = {"fedac": fedac_path(cfg, data, tmp / f"w2v2-{depth}")}
        if depth == 12:
            paths["plain"] = floor_path(lambda floor=floor: floor(args.device))
            cpu_cfg = lambda settings=settings: load_config(  # noqa: E731
                overrides=[
                    *settings,
                    f"train.fraction={cpu_per_round / count}",
                    "runtime.device=cpu",
                ]
            )
            with_cpu(
                args,
                paths,
                (lambda: fedac_path(cpu_cfg(), data, tmp / "w2v2-cpu")) if cpu_per_round else None,
            )
        node = out["depths"][str(depth)] = {"layer": layer, "flop_per_sample": flops, "paths": {}}
        result = run_paths(args, paths, flops, into=node["paths"])
        node["peak_gpu_mb"] = result["fedac"].get("peak_gpu_mb")
    return out
