"""bench_gpu.py's sizes and how it times one path on a device: the device's matmul peaks and
description, one path's warm-up and timed rounds (`measure`), FLOPs per sample, the fedac and plain
paths, and `run_paths`, which times a workload's paths in turn and saves the report after each.
benchmarks/bench_gpu.py's docstring has the method."""

from __future__ import annotations

import gc
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode, conv_flop_count

from fedac.engine.simulator import Simulator, sample_cohort
from workloads import BASE_SETTINGS, GSC_CLIENTS, SupervisedFloor

NO_EVAL = ["train.eval_every=1000000", "train.checkpoint_every=1000000"]
#: workload W's schedule without its one-thread pinning: the fedac paths run with fedac's own
#: defaults.
SCHEDULE = [
    s for s in BASE_SETTINGS if not s.startswith(("train.threads=", "train.cohort_workers="))
]
WARMUP_ROUND = 10_000
"""Warm-up rounds are numbered from here (other clients than the timed rounds' 1, 2, ...)."""


# --- sizes: full / quick on a GPU / quick on the CPU ----------------------------------------------

SCALES = {  # name: (full, quick on a GPU, quick on the CPU)
    "rounds": (5, 2, 1),  # timed rounds of the device paths (after `warmup`)
    "warmup": (1, 1, 1),
    "cpu_rounds": (2, 1, 1),  # timed rounds of fedac_cpu
    "paper_fraction": (0.2, 0.2, 0.025),  # 48 of 240 clients a round (quick CPU: 6)
    "gsc_clients": (GSC_CLIENTS, GSC_CLIENTS, 50),
    "kws_clients": (200, 200, 4),  # half of them a round
    "kws_cpu_per_round": (10, 2, 0),  # fedac_cpu's clients a round (0: no fedac_cpu path)
    "kws_steps": (10, 5, 1),
    "kws_batch": (32, 32, 8),  # FedKWS-UI's 32 (quick CPU: 8, ResNet15 takes 6 GFLOP a sample)
    "ssl_size": ("w2v2_base", "w2v2_base", "w2v2_tiny"),
    "ssl_clients": (20, 8, 4),  # half of them a round, 16 clips each
    "ssl_cpu_per_round": (2, 1, 0),
    "di_steps": (1500, 100, 5),
    "gru_clients": (524, 524, 8),  # a GSC round's cohort, packed into one chunk (quick CPU: 8)
}


def scale(args, name: str):
    full, quick_gpu, quick_cpu = SCALES[name]
    return full if not args.quick else quick_gpu if args.device.type == "cuda" else quick_cpu


# --- the device -----------------------------------------------------------------------------------


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peaks(device: torch.device, quick: bool) -> dict[str, float]:
    """TFLOP/s of one large square matmul per arithmetic, best of 3 timings of as many products as
    fill 0.2 s: this device's practical peak. tf32 and fp16 on CUDA only (a CPU has no tf32, and its
    fp16 matmul is no arithmetic anyone trains in)."""
    n = (8192 if not quick else 4096) if device.type == "cuda" else (1024 if quick else 2048)
    kinds = {
        "fp32": torch.float32,
        "tf32": torch.float32,
        "bf16": torch.bfloat16,
        "fp16": torch.float16,
    }
    if device.type != "cuda":
        kinds = {k: v for k, v in kinds.items() if k in ("fp32", "bf16")}
    before = torch.get_float32_matmul_precision()
    out = {}
    try:
        for name, dtype in kinds.items():
            torch.set_float32_matmul_precision("high" if name == "tf32" else "highest")
            a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
            a @ b
            sync(device)
            calls, start = 0, time.perf_counter()
            while time.perf_counter() - start < 0.05:
                a @ b
                calls += 1
                sync(device)
            calls = max(1, int(calls * 4))
            best = float("inf")
            for _ in range(3):
                sync(device)
                start = time.perf_counter()
                for _ in range(calls):
                    a @ b
                sync(device)
                best = min(best, (time.perf_counter() - start) / calls)
            out[name] = 2 * n**3 / best / 1e12
            del a, b
    finally:
        torch.set_float32_matmul_precision(before)
    out["matrix_size"] = n
    return out


def machine(device: torch.device) -> dict:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in open("/proc/cpuinfo")
            if line.startswith("model name")
        ),
        "?",
    )
    out = {
        "device": str(device),
        "card": torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU: {cpu}",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "python": platform.python_version(),
        "cpu": cpu,
        "cpus": len(os.sched_getaffinity(0)),
        "host": platform.node(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        out.update(
            {
                "gpu_memory_gb": props.total_memory / 1e9,
                "multiprocessors": props.multi_processor_count,
                "capability": f"{props.major}.{props.minor}",
            }
        )
    return out


# --- timing one path ------------------------------------------------------------------------------


def release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measure(
    build,
    rounds: list[int],
    warmup: int,
    device: torch.device,
    flop_per_sample: float | None,
    peak: float | None,
) -> dict:
    """Build a path (`build() -> (run(round), samples(round))`), run `warmup` untimed rounds, then
    time `rounds`; the path is freed afterwards. A failure is recorded, not raised (the other paths
    still run)."""
    try:
        run, samples = build()
        for r in range(warmup):
            run(WARMUP_ROUND + r)
        sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            resident = torch.cuda.memory_allocated(device)
        seconds, counts = [], []
        for r in rounds:
            sync(device)
            start = time.perf_counter()
            run(r)
            sync(device)
            seconds.append(time.perf_counter() - start)
            counts.append(samples(r))
        out: dict = {
            "rounds": len(rounds),
            "s_per_round": statistics.median(seconds),
            "s_all": [round(s, 5) for s in seconds],
            "samples_per_round": statistics.mean(counts),
            "samples_per_s": sum(counts) / sum(seconds),
        }
        if flop_per_sample:
            out["tflop_per_s"] = out["samples_per_s"] * flop_per_sample / 1e12
            out["of_peak"] = out["tflop_per_s"] / peak if peak else None
        # a fedac path: its chunking and where its clients live
        out.update(getattr(run, "layout", dict)())
        out["peak_gpu_mb"] = (
            torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
        )
        out["resident_gpu_mb_before"] = resident / 2**20 if device.type == "cuda" else None
    except Exception:  # noqa: BLE001 - a benchmark reports a broken path and goes on
        out = {"error": traceback.format_exc()[-4000:]}
        print(out["error"], file=sys.stderr, flush=True)
    finally:
        run = samples = None  # noqa: F841 - drop the path's models and data before the next one
        release(device)
    return out


def conv_backward_flop(
    grad_out_shape,
    x_shape,
    w_shape,
    _bias,
    _stride,
    _padding,
    _dilation,
    transposed,
    _output_padding,
    _groups,
    output_mask,
    out_shape=None,
    **kwargs,
) -> int:
    """torch's own formula ignores `groups` (it counts a depthwise convolution's backward `groups`
    times over): each gradient asked for (input, weight) costs what the forward convolution does."""
    forward = conv_flop_count(list(x_shape), list(w_shape), list(grad_out_shape), transposed)
    return forward * (int(output_mask[0]) + int(output_mask[1]))


def flop_counter() -> FlopCounterMode:
    return FlopCounterMode(
        display=False, custom_mapping={torch.ops.aten.convolution_backward: conv_backward_flop}
    )


def step_flops(floor, x: torch.Tensor, y: torch.Tensor) -> float:
    """FLOPs per sample of one training step of `floor` (built on the CPU) on the batch (x, y)."""
    name = next(iter(floor.clients))
    optimizers = floor.start(name)
    with flop_counter() as counter:
        floor.step(x, y, optimizers)
    return counter.get_total_flops() / len(y)


def local_samples(n: int, batch: int, steps: int) -> int:
    """Samples of one client's local update: one epoch (steps=0) or `steps` cycling batches
    (workloads. plain_batches: an epoch's batches are full but its last one, which `steps % batches`
    never reaches)."""
    if steps <= 0 or n == 0:
        return n
    epochs, rest = divmod(steps, -(-n // batch))
    return epochs * n + rest * batch


def fedac_path(cfg, make_data, run_dir: Path, resident: bool = False):
    """`Simulator.run_round` of `cfg` on `make_data()`; `resident`: every client's state built up
    front."""

    def build():
        sim = Simulator(cfg, run_dir, make_data(), progress=False)
        state = sim._fresh_state()
        if resident:
            for name in sim.trainable:
                sim._client_state(state, name)
        sizes = {c.name: c.num_samples for c in sim.data.clients}
        t = cfg.train
        counts = {
            n: local_samples(s, t.batch_size, t.local_steps)
            * (1 if t.local_steps else t.local_epochs)
            for n, s in sizes.items()
        }

        def samples(r: int) -> int:
            return sum(counts[n] for n in sample_cohort(sim.trainable, t.fraction, cfg.seed, r))

        def run(r: int) -> None:
            sim.run_round(state, r)

        def layout() -> dict:  # what auto chose: training/packing.py
            packing = sim.algorithm.packing
            # the path that trained (auto's probe may choose sequential: chunk sizes are then the
            # probe's)
            return {
                "execution": sim.plan.path,
                "execution_probe": dict(sim.plan.measured),
                "chunk_sizes_last_round": packing.last_sizes if packing.by_memory else None,
                "mb_per_client_in_a_chunk": {
                    k: v / 2**20 for k, v in packing.bytes_per_client.items()
                },
                "clients_live_on": str(sim.client_home),
                "gru_kernel": cfg.train.gru_kernel,
            }

        run.layout = layout
        return run, samples

    return build


def floor_path(make_floor):
    def build():
        floor = make_floor()
        return floor, (lambda r: floor.samples)

    return build


def cohort(cfg, names: list[str]):
    """The clients fedac samples in round r (`engine.simulator.sample_cohort`), for the plain
    loop."""
    return lambda r: sample_cohort(names, cfg.train.fraction, cfg.seed, r)


def supervised_floor(cfg, clients: list, model: torch.nn.Module, names: list[str], device):
    """workloads.SupervisedFloor training `model` with `cfg.train`'s local settings (lr, batch,
    steps, optimizer, momentum, weight decay, clipping) on the clients fedac samples each round: the
    plain loop of a FedAvg-style workload (kws, w2v2)."""
    t = cfg.train
    return SupervisedFloor(
        clients,
        model=model,
        lr=t.lr,
        device=device,
        pick=cohort(cfg, names),
        batch=t.batch_size,
        steps=t.local_steps,
        optimizer=t.optimizer,
        momentum=t.momentum,
        weight_decay=t.weight_decay,
        max_grad_norm=t.max_grad_norm,
    )


def run_paths(
    args,
    paths: dict,
    flop_per_sample: float | None,
    cpu_rounds: int | None = None,
    into: dict | None = None,
) -> dict:
    """Each path of `paths` (name: build) in turn; fedac_cpu on the CPU's rounds. Adds vs_plain
    ratios. Results go into `into` (the report's node of the workload, when given) and the report is
    saved after every path, so a run stopped by a time limit keeps every path it measured."""
    rounds = list(range(1, scale(args, "rounds") + 1))
    out = {} if into is None else into
    for name, build in paths.items():
        if args.paths and name not in args.paths:
            continue
        on_cpu = name == "fedac_cpu"
        device = torch.device("cpu") if on_cpu else args.device
        peak = args.peaks_cpu.get("fp32") if on_cpu else args.peaks.get(args.precision)
        use = rounds[: cpu_rounds or scale(args, "cpu_rounds")] if on_cpu else rounds
        print(f"    {name} ...", flush=True)
        out[name] = measure(build, use, scale(args, "warmup"), device, flop_per_sample, peak)
        # since bench_gpu.py's main() began
        out[name]["measured_after_s"] = time.perf_counter() - args.started
        against_plain(out)
        args.save()
    return out


def run_cohort_paths(args, cfg, names: list[str], paths: dict, flop_per_sample: float) -> dict:
    """A workload of one cohort a round (paper, gsc): its node (the clients, how many a round,
    FLOPs per sample) joins the report, then its paths are timed into it (`run_paths`)."""
    out = args.live(
        {
            "clients": len(names),
            "per_round": len(cohort(cfg, names)(1)),
            "flop_per_sample": flop_per_sample,
            "paths": {},
        }
    )
    run_paths(args, paths, flop_per_sample, into=out["paths"])
    return out


def against_plain(out: dict) -> None:
    """Each measured path's samples/s against the plain loop's, and its speed-up where the work is
    the same."""
    plain = out.get("plain", {})
    for name, result in out.items():
        if "s_per_round" in plain and "s_per_round" in result and name != "plain":
            result["samples_per_s_vs_plain"] = result["samples_per_s"] / plain["samples_per_s"]
            # the same clients: the same work
            if result["samples_per_round"] == plain["samples_per_round"]:
                result["speedup_vs_plain"] = plain["s_per_round"] / result["s_per_round"]


def device_settings(args) -> list[str]:
    return [f"train.device={args.device_setting}", f"train.precision={args.precision}"]


def with_cpu(args, paths: dict, cpu_path) -> dict:
    """`paths` and, unless the device is the CPU (then fedac is the CPU default), fedac_cpu =
    `cpu_path()`."""
    if args.device.type != "cpu" and cpu_path is not None:
        paths["fedac_cpu"] = cpu_path()
    return paths
