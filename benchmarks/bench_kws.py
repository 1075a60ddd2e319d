"""Per-round time of the four keyword-spotting networks (issue 11) against their sequential floor.

    .venv/bin/python benchmarks/bench_kws.py              # about 5 min on 2 busy cores
    .venv/bin/python benchmarks/bench_kws.py --quick      # one network, 2 timed rounds (smoke run)

Workload: FedKWS-UI's protocol (reproduce.KWS_PROTOCOL: 12-class FedKWS task of the embedded Speech
Commands stand-in, speakers with >= 5 clips, batch 32, SGD momentum 0.9, weight decay 1e-5, gradient
clipping at 50; KWT with AdamW) with its 8 kHz MFCCs (`features.style=fedkws`), scaled down to
`--steps` local steps and `--fraction` of the clients a round. Per network and round, paths
interleaved round by round in one process on one torch thread:
- fedavg, fedkwsui: `Simulator.run_round` with the engine's default execution
  (`train.execution=auto`), sampling, server update and bookkeeping included;
- floor: the same clients' FedAvg steps back to back in a plain torch loop (one model, the global
  weights loaded per client, the same optimiser and clipping, no fedac code).
Ratios to the floor are the ratio of medians and the median of per-round ratios (vs_floor_*_paired).
Wall and CPU seconds are both recorded: on a machine shared with other jobs, read the CPU time.

The path these networks take is the engine's choice (engine/execution.py `ExecutionPlan`): they
stack through vmap, so `auto` times both paths on the first round's probe chunk, on this machine.
The JSON records, per algorithm, whether the configuration can stack at all (`*_stackable`:
`stacking_obstacle` is None) and the path the run took (`*_execution`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cohort import RESULTS, fedac_round, interleave, simulator, summarize  # noqa: E402
from fedac.config import load_config  # noqa: E402
from fedac.engine.data import build_federated_data  # noqa: E402
from fedac.engine.execution import stacking_obstacle
from fedac.engine.simulator import sample_cohort  # noqa: E402
from fedac.experiments.fedkws import KWS_NETWORKS, KWS_PROTOCOL  # noqa: E402
from fedac.models import build_model  # noqa: E402
from fedac.training.local import cycling_batches  # noqa: E402

NETWORKS = dict(KWS_NETWORKS)


class KWSFloor:
    """The round's FedAvg steps in a plain loop: the engine's clients, batches of the cycling
    loader."""

    def __init__(self, cfg, data, trainable):
        self.cfg, self.data, self.trainable = cfg, data, trainable
        self.model = build_model(cfg.model.name, data.task.num_features, data.task.num_classes)
        self.global_state = {k: v.clone() for k, v in self.model.state_dict().items()}

    def optimizer(self):
        t = self.cfg.train
        if t.optimizer == "adamw":
            return torch.optim.AdamW(self.model.parameters(), lr=t.lr, weight_decay=t.weight_decay)
        return torch.optim.SGD(
            self.model.parameters(), lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay
        )

    def __call__(self, round_idx: int) -> None:
        t, model = self.cfg.train, self.model
        for name in sample_cohort(self.trainable, t.fraction, self.cfg.seed, round_idx):
            client = self.data.client(name)
            model.load_state_dict(self.global_state)
            model.train()
            opt = self.optimizer()
            for idx in cycling_batches(
                client.num_samples,
                t.batch_size,
                t.local_steps,
                torch.Generator().manual_seed(round_idx),
            ):
                loss = F.cross_entropy(model(client.x[idx]), client.y[idx])
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), t.max_grad_norm)
                opt.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--networks", default=",".join(NETWORKS), help="comma-separated: " + ", ".join(NETWORKS)
    )
    parser.add_argument("--steps", type=int, default=10, help="local steps E (the protocol: 50)")
    parser.add_argument(
        "--fraction", type=float, default=0.05, help="clients a round (the protocol: 0.1)"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed rounds per path (after one warm-up round)"
    )
    parser.add_argument("--quick", action="store_true", help="DSCNN only, 2 timed rounds")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON path (default benchmarks/results/kws-<utc>.json)",
    )
    args = parser.parse_args()
    networks = ["DSCNN"] if args.quick else args.networks.split(",")
    repeats = 2 if args.quick else args.repeats
    torch.set_num_threads(1)
    scale = [
        f"train.local_steps={args.steps}",
        f"fedkwsui.local_steps={args.steps}",
        f"train.fraction={args.fraction}",
        "features.style=fedkws",
        "train.threads=1",
        "train.eval_every=1000000",
        "train.checkpoint_every=1000000",
    ]
    load_start = os.getloadavg()
    data = build_federated_data(load_config(overrides=[*KWS_PROTOCOL, *scale]), progress=False)
    out: dict = {
        "settings": {
            "protocol": KWS_PROTOCOL,
            "scale": scale,
            "repeats": repeats,
            "clients": len(data.clients),
            "host": platform.node(),
            "torch": torch.__version__,
            "load_average_start": load_start,
        },
        "networks": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for label in networks:
            overrides = [*KWS_PROTOCOL, *scale, *NETWORKS[label]]
            paths = {}
            for algorithm in ("fedavg", "fedkwsui"):
                sim, state = simulator(
                    load_config(overrides=[*overrides, f"algorithm={algorithm}"]),
                    data,
                    Path(tmp) / f"{label}-{algorithm}",
                )
                paths[algorithm] = fedac_round(sim, state)
                record = out["networks"].setdefault(label, {})
                record[f"{algorithm}_stackable"] = stacking_obstacle(sim.algorithm) is None
                record[f"{algorithm}_execution"] = sim.plan
            paths["floor"] = KWSFloor(load_config(overrides=overrides), data, sim.trainable)
            result = summarize(interleave(paths, list(range(1, repeats + 1))))
            out["networks"][label].update(result)
            for algorithm in ("fedavg", "fedkwsui"):  # the path each took, after auto's probe
                plan = out["networks"][label][f"{algorithm}_execution"]
                out["networks"][label][f"{algorithm}_execution"] = plan.path
            print(
                f"{label}: "
                + ", ".join(
                    f"{k} {v['wall_s']:.2f} s wall / {v['cpu_s']:.2f} s CPU"
                    for k, v in result.items()
                ),
                flush=True,
            )
    out["settings"]["load_average_end"] = os.getloadavg()
    out["note"] = (
        "s per round; fedavg / fedkwsui: the engine's path under auto (*_execution; "
        "*_stackable: whether the configuration can stack); floor: plain-torch FedAvg "
        "steps; vs_floor_*: ratio to the floor"
    )
    path = args.out or RESULTS / f"kws-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
