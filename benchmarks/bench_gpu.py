"""fedac on a GPU against the loop a user would write and against fedac's CPU default (issue 45, items 7-8).

    .venv/bin/python benchmarks/bench_gpu.py --device cuda                 # every workload at full scale
    .venv/bin/python benchmarks/bench_gpu.py --device cuda --quick         # fewer rounds: <= 3 min on one H100
    .venv/bin/python benchmarks/bench_gpu.py --device cpu --quick          # the harness on a CPU (~2 min, small)
    .venv/bin/python benchmarks/bench_gpu.py --device cuda --only gsc,kws  # some workloads
    .venv/bin/python benchmarks/bench_gpu.py --device cuda --only gsc --paths fedac,plain  # some paths

benchmarks/gpu/check.sh runs the quick form on a lent GPU machine, the GSC workload first. JSON goes to
$OUT/bench_gpu.json when OUT is set, else benchmarks/results/bench_gpu.json (or --out), rewritten after every
path (so a run stopped by a time limit keeps every path it measured; `running` names the workload under way);
a table is printed last. `--summary FILE` keeps the GSC round's one-line summary (fedac and plain s/round,
their ratio, the targets) in FILE from the moment fedac's round is measured.

Workloads (--only NAME, comma-separated):
- paper: bench_paper.py's workload, configs/paper.yaml on the embedded Speech Commands stand-in (240 clients,
  48 a round, CRNN-Base personalized models, CRNN-Lite Plug-in, 1 epoch of batch 16).
- gsc: bench_cohort.py's GSC scale (2,618 clients of 20-60 random 40 x 101 windows, 524 a round, FedMLAC as
  above, every personalized model resident from the start); fedac and plain are timed first, then the
  variants below.
- gru: the stacked GRU's recurrence alone (issue 45, item 2): one direction of CRNN-Base's GRU, forward and
  backward, for a GSC round's 524 clients in one chunk (batch 16, 25 frames), each way a GPU can run it:
  fedac's pure-torch recurrence, the Triton kernel, the torch recurrence replayed from a CUDA graph, and
  (plain) one cuDNN GRU call per client; `fastest` names the winner.
- kws: FedAvg on each KWS network (dscnn, mhattrnn, resnet15, kwt) with FedKWS-UI's local settings
  (experiments/fedkws.py KWS_PROTOCOL: batch 32, clipping at 50; KWT with AdamW) for `kws steps` local steps, 100 of 200
  clients a round (random 40 x 101 windows, 12 classes).
- w2v2: early-exit fine-tuning (algorithms/earlyexit.py) of a w2v2_base encoder built from its size with random
  weights (nothing downloaded), every client at exit 3, 6, 9, then 12 (`earlyexit.mode=homo`), on clips of
  1 s held as the frozen CNN's frames (49 x 512, as engine/waveform.py caches them).
- impressions: zero-shot data-impression synthesis (Eq. 3) of round 4's reports of the homogeneous scenario
  (bench_impressions.py's capture), timed per new class.

Paths of every workload, one after another in this process (each built, timed, then freed, so each one's
peak GPU memory is its own plus what the process holds between paths):
- fedac: `Simulator.run_round` (sampling, training, aggregation, bookkeeping) with `train.device=<--device>`;
- plain: the sequential loop a user would write on the same device (workloads.Floor: one client after
  another, the model zoo's nn.Modules with their cuDNN layers (nn.Conv1d, nn.GRU, ...), no fedac code in the
  loop; for w2v2 a Hugging Face Wav2Vec2Model's projection and encoder with a stats-pool head at exit 12);
  the same clients each round and the same samples;
- fedac_chunk16 (gsc, on CUDA): fedac with `train.cohort_chunk=16`, the CPU's chunk, against auto's chunks
  packed from free GPU memory (training/packing.py): whether packing pays;
- fedac_gru_torch (gsc, on CUDA): fedac with `train.gru_kernel=torch`, the pure-torch recurrence, against
  auto's Triton kernel (kernels/gru_triton.py): whether the kernel pays;
- fedac_cpu: fedac with `train.device=cpu` (its CPU default: fused kernel, cohort workers per core), on fewer
  rounds and, where a round is long on a CPU, fewer clients (its samples/s is the figure to compare); left
  out when --device is cpu (it is the fedac path then).
Each fedac path also records what auto chose: the last round's chunk sizes and the measured memory per
client of a chunk (training/packing.py), where the clients' data and models live (train.client_memory)
and train.gru_kernel.
Timing: torch.cuda.synchronize() before and after every timed round on CUDA; median seconds of the timed
rounds after `warmup` untimed ones. Peak GPU memory: torch.cuda.max_memory_allocated over the timed rounds
(reset after the warm-up); null on the CPU. TFLOP/s: useful FLOPs (torch's FlopCounterMode over one training
step of the plain loop's networks, per sample: matmuls, convolutions, the GRU's products, attention) x the
round's samples / seconds; no padding counted. `of_peak`: that rate against this device's measured matmul
peak in the run's arithmetic (--precision, which sets the fedac paths' train.precision; the plain loop and
fedac_cpu stay fp32; one large product each of fp32, tf32, bf16 and fp16 is timed, on CUDA).

Targets (issue 45) are checked at any scale and say whether the run was at the scale they are set for
(`at_target_scale`); only a GPU run at that scale decides them:
GSC round <= 0.3 s and >= 10x faster than the plain loop; paper schedule <= 0.06 s/round; each KWS network
>= 5x faster than the plain loop; w2v2 exit 12 within 1.2x of the plain Hugging Face loop.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, conv_flop_count

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_paper import SETTINGS as PAPER_SETTINGS  # noqa: E402
from workloads import (BASE_SETTINGS, FEATURES, FEDMLAC_SETTINGS, FRAMES, GSC_CLIENTS, MutualFloor,  # noqa: E402
                       SupervisedFloor, capture_reports, federated, gsc_scale_clients)

from fedac.algorithms.base import ClientData, Task  # noqa: E402
from fedac.config import load_config  # noqa: E402
from fedac.data.waveform import Padded  # noqa: E402
from fedac.engine.data import FederatedData, build_federated_data  # noqa: E402
from fedac.engine.simulator import Simulator, sample_cohort  # noqa: E402
from fedac.models import build_model  # noqa: E402
from fedac.models.crnn import CRNN_SPECS  # noqa: E402
from fedac.experiments.fedkws import KWS_NETWORKS, KWS_PROTOCOL  # noqa: E402

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
WORKLOADS = ("paper", "gsc", "gru", "kws", "w2v2", "impressions")
PATHS = ("fedac", "plain", "fedac_chunk16", "fedac_gru_torch", "fedac_cpu", "torch", "triton", "torch_graph")
"""Every path name a workload may time (--paths picks some)."""
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
NO_EVAL = ["train.eval_every=1000000", "train.checkpoint_every=1000000"]
#: workload W's schedule without its one-thread pinning: the fedac paths run with fedac's own defaults.
SCHEDULE = [s for s in BASE_SETTINGS if not s.startswith(("train.threads=", "train.cohort_workers="))]
WARMUP_ROUND = 10_000
"""Warm-up rounds are numbered from here (other clients than the timed rounds' 1, 2, ...)."""


# --- sizes: full / quick on a GPU / quick on the CPU ----------------------------------------------------------

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
SSL_CLIPS, SSL_FRAMES, SSL_CLASSES = 16, 49, 35


def scale(args, name: str):
    full, quick_gpu, quick_cpu = SCALES[name]
    return full if not args.quick else quick_gpu if args.device.type == "cuda" else quick_cpu


# --- the device -------------------------------------------------------------------------------------------

def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peaks(device: torch.device, quick: bool) -> dict[str, float]:
    """TFLOP/s of one large square matmul per arithmetic, best of 3 timings of as many products as fill
    0.2 s: this device's practical peak. tf32 and fp16 on CUDA only (a CPU has no tf32, and its fp16
    matmul is no arithmetic anyone trains in)."""
    n = (8192 if not quick else 4096) if device.type == "cuda" else (1024 if quick else 2048)
    kinds = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
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
            out[name] = 2 * n ** 3 / best / 1e12
            del a, b
    finally:
        torch.set_float32_matmul_precision(before)
    out["matrix_size"] = n
    return out


def machine(device: torch.device) -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    out = {"device": str(device), "card": torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU: {cpu}",
           "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
           "python": platform.python_version(), "cpu": cpu, "cpus": len(os.sched_getaffinity(0)),
           "host": platform.node()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        out.update({"gpu_memory_gb": props.total_memory / 1e9, "multiprocessors": props.multi_processor_count,
                    "capability": f"{props.major}.{props.minor}"})
    return out


# --- timing one path ----------------------------------------------------------------------------------------

def release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measure(build, rounds: list[int], warmup: int, device: torch.device, flop_per_sample: float | None,
            peak: float | None) -> dict:
    """Build a path (`build() -> (run(round), samples(round))`), run `warmup` untimed rounds, then time
    `rounds`; the path is freed afterwards. A failure is recorded, not raised (the other paths still run)."""
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
        out: dict = {"rounds": len(rounds), "s_per_round": statistics.median(seconds),
                     "s_all": [round(s, 5) for s in seconds], "samples_per_round": statistics.mean(counts),
                     "samples_per_s": sum(counts) / sum(seconds)}
        if flop_per_sample:
            out["tflop_per_s"] = out["samples_per_s"] * flop_per_sample / 1e12
            out["of_peak"] = out["tflop_per_s"] / peak if peak else None
        out.update(getattr(run, "layout", dict)())  # a fedac path: its chunking and where its clients live
        out["peak_gpu_mb"] = torch.cuda.max_memory_allocated(device) / 2 ** 20 if device.type == "cuda" else None
        out["resident_gpu_mb_before"] = resident / 2 ** 20 if device.type == "cuda" else None
    except Exception:  # noqa: BLE001 - a benchmark reports a broken path and goes on
        out = {"error": traceback.format_exc()[-4000:]}
        print(out["error"], file=sys.stderr, flush=True)
    finally:
        run = samples = None  # noqa: F841 - drop the path's models and data before the next one
        release(device)
    return out


def conv_backward_flop(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                       _output_padding, _groups, output_mask, out_shape=None, **kwargs) -> int:
    """torch's own formula ignores `groups` (it counts a depthwise convolution's backward `groups` times
    over): each gradient asked for (input, weight) costs what the forward convolution does."""
    forward = conv_flop_count(list(x_shape), list(w_shape), list(grad_out_shape), transposed)
    return forward * (int(output_mask[0]) + int(output_mask[1]))


def flop_counter() -> FlopCounterMode:
    return FlopCounterMode(display=False, custom_mapping={torch.ops.aten.convolution_backward: conv_backward_flop})


def step_flops(floor, x: torch.Tensor, y: torch.Tensor) -> float:
    """FLOPs per sample of one training step of `floor` (built on the CPU) on the batch (x, y)."""
    name = next(iter(floor.clients))
    optimizers = floor.start(name)
    with flop_counter() as counter:
        floor.step(x, y, optimizers)
    return counter.get_total_flops() / len(y)


def local_samples(n: int, batch: int, steps: int) -> int:
    """Samples of one client's local update: one epoch (steps=0) or `steps` cycling batches (workloads.
    plain_batches: an epoch's batches are full but its last one, which `steps % batches` never reaches)."""
    if steps <= 0 or n == 0:
        return n
    epochs, rest = divmod(steps, -(-n // batch))
    return epochs * n + rest * batch


def fedac_path(cfg, make_data, run_dir: Path, resident: bool = False):
    """`Simulator.run_round` of `cfg` on `make_data()`; `resident`: every client's state built up front."""
    def build():
        sim = Simulator(cfg, run_dir, make_data(), progress=False)
        state = sim._fresh_state()
        if resident:
            for name in sim.trainable:
                sim._client_state(state, name)
        sizes = {c.name: c.num_samples for c in sim.data.clients}
        t = cfg.train
        counts = {n: local_samples(s, t.batch_size, t.local_steps) * (1 if t.local_steps else t.local_epochs)
                  for n, s in sizes.items()}

        def samples(r: int) -> int:
            return sum(counts[n] for n in sample_cohort(sim.trainable, t.fraction, cfg.seed, r))

        def run(r: int) -> None:
            sim.run_round(state, r)

        def layout() -> dict:  # what auto chose: training/packing.py
            packing = sim.algorithm.packing
            return {"chunk_sizes_last_round": packing.last_sizes if packing.by_memory else None,
                    "mb_per_client_in_a_chunk": {k: v / 2 ** 20 for k, v in packing.bytes_per_client.items()},
                    "clients_live_on": str(sim.client_home), "gru_kernel": cfg.train.gru_kernel}
        run.layout = layout
        return run, samples
    return build


def floor_path(make_floor):
    def build():
        floor = make_floor()
        return floor, (lambda r: floor.samples)
    return build


def cohort(cfg, names: list[str]):
    """The clients fedac samples in round r (`engine.simulator.sample_cohort`), for the plain loop."""
    return lambda r: sample_cohort(names, cfg.train.fraction, cfg.seed, r)


def run_paths(args, paths: dict, flop_per_sample: float | None, cpu_rounds: int | None = None,
              into: dict | None = None) -> dict:
    """Each path of `paths` (name: build) in turn; fedac_cpu on the CPU's rounds. Adds vs_plain ratios.
    Results go into `into` (the report's node of the workload, when given) and the report is saved after
    every path, so a run stopped by a time limit keeps every path it measured."""
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
        out[name]["measured_after_s"] = time.perf_counter() - args.started  # since bench_gpu.py's main() began
        against_plain(out)
        args.save()
    return out


def against_plain(out: dict) -> None:
    """Each measured path's samples/s against the plain loop's, and its speed-up where the work is the same."""
    plain = out.get("plain", {})
    for name, result in out.items():
        if "s_per_round" in plain and "s_per_round" in result and name != "plain":
            result["samples_per_s_vs_plain"] = result["samples_per_s"] / plain["samples_per_s"]
            if result["samples_per_round"] == plain["samples_per_round"]:  # the same clients: the same work
                result["speedup_vs_plain"] = plain["s_per_round"] / result["s_per_round"]


def device_settings(args) -> list[str]:
    return [f"train.device={args.device_setting}", f"train.precision={args.precision}"]


def with_cpu(args, paths: dict, cpu_path) -> dict:
    """`paths` and, unless the device is the CPU (then fedac is the CPU default), fedac_cpu = `cpu_path()`."""
    if args.device.type != "cpu" and cpu_path is not None:
        paths["fedac_cpu"] = cpu_path()
    return paths


# --- workloads ----------------------------------------------------------------------------------------------

def workload_paper(args, tmp: Path) -> dict:
    fraction = scale(args, "paper_fraction")
    overrides = [*PAPER_SETTINGS, f"train.fraction={fraction}"]
    cfg = load_config(REPO / "configs" / "paper.yaml", overrides=[*overrides, *device_settings(args)])
    cpu_cfg = lambda: load_config(REPO / "configs" / "paper.yaml", overrides=[*overrides, "train.device=cpu"])  # noqa: E731
    data = lambda: build_federated_data(cpu_cfg(), progress=False)  # noqa: E731 - on the CPU: each Simulator places it
    sample = data()
    names = [c.name for c in sample.clients if c.num_samples > 0]
    t = cfg.train

    def floor(device):
        return MutualFloor(sample.clients, device=device, pick=cohort(cfg, names), lr=t.lr, batch=t.batch_size,
                           classes=sample.task.num_classes)
    flops = step_flops(MutualFloor(sample.clients[:1], classes=sample.task.num_classes),
                       torch.randn(4, sample.task.num_features, sample.clients[0].x.shape[-1]), torch.zeros(4, dtype=torch.long))
    paths = with_cpu(args, {"fedac": fedac_path(cfg, data, tmp / "paper"),
                            "plain": floor_path(lambda: floor(args.device))},
                     lambda: fedac_path(cpu_cfg(), data, tmp / "paper-cpu"))
    out = args.live({"clients": len(names), "per_round": len(cohort(cfg, names)(1)), "flop_per_sample": flops,
                     "paths": {}})
    run_paths(args, paths, flops, into=out["paths"])
    return out


def workload_gsc(args, tmp: Path) -> dict:
    count = scale(args, "gsc_clients")
    data = lambda: federated(gsc_scale_clients(count))  # noqa: E731
    settings = [*SCHEDULE, *FEDMLAC_SETTINGS, *NO_EVAL]
    cfg = load_config(overrides=[*settings, *device_settings(args)])
    clients = gsc_scale_clients(count)
    names = [c.name for c in clients]
    flops = step_flops(MutualFloor(clients[:1]), torch.randn(4, FEATURES, FRAMES), torch.zeros(4, dtype=torch.long))
    # fedac and the plain loop first: their ratio is the number a lent machine's check waits for
    paths = {"fedac": fedac_path(cfg, data, tmp / "gsc", resident=True),
             "plain": floor_path(lambda: MutualFloor(clients, device=args.device, pick=cohort(cfg, names)))}
    if args.device.type == "cuda":  # packing's choice (auto: chunks from free memory) against the CPU's 16
        paths["fedac_chunk16"] = fedac_path(load_config(overrides=[*settings, *device_settings(args),
                                                                   "train.cohort_chunk=16"]), data, tmp / "gsc16",
                                            resident=True)
        # the stacked GRU's recurrence: the Triton kernel (auto's choice on a GPU) against the pure-torch loop
        paths["fedac_gru_torch"] = fedac_path(load_config(overrides=[*settings, *device_settings(args),
                                                                     "train.gru_kernel=torch"]), data, tmp / "gsc-gru",
                                              resident=True)
    paths = with_cpu(args, paths, lambda: fedac_path(load_config(overrides=[*settings, "train.device=cpu"]), data,
                                                     tmp / "gsc-cpu", resident=True))
    out = args.live({"clients": count, "per_round": len(cohort(cfg, names)(1)), "flop_per_sample": flops, "paths": {}})
    run_paths(args, paths, flops, into=out["paths"])
    return out


KWS_CLASSES = 12
KWS_TRAIN = [s for s in KWS_PROTOCOL if s.startswith("train.") and not s.startswith(
    ("train.rounds=", "train.eval_every=", "train.checkpoint_every=", "train.select=", "train.test_curve=",
     "train.local_steps=", "train.fraction="))]
"""FedKWS-UI's local training (batch 32, lr, weight decay, clipping at 50) without its schedule."""


def workload_kws(args, tmp: Path) -> dict:
    count, steps = scale(args, "kws_clients"), scale(args, "kws_steps")
    cpu_per_round = scale(args, "kws_cpu_per_round")
    data = lambda: federated(gsc_scale_clients(count, KWS_CLASSES), classes=KWS_CLASSES)  # noqa: E731
    clients = gsc_scale_clients(count, KWS_CLASSES)
    names = [c.name for c in clients]
    out: dict = args.live({"clients": count, "per_round": count // 2, "local_steps": steps, "networks": {}})
    for label, network in KWS_NETWORKS:
        print(f"  {label}", flush=True)
        base = ["algorithm=fedavg", *KWS_TRAIN, *network, f"train.local_steps={steps}",
                f"train.batch_size={scale(args, 'kws_batch')}", *NO_EVAL]
        cfg = load_config(overrides=[*base, "train.fraction=0.5", *device_settings(args)])
        cpu_cfg = lambda base=base: load_config(  # noqa: E731
            overrides=[*base, f"train.fraction={cpu_per_round / count}", "train.device=cpu"])
        t = cfg.train

        def floor(device, cfg=cfg, t=t):
            return SupervisedFloor(clients, model=build_model(cfg.model.name, FEATURES, KWS_CLASSES), lr=t.lr,
                                   device=device, pick=cohort(cfg, names), batch=t.batch_size, steps=t.local_steps,
                                   optimizer=t.optimizer, momentum=t.momentum, weight_decay=t.weight_decay,
                                   max_grad_norm=t.max_grad_norm)
        flops = step_flops(floor("cpu"), torch.randn(4, FEATURES, FRAMES), torch.zeros(4, dtype=torch.long))
        paths = with_cpu(args, {"fedac": fedac_path(cfg, data, tmp / f"kws-{label}"),
                                "plain": floor_path(lambda floor=floor: floor(args.device))},
                         (lambda cpu_cfg=cpu_cfg, label=label: fedac_path(cpu_cfg(), data, tmp / f"kws-{label}-cpu"))
                         if cpu_per_round else None)
        out["networks"][label] = {"model": cfg.model.name, "optimizer": t.optimizer, "flop_per_sample": flops,
                                  "paths": {}}
        run_paths(args, paths, flops, into=out["networks"][label]["paths"])
    return out


class HFExitClassifier(nn.Module):
    """The plain Hugging Face model at an exit: Wav2Vec2Model's feature projection and encoder with its
    layers cut at `depth`, on the frozen CNN's frames, [mean; std] pooling and a linear head."""

    def __init__(self, size: str, depth: int, classes: int):
        from transformers import Wav2Vec2Model

        from fedac.models.ssl import size_config  # the same sizes as fedac's (a transformers Wav2Vec2Config)

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
    """Each client's 16 clips of 1 s as CNN frames (49 x conv, float16 as the engine caches them)."""
    g = torch.Generator().manual_seed(0)
    return [torch.randn(SSL_CLIPS, SSL_FRAMES, conv, generator=g).to(torch.float16) for _ in range(count)]


def workload_w2v2(args, tmp: Path) -> dict:
    from fedac.ssl_sizes import SIZES

    size, count = scale(args, "ssl_size"), scale(args, "ssl_clients")
    cpu_per_round = scale(args, "ssl_cpu_per_round")
    conv = SIZES[size].conv
    frames = ssl_clients(count, conv)
    labels = [torch.randint(0, SSL_CLASSES, (SSL_CLIPS,), generator=torch.Generator().manual_seed(i)) for i in range(count)]
    lengths = torch.full((SSL_CLIPS,), SSL_FRAMES)
    names = [f"client{i:04d}" for i in range(count)]

    def data() -> FederatedData:
        clients = [ClientData(n, Padded(x, lengths.clone()), y, Padded.stack([], (conv,)), torch.zeros(0, dtype=torch.long))
                   for n, x, y in zip(names, frames, labels)]
        return FederatedData(Task(conv, SSL_CLASSES, names), None, clients, None, None)  # type: ignore[arg-type]

    plain_clients = [ClientData(n, x, y, x[:0], y[:0]) for n, x, y in zip(names, frames, labels)]
    base = ["algorithm=earlyexit", f"model.name={size}", "model.encoder_path=random", "earlyexit.mode=homo",
            "train.batch_size=8", "train.local_epochs=1", "train.local_steps=0", *NO_EVAL]
    out: dict = args.live({"size": size, "clients": count, "per_round": count // 2, "clips_per_client": SSL_CLIPS,
                           "frames_per_clip": SSL_FRAMES, "depths": {}})
    last = SIZES[size].layers
    for depth in (3, 6, 9, 12):
        print(f"  exit {depth}", flush=True)
        settings = [*base, f"earlyexit.depth={depth}"]
        cfg = load_config(overrides=[*settings, "train.fraction=0.5", *device_settings(args)])
        layer = max(1, round(depth * last / 12))
        t = cfg.train

        def floor(device, layer=layer, t=t, cfg=cfg):
            model = HFExitClassifier(size, layer, SSL_CLASSES)
            return SupervisedFloor(plain_clients, model=model, lr=t.lr, device=device, pick=cohort(cfg, names),
                                   batch=t.batch_size, optimizer=t.optimizer, momentum=t.momentum,
                                   weight_decay=t.weight_decay, max_grad_norm=t.max_grad_norm)
        flops = step_flops(floor("cpu"), frames[0][:2], labels[0][:2])
        paths = {"fedac": fedac_path(cfg, data, tmp / f"w2v2-{depth}")}
        if depth == 12:
            paths["plain"] = floor_path(lambda floor=floor: floor(args.device))
            cpu_cfg = lambda settings=settings: load_config(  # noqa: E731
                overrides=[*settings, f"train.fraction={cpu_per_round / count}", "train.device=cpu"])
            with_cpu(args, paths, (lambda: fedac_path(cpu_cfg(), data, tmp / "w2v2-cpu")) if cpu_per_round else None)
        node = out["depths"][str(depth)] = {"layer": layer, "flop_per_sample": flops, "paths": {}}
        result = run_paths(args, paths, flops, into=node["paths"])
        node["peak_gpu_mb"] = result["fedac"].get("peak_gpu_mb")
    return out


class ImpressionFloor:
    """Eq. 3 as a user writes it: per report, per new class, per batch of di_batch rows, Adam on the batch's
    mean soft-label cross-entropy of model(x) / tau, x re-z-scored after every step; one batch after another."""

    def __init__(self, reports, zs, count: int, shape: tuple[int, ...], features: int, device):
        self.zs, self.count, self.shape, self.device = zs, count, shape, device
        self.models = []
        for report in reports:
            model = build_model(report["arch"], features, report["num_known"] + len(report["local_ids"]))
            model.load_state_dict({k: v.cpu() for k, v in report["state"].items()})
            self.models.append((model.to(device).eval().requires_grad_(False), len(report["local_ids"])))
        self.samples = 0

    @staticmethod
    def zscore(x):
        return (x - x.mean(2, keepdim=True)) / (x.std(2, keepdim=True, unbiased=False) + 1e-5)

    def batch(self, model, rows: int) -> None:
        classes = model.head.out_features
        targets = torch.softmax(torch.randn(rows, classes, device=self.device), 1)
        x = self.zscore(torch.randn(rows, *self.shape, device=self.device)).requires_grad_()
        optimizer = torch.optim.Adam([x], lr=self.zs.di_lr)
        for _ in range(self.zs.di_steps):
            loss = -(targets * torch.log_softmax(model(x) / self.zs.di_tau, 1)).sum(1).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                x.copy_(self.zscore(x))

    def __call__(self, round_idx: int) -> None:
        self.samples = 0
        for model, new in self.models:
            for _ in range(new):
                for start in range(0, self.count, self.zs.di_batch):
                    rows = min(self.zs.di_batch, self.count - start)
                    self.batch(model, rows)
                    self.samples += rows * self.zs.di_steps


def workload_impressions(args, tmp: Path) -> dict:
    steps = scale(args, "di_steps")
    runner, reports = capture_reports("speech_commands", steps, tuple(device_settings(args)), str(tmp / "zs"))
    alg, zs = runner.algorithm, runner.cfg.zeroshot
    first = alg.synthesize_reports(reports, 4)
    count, classes = len(first[0][0][0]), sum(len(r["local_ids"]) for r in reports)
    shape = tuple(alg.public_x.shape[1:])
    per_class_samples = count * steps

    def fedac(runner, reports):
        return lambda: ((lambda r: runner.algorithm.synthesize_reports(reports, 4)), lambda r: classes * per_class_samples)

    def cpu_side():
        return fedac(*capture_reports("speech_commands", steps, ("train.device=cpu",), str(tmp / "zs-cpu")))
    probe = ImpressionFloor(reports[:1], zs, count, shape, alg.task.num_features, "cpu")
    model = probe.models[0][0].requires_grad_(False)
    x = torch.randn(2, *shape, requires_grad=True)
    with flop_counter() as counter:
        F.log_softmax(model(x), 1).sum().backward()
    flops = counter.get_total_flops() / 2  # per impression and step
    paths = with_cpu(args, {"fedac": fedac(runner, reports),
                            "plain": floor_path(lambda: ImpressionFloor(reports, zs, count, shape, alg.task.num_features,
                                                                        args.device))}, cpu_side)
    out = args.live({"reports": [(r["user"], r["arch"], len(r["local_ids"])) for r in reports], "classes": classes,
                     "impressions_per_class": count, "di_steps": steps, "di_batch": zs.di_batch, "flop_per_sample": flops,
                     "sample": "one impression for one Adam step", "paths": {}})
    for r in run_paths(args, paths, flops, cpu_rounds=1, into=out["paths"]).values():
        if "s_per_round" in r:  # a "round" synthesizes every class of the round's reports
            r["s_per_class"] = r["s_per_round"] / classes
    return out


def gru_case(args, clients: int):
    """One direction of CRNN-Base's GRU for a packed chunk at GSC scale: its input frames (K, T * B, C),
    stacked weights and an upstream gradient, on the run's device (frames after two poolings of 101)."""
    spec, b, t = CRNN_SPECS["crnn_base"], 16, FRAMES // 4
    c, hidden = spec.conv_channels[-1], spec.hidden
    gen = torch.Generator().manual_seed(0)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(args.device).requires_grad_()
    inputs = (rand(clients, t * b, c), rand(clients, 3 * hidden, c, scale=0.1), rand(clients, 3 * hidden, scale=0.1),
              rand(clients, 3 * hidden, hidden, scale=0.1), rand(clients, 3 * hidden, scale=0.1))
    return inputs, torch.randn(clients, t, b, hidden, generator=gen).to(args.device), t, b


def workload_gru(args, tmp: Path) -> dict:
    """The stacked GRU's recurrence, forward and backward of one layer direction for a packed chunk (a "round"
    is 5 of them), each way a GPU can run it (issue 45, item 2): fedac's pure-torch recurrence (`torch`), the
    Triton kernel (`triton`), the torch recurrence replayed from a CUDA graph (`torch_graph`), and `plain`:
    one cuDNN GRU call per client (torch.gru with that client's weights), what a per-client loop runs."""
    from fedac import kernels
    from fedac.models.stacked import _GRULayer

    clients = scale(args, "gru_clients")
    reps = 5

    def layer_path(mode: str):
        def build():
            kernels.set_gru_kernel(mode)
            inputs, grad, t, _ = gru_case(args, clients)

            def once() -> None:
                out = _GRULayer.apply(*inputs, t, False)
                torch.autograd.grad(out, inputs, grad)
            return (lambda r: [once() for _ in range(reps)]), (lambda r: clients * reps)
        return build

    def graph_path():
        kernels.set_gru_kernel("torch")
        inputs, grad, t, _ = gru_case(args, clients)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up outside the graph, as capture requires
            for _ in range(2):
                torch.autograd.grad(_GRULayer.apply(*inputs, t, False), inputs, grad)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_grads = torch.autograd.grad(_GRULayer.apply(*inputs, t, False), inputs, grad)  # noqa: F841
        return (lambda r: [graph.replay() for _ in range(reps)]), (lambda r: clients * reps)

    def plain_path():
        inputs, grad, t, b = gru_case(args, clients)
        frames, w_ih, b_ih, w_hh, b_hh = inputs
        x = frames.detach().view(clients, t, b, -1).transpose(1, 2).contiguous().requires_grad_()  # (K, B, T, C)
        weights = [w_ih, w_hh, b_ih, b_hh]
        grads = grad.transpose(1, 2).contiguous()

        def once() -> None:
            outs = [torch.gru(x[k], x.new_zeros(1, b, w_hh.shape[2]), [w[k] for w in weights], True, 1, 0.0, True,
                              False, True)[0] for k in range(clients)]
            torch.autograd.grad(outs, [x, *weights], list(grads.unbind(0)))
        return (lambda r: [once() for _ in range(reps)]), (lambda r: clients * reps)

    paths = {"torch": layer_path("torch")}
    if args.device.type == "cuda":
        paths["triton"] = layer_path("triton")
        paths["torch_graph"] = graph_path
    paths["plain"] = plain_path
    out = args.live({"clients": clients, "shape": dict(zip(("K", "T", "B", "C", "H"),
                                                           (clients, FRAMES // 4, 16, CRNN_SPECS["crnn_base"].conv_channels[-1],
                                                            CRNN_SPECS["crnn_base"].hidden))),
                     "sample": "one client's forward and backward of the layer", "paths": {}})
    try:
        run_paths(args, paths, None, into=out["paths"])
    finally:
        kernels.set_gru_kernel("auto")
    timed = {name: r["s_per_round"] / reps for name, r in out["paths"].items() if "s_per_round" in r}
    out.update({"s_per_layer": timed, "fastest": min(timed, key=timed.get) if timed else None})
    return out


RUNS = {"paper": workload_paper, "gsc": workload_gsc, "kws": workload_kws, "w2v2": workload_w2v2,
        "impressions": workload_impressions, "gru": workload_gru}


# --- targets and the table ------------------------------------------------------------------------------------

def target(name: str, rule: str, measured, passed, at_scale: bool, gpu: bool) -> dict:
    return {"target": name, "rule": rule, "measured": measured, "pass": passed, "at_target_scale": at_scale,
            "on_gpu": gpu, "decides": at_scale and gpu}


def targets(report: dict, args) -> list[dict]:
    gpu, w = args.device.type == "cuda", report["workloads"]
    out = []

    def paths(*keys):
        node = w
        for k in keys:
            node = node.get(k, {}) if isinstance(node, dict) else {}
        return node

    gsc = paths("gsc", "paths")
    if gsc:
        s, ratio = gsc.get("fedac", {}).get("s_per_round"), gsc.get("fedac", {}).get("speedup_vs_plain")
        full = w["gsc"].get("clients") == GSC_CLIENTS
        out.append(target("gsc round", "fedac <= 0.3 s/round", s, None if s is None else s <= 0.3, full, gpu))
        out.append(target("gsc vs plain", "fedac >= 10x the plain loop", ratio,
                          None if ratio is None else ratio >= 10, full, gpu))
    paper = paths("paper", "paths")
    if paper:
        s = paper.get("fedac", {}).get("s_per_round")
        out.append(target("paper schedule", "fedac <= 0.06 s/round", s, None if s is None else s <= 0.06,
                          w["paper"].get("per_round") == 48, gpu))
    for label, net in paths("kws", "networks").items():
        ratio = net["paths"].get("fedac", {}).get("speedup_vs_plain")
        out.append(target(f"kws {label} vs plain", "fedac >= 5x the plain loop", ratio,
                          None if ratio is None else ratio >= 5, w["kws"].get("per_round") == 100, gpu))
    exit12 = paths("w2v2", "depths", "12", "paths")
    if exit12:
        plain, fedac = exit12.get("plain", {}).get("s_per_round"), exit12.get("fedac", {}).get("s_per_round")
        ratio = fedac / plain if fedac and plain else None
        out.append(target("w2v2 exit 12 vs plain HF", "fedac s/round <= 1.2x the plain HF loop's", ratio,
                          None if ratio is None else ratio <= 1.2, w["w2v2"].get("size") == "w2v2_base", gpu))
    return out


def gsc_line(report: dict) -> str | None:
    """The GSC round in one line (what a lent machine's check waits for): fedac's s/round, the plain loop's,
    their ratio and the two targets, with whatever other paths are measured so far; None before fedac's."""
    gsc = report["workloads"].get("gsc", {})
    paths = gsc.get("paths", {})
    if "fedac" not in paths:
        return None
    verdicts = {t["target"]: t for t in report["targets"]}

    def verdict(name: str) -> str:
        t = verdicts.get(name)
        return "n/a" if t is None or t["pass"] is None else "PASS" if t["pass"] else "FAIL"
    measured = ", ".join(f"{name} {fmt(r.get('s_per_round'), '.4f')} s" if "error" not in r else f"{name} error"
                         for name, r in paths.items())
    speedup = paths["fedac"].get("speedup_vs_plain")
    known = max(paths[name].get("measured_after_s", 0) for name in ("fedac", "plain") if name in paths)
    deciding = any(t["decides"] for name, t in verdicts.items() if name.startswith("gsc"))
    return (f"gsc on {report['card']} ({gsc.get('clients')} clients, {gsc.get('per_round')} a round): {measured}"
            f" a round; fedac vs plain {fmt(speedup, '.2f')}x; targets <= 0.3 s {verdict('gsc round')}, >= 10x "
            f"{verdict('gsc vs plain')} ({'deciding' if deciding else 'not deciding'}); "
            f"{'fedac and plain' if 'plain' in paths else 'fedac'} measured {known:.0f} s into bench_gpu.py")


def rows(report: dict) -> list[tuple]:
    """(workload, path, result) for every path in the report."""
    out = []
    for name, w in report["workloads"].items():
        if "error" in w:
            out.append((name, "-", w))
        groups = [(name, w)] if "paths" in w else \
            [(f"{name} {k}", v) for k, v in w.get("networks", {}).items()] + \
            [(f"{name} exit {k}", v) for k, v in w.get("depths", {}).items()]
        for label, group in groups:
            for path, result in group["paths"].items():
                out.append((label, path, result))
    return out


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(report: dict) -> str:
    head = ("workload", "path", "s/round", "samples/s", "TFLOP/s", "of peak", "peak GPU MB", "samples/s vs plain")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for label, path, r in rows(report):
        if "error" in r:
            lines.append(f"{label} | {path} | error: {r['error'].strip().splitlines()[-1][:80]}")
            continue
        lines.append(" | ".join([label, path, fmt(r.get("s_per_round"), ".4f"), fmt(r.get("samples_per_s"), ",.0f"),
                                 fmt(r.get("tflop_per_s"), ".3f"), fmt(r.get("of_peak"), ".1%"),
                                 fmt(r.get("peak_gpu_mb"), ",.0f"), fmt(r.get("samples_per_s_vs_plain"), ".2f")]))
    peaks = report["matmul_peak_tflops"]
    lines.append("")
    lines.append(f"card: {report['card']}; torch {report['torch']}, CUDA {report['cuda']}; matmul peak TFLOP/s: "
                 + ", ".join(f"{k} {v:.2f}" for k, v in peaks.items() if k in PRECISIONS))
    for t in report["targets"]:
        verdict = "n/a" if t["pass"] is None else "PASS" if t["pass"] else "FAIL"
        scope = "" if t["decides"] else " (not deciding: " + ", ".join(
            s for s, bad in (("not a GPU", not t["on_gpu"]), ("scaled down", not t["at_target_scale"])) if bad) + ")"
        lines.append(f"target {t['target']}: {t['rule']}: measured {fmt(t['measured'], '.4g')} -> {verdict}{scope}")
    lines.append(f"wall {report['wall_s']:.0f} s")
    return "\n".join(lines)


# --- main ---------------------------------------------------------------------------------------------------------

def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="auto (CUDA when torch sees it), cpu, cuda or cuda:N")
    parser.add_argument("--quick", action="store_true", help="fewer rounds (GPU) / small workloads (CPU)")
    parser.add_argument("--only", default=",".join(WORKLOADS), help=f"comma list of {','.join(WORKLOADS)}")
    parser.add_argument("--paths", default="", help=f"comma list of the paths to time (default: every path of each "
                                                   f"workload): {','.join(PATHS)}")
    parser.add_argument("--precision", default="fp32", choices=PRECISIONS, help="fedac paths' train.precision")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default $OUT/bench_gpu.json or "
                                                               "benchmarks/results/bench_gpu.json)")
    parser.add_argument("--summary", type=Path, default=None,
                        help="also keep the GSC round's one-line summary here, rewritten after every path")
    args = parser.parse_args(argv)
    only = [w.strip() for w in args.only.split(",") if w.strip()]
    unknown = [w for w in only if w not in WORKLOADS]
    if unknown or not only:
        parser.error(f"--only: unknown workload(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(WORKLOADS)}")
    args.only = only
    args.paths = {p.strip() for p in args.paths.split(",") if p.strip()}
    if args.paths - set(PATHS):
        parser.error(f"--paths: unknown path(s) {', '.join(sorted(args.paths - set(PATHS)))}; choose from {', '.join(PATHS)}")
    setting = args.device
    if setting == "auto":
        setting = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        args.device = torch.device(setting)
    except RuntimeError:
        parser.error(f"--device {setting}: not a torch device (auto, cpu, cuda or cuda:N)")
    if args.device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {setting}: this torch ({torch.__version__}, CUDA build {torch.version.cuda}) sees no GPU")
    if args.device.type not in ("cpu", "cuda"):
        parser.error(f"--device {setting}: only cpu and cuda are benchmarked")
    args.device_setting = setting
    return args


def main(argv=None) -> int:
    args = parse(argv)
    # check.sh stops a section with SIGINT: a traceback of where it was, even when started with SIGINT ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    started = args.started = time.perf_counter()
    print(f"bench_gpu on {args.device} ({'quick' if args.quick else 'full'}): {', '.join(args.only)}", flush=True)
    args.peaks = matmul_peaks(args.device, args.quick)
    args.peaks_cpu = args.peaks if args.device.type == "cpu" else matmul_peaks(torch.device("cpu"), True)
    info = machine(args.device)
    report: dict = {"benchmark": "gpu", "issue": 45, "started_utc": datetime.now(timezone.utc).isoformat(),
                    "command": " ".join(["benchmarks/bench_gpu.py", *(argv if argv is not None else sys.argv[1:])]),
                    "quick": args.quick, "precision": args.precision, **info, "matmul_peak_tflops": args.peaks,
                    "cpu_matmul_peak_tflops": args.peaks_cpu, "scales": {k: scale(args, k) for k in SCALES},
                    "workloads": {}}
    out = args.out or (Path(os.environ["OUT"]) / "bench_gpu.json" if os.environ.get("OUT") else
                       BENCH / "results" / "bench_gpu.json")
    out.parent.mkdir(parents=True, exist_ok=True)

    def write() -> None:  # after every path, so a run stopped by a time limit keeps what it measured
        report["targets"] = targets(report, args)
        report["wall_s"] = time.perf_counter() - started
        report["errors"] = [f"{label}/{path}" for label, path, r in rows(report) if "error" in r]
        out.with_name(out.name + ".tmp").write_text(json.dumps(report, indent=2, default=str))
        out.with_name(out.name + ".tmp").replace(out)  # never a half-written file, even when killed
        line = gsc_line(report)
        if args.summary and line:
            args.summary.write_text(line + "\n")

    args.save = write
    with tempfile.TemporaryDirectory(prefix="fedac-bench-gpu-") as tmp:
        for name in args.only:
            print(f"{name} ...", flush=True)
            t0 = time.perf_counter()
            report["running"] = name
            # a workload's node joins the report as soon as it is built, each path's result when measured
            args.live = lambda node, name=name: report["workloads"].setdefault(name, node)
            try:
                RUNS[name](args, Path(tmp))
            except Exception:  # noqa: BLE001 - the other workloads still run
                report["workloads"].setdefault(name, {})["error"] = traceback.format_exc()[-4000:]
                print(report["workloads"][name]["error"], file=sys.stderr, flush=True)
            report["workloads"][name]["wall_s"] = time.perf_counter() - t0
            del report["running"]
            release(args.device)
            write()
    report["finished"] = True
    write()
    if gsc_line(report):
        print(gsc_line(report), flush=True)
    print(f"wrote {out}", flush=True)
    print(table(report), flush=True)
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
