"""Stacked against sequential client updates for FedKWS-UI's four KWS networks (their hand-written
stacked forms, models/kws_stacked.py; `--vmap`: training/functional.py's vmapped path instead) and
one zero-shot CNN (vmapped), under FedKWS-UI's local protocol. One command, writes JSON to
benchmarks/results/stacked_models.json:

    .venv/bin/python benchmarks/bench_stacked_models.py          # 16 clients, E = 5, 3 repeats
    .venv/bin/python benchmarks/bench_stacked_models.py --quick  # 4 clients, E = 2, 1 repeat: smoke

Protocol: FedKWS-UI's client update (private phase, ALT global steps, ALO loss), batch 32, clipping
at 50, SGD (lr 0.1, momentum 0.9) for DSCNN, MHAttRNN, ResNet15 and cnn3_relu, AdamW (lr 1e-3) for
KWT; random 40 x 101 features, 64 samples per client; one torch thread. For each model the two paths
run side by side in one process, interleaved, `--repeats` times each (the first call of each warms
up and is dropped); reported are the median wall and process-CPU seconds per round and the ratio
stacked / sequential (below 1: stacked is faster). CPU seconds are the number to read on a shared
machine. Both paths train the same clients from the same payload, and the script checks that their
uploads agree (max abs difference reported).

    # the SSL encoder (adds "ssl" to the JSON):
    .venv/bin/python benchmarks/bench_stacked_models.py --ssl w2v2_s

`--ssl SIZE`: the early-exit SSL encoder (its classification head at the last exit, the CNN frozen,
as `earlyexit` trains it) on 1 s clips of cached CNN frames (49 x conv, every clip full length), SGD
with `train.*`'s defaults and clipping at 50: the plain loop (one client after another, torch.optim)
against the encoder vmapped over the clients (training/functional.py's StackedModule, stacked SGD,
per-client clipping); the other models' results in the JSON are kept.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from fedac.algorithms import build_algorithm
from fedac.algorithms.base import ClientData, Task
from fedac.config import load_config
from fedac.engine.execution import run_clients

MODELS = {
    "dscnn": [],
    "mhattrnn": [],
    "resnet15": [],
    "kwt": ["train.optimizer=adamw", "train.lr=0.001"],
    "cnn3_relu": [],
}
FEATURES, FRAMES, CLASSES, SAMPLES = 40, 101, 12, 64


def clients(count: int) -> list[ClientData]:
    g = torch.Generator().manual_seed(0)
    return [
        ClientData(
            f"c{i}",
            torch.randn(SAMPLES, FEATURES, FRAMES, generator=g),
            torch.randint(0, CLASSES, (SAMPLES,), generator=g),
            torch.zeros(0, FEATURES, FRAMES),
            torch.zeros(0, dtype=torch.long),
        )
        for i in range(count)
    ]


def algorithm(model: str, execution: str, steps: int, datas: list[ClientData]):
    counts = [torch.bincount(d.y, minlength=CLASSES).tolist() for d in datas]
    cfg = load_config(
        overrides=[
            "algorithm=fedkwsui",
            f"model.name={model}",
            "train.batch_size=32",
            "runtime.device=cpu",
            "train.max_grad_norm=50",
            "train.lr=0.1",
            "train.momentum=0.9",
            "runtime.cohort_workers=1",
            f"fedkwsui.local_steps={steps}",
            f"runtime.execution={execution}",
            *MODELS[model],
        ]
    )
    return build_algorithm(cfg, Task(FEATURES, CLASSES, [d.name for d in datas], counts))


def timed(algo, datas):
    payload = algo.broadcast(algo.init_server())
    states = [algo.init_client_state(d.name) for d in datas]
    wall, cpu = time.perf_counter(), time.process_time()
    results = run_clients(algo, payload, states, datas, 1, 0)
    return time.perf_counter() - wall, time.process_time() - cpu, results


class _FullFrames(torch.nn.Module):
    """An SSL model on (batch, frames, conv) tensors of full-length clips (its inputs are `Padded`
    batches)."""

    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, x):
        from fedac.data.waveform import Padded

        return self.m(
            Padded(x, torch.full((x.shape[0],), x.shape[1], dtype=torch.long, device=x.device))
        )


def ssl_part(size: str, count: int, steps: int, repeats: int, batch: int = 8) -> dict:
    """Stacked / sequential CPU time of `steps` local steps of `count` clients of the early-exit SSL
    encoder."""
    import torch.nn.functional as F

    from fedac.models.ssl import build_ssl_model
    from fedac.models.ssl_sizes import SIZES
    from fedac.training.functional import (
        StackedModule,
        clip_stacked,
        param_leaves,
        stacked_optimizer,
        with_buffers,
    )
    from fedac.training.local import make_optimizer
    from fedac.training.stacking import broadcast_params, grads_of

    cfg = load_config(overrides=["train.max_grad_norm=50"]).train
    model = _FullFrames(
        build_ssl_model(size, "classification", CLASSES, "random", dropout=0.0)
    ).train()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(count, steps, batch, 49, SIZES[size].conv, generator=g)
    y = torch.randint(0, CLASSES, (count, steps, batch), generator=g)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    forward = StackedModule(model)

    def sequential():
        out = []
        for k in range(count):
            model.load_state_dict(start)
            opt = make_optimizer(model.parameters(), cfg)
            for s in range(steps):
                opt.zero_grad()
                F.cross_entropy(model(x[k, s]), y[k, s]).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                opt.step()
            out.append({n: p.detach().clone() for n, p in model.named_parameters()})
        return out

    def stacked():
        params = broadcast_params(start, count)
        opt = stacked_optimizer({n: params[n] for n in forward.param_names}, cfg)
        for s in range(steps):
            leaf = param_leaves(params, count, forward.param_names)
            logits = forward(with_buffers(leaf, params, count, forward.buffer_names), x[:, s])
            loss = (
                F.cross_entropy(logits.flatten(0, 1), y[:, s].flatten(), reduction="none")
                .view(count, batch)
                .mean(1)
            )
            grads = grads_of(loss.sum(), leaf)
            clip_stacked(grads, cfg.max_grad_norm)
            opt.step(grads, count)
        return params

    times = {"stacked": [], "sequential": []}
    for r in range(repeats + 1):
        for name, fn in (("stacked", stacked), ("sequential", sequential)):
            started = time.process_time()
            result = fn()
            if r:  # the first call warms up
                times[name].append(time.process_time() - started)
            if name == "stacked":
                stacked_params = result
            else:
                alone = result
    row = {name: {"cpu_s": statistics.median(ts)} for name, ts in times.items()}
    row["ratio_cpu"] = row["stacked"]["cpu_s"] / row["sequential"]["cpu_s"]
    row["max_abs_diff"] = max(
        float((alone[k][n] - stacked_params[n][k]).abs().max())
        for k in range(count)
        for n in forward.param_names
    )
    return {
        "size": size,
        "clients": count,
        "steps": steps,
        "batch_size": batch,
        "frames": 49,
        "threads": 1,
        "parameters": sum(p.numel() for p in model.parameters()),
        **row,
    }


def _cpu() -> str:
    from fedac.engine.execution import _cpu_model

    return f"{_cpu_model()}, {torch.backends.cpu.get_cpu_capability()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5, help="FedKWS-UI's E (fedkwsui.local_steps)")
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument(
        "--vmap", action="store_true", help="the KWS networks through vmap (the form before)"
    )
    parser.add_argument(
        "--out", default=str(Path(__file__).parent / "results" / "stacked_models.json")
    )
    parser.add_argument(
        "--ssl", metavar="SIZE", help="measure the early-exit SSL encoder of this size instead"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.vmap:
        import fedac.models.kws_stacked as forms

        forms.stacked_kws = lambda model: None
    if args.ssl:
        out = Path(args.out)
        report = json.loads(out.read_text()) if out.exists() else {}
        count, steps, repeats = (2, 1, 1) if args.quick else (args.clients, 2, args.repeats)
        report["ssl"] = row = ssl_part(args.ssl, count, steps, repeats)
        print(
            f"{args.ssl}: stacked {row['stacked']['cpu_s']:.2f} s cpu, sequential "
            f"{row['sequential']['cpu_s']:.2f} s cpu: ratio {row['ratio_cpu']:.2f}; max |diff| "
            f"{row['max_abs_diff']:.1e}",
            flush=True,
        )
        out.write_text(json.dumps(report, indent=2))
        return
    count, steps, repeats = (4, 2, 1) if args.quick else (args.clients, args.steps, args.repeats)
    datas = clients(count)
    report = {
        "clients": count,
        "global_steps": steps,
        "batch_size": 32,
        "threads": args.threads,
        "stacked_form": "vmap" if args.vmap else "hand-written (models/kws_stacked.py)",
        "cpu": _cpu(),
        "models": {},
    }
    for model in args.models:
        paths = {
            "stacked": algorithm(model, "cohort", steps, datas),
            "sequential": algorithm(model, "sequential", steps, datas),
        }
        times = {name: [] for name in paths}
        last = {}
        for r in range(repeats + 1):
            for name, algo in paths.items():
                wall, cpu, last[name] = timed(algo, datas)
                if r:  # the first call warms up (shape records, allocations)
                    times[name].append((wall, cpu))
        row = {
            name: {
                "wall_s": statistics.median(t[0] for t in ts),
                "cpu_s": statistics.median(t[1] for t in ts),
            }
            for name, ts in times.items()
        }
        row["ratio_wall"] = row["stacked"]["wall_s"] / row["sequential"]["wall_s"]
        row["ratio_cpu"] = row["stacked"]["cpu_s"] / row["sequential"]["cpu_s"]
        row["max_abs_diff"] = max(
            float((a.upload[n].float() - b.upload[n].float()).abs().max())
            for a, b in zip(last["stacked"], last["sequential"])
            for n in a.upload
        )
        report["models"][model] = row
        print(
            f"{model:10s} stacked {row['stacked']['cpu_s']:.2f} s cpu, sequential "
            f"{row['sequential']['cpu_s']:.2f} s cpu: ratio {row['ratio_cpu']:.2f} (wall "
            f"{row['ratio_wall']:.2f}); max |diff| {row['max_abs_diff']:.1e}",
            flush=True,
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
