"""fedac on a GPU against the loop a user would write and against fedac's CPU default (issue 45,
items 7-8).

    .venv/bin/python benchmarks/bench_gpu.py --device cuda          # every workload at full scale
    .venv/bin/python benchmarks/bench_gpu.py --device cuda --quick  # fewer rounds (<= 3 min, H100)
    .venv/bin/python benchmarks/bench_gpu.py --device cpu --quick   # the harness on a CPU (~2 min)
    .venv/bin/python benchmarks/bench_gpu.py --device cuda --only gsc,kws  # some workloads
    .venv/bin/python benchmarks/bench_gpu.py --device cuda --only gsc --paths fedac,plain  # paths

The code: this file (the command line, the report, the targets and the table), gpu_timing.py (sizes,
the device, timing one path, the helpers workloads share) and the package gpu_workloads/, one module
per workload (paper.py, gsc.py, kws.py, w2v2.py, impressions.py, gru.py, torchrun.py; its RUNS maps
each --only name to its function). benchmarks/gpu/check.sh runs the quick form on a lent GPU
machine, the GSC workload first. JSON goes to $OUT/bench_gpu.json when OUT is set, else
benchmarks/results/bench_gpu.json (or --out), rewritten after every path (so a run stopped by a time
limit keeps every path it measured; `running` names the workload under way); a table is printed
last. `--summary FILE` keeps the GSC round's one-line summary (fedac and plain s/round, their ratio,
the targets) in FILE from the moment fedac's round is measured.

Workloads (--only NAME, comma-separated):
- paper: bench_paper.py's workload, configs/paper.yaml on the embedded Speech Commands stand-in (240
  clients, 48 a round, CRNN-Base personalized models, CRNN-Lite Plug-in, 1 epoch of batch 16).
- gsc: bench_cohort.py's GSC scale (2,618 clients of 20-60 random 40 x 101 windows, 524 a round,
  FedMLAC as above, every personalized model resident from the start); fedac and plain are timed
  first, then the variants below.
- gru: the stacked GRU's recurrence alone (issue 45, item 2): one direction of CRNN-Base's GRU,
  forward and backward, for a GSC round's 524 clients in one chunk (batch 16, 25 frames), each way a
  GPU can run it: fedac's pure-torch recurrence, the Triton kernel, the torch recurrence replayed
  from a CUDA graph, and (plain) one cuDNN GRU call per client; `fastest` names the winner.
- kws: FedAvg on each KWS network (dscnn, mhattrnn, resnet15, kwt) with FedKWS-UI's local settings
  (experiments/fedkws.py KWS_PROTOCOL: batch 32, clipping at 50; KWT with AdamW) for `kws steps`
  local steps, 100 of 200 clients a round (random 40 x 101 windows, 12 classes).
- w2v2: early-exit fine-tuning (algorithms/earlyexit.py) of a w2v2_base encoder built from its size
  with random weights (nothing downloaded), every client at exit 3, 6, 9, then 12
  (`earlyexit.mode=homo`), on clips of 1 s held as the frozen CNN's frames (49 x 512, as
  engine/waveform.py caches them).
- impressions: zero-shot data-impression synthesis (Eq. 3) of round 4's reports of the homogeneous
  scenario (bench_impressions.py's capture), timed per new class.
- torchrun (only when named): the default run as 1 and as 2 torchrun processes sharing the device
  (bench_distributed.py's `run`).

Paths of every workload, one after another in this process (each built, timed, then freed, so each
one's peak GPU memory is its own plus what the process holds between paths):
- fedac: `Simulator.run_round` (sampling, training, aggregation, bookkeeping) with
  `runtime.device=<--device>`;
- plain: the sequential loop a user would write on the same device (workloads.Floor: one client
  after another, the model zoo's nn.Modules with their cuDNN layers (nn.Conv1d, nn.GRU, ...), no
  fedac code in the loop; for w2v2 a Hugging Face Wav2Vec2Model's projection and encoder with a
  stats-pool head at exit 12); the same clients each round and the same samples;
- fedac_chunk16 (gsc, on CUDA): fedac with `runtime.cohort_chunk=16`, the CPU's chunk, against
  auto's chunks packed from free GPU memory (training/packing.py): whether packing pays;
- fedac_gru_torch (gsc, on CUDA): fedac with `runtime.gru_kernel=torch`, the pure-torch recurrence,
  against auto's Triton kernel (kernels/gru_triton.py): whether the kernel pays;
- fedac_cpu: fedac with `runtime.device=cpu` (its CPU default: fused kernel, cohort workers per
  core), on fewer rounds and, where a round is long on a CPU, fewer clients (its samples/s is the
  figure to compare); left out when --device is cpu (it is the fedac path then).
Each fedac path also records what auto chose: the last round's chunk sizes and the measured memory
per client of a chunk (training/packing.py), where the clients' data and models live
(runtime.client_memory) and runtime.gru_kernel.
Timing: torch.cuda.synchronize() before and after every timed round on CUDA; median seconds of the
timed rounds after `warmup` untimed ones. Peak GPU memory: torch.cuda.max_memory_allocated over the
timed rounds (reset after the warm-up); null on the CPU. TFLOP/s: useful FLOPs (torch's
FlopCounterMode over one training step of the plain loop's networks, per sample: matmuls,
convolutions, the GRU's products, attention) x the round's samples / seconds; no padding counted.
`of_peak`: that rate against this device's measured matmul peak in the run's arithmetic
(--precision, which sets the fedac paths' runtime.precision; the plain loop and fedac_cpu stay fp32;
one large product each of fp32, tf32, bf16 and fp16 is timed, on CUDA).

Targets (issue 45) are checked at any scale and say whether the run was at the scale they are set
for (`at_target_scale`); only a GPU run at that scale decides them:
GSC round <= 0.3 s and >= 10x faster than the plain loop; paper schedule <= 0.06 s/round; each KWS
network >= 5x faster than the plain loop; w2v2 exit 12 within 1.2x of the plain Hugging Face loop.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_timing import SCALES, machine, matmul_peaks, release, scale  # noqa: E402
from gpu_workloads import RUNS  # noqa: E402
from workloads import GSC_CLIENTS  # noqa: E402

BENCH = Path(__file__).resolve().parent
WORKLOADS = ("paper", "gsc", "gru", "kws", "w2v2", "impressions")
PATHS = (
    "fedac",
    "plain",
    "fedac_chunk16",
    "fedac_gru_torch",
    "fedac_cpu",
    "torch",
    "triton",
    "torch_graph",
    "fedac_1process",
    "fedac_2processes",
)
"""Every path name a workload may time (--paths picks some)."""
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


# --- targets and the table ------------------------------------------------------------------------


def target(name: str, rule: str, measured, passed, at_scale: bool, gpu: bool) -> dict:
    return {
        "target": name,
        "rule": rule,
        "measured": measured,
        "pass": passed,
        "at_target_scale": at_scale,
        "on_gpu": gpu,
        "decides": at_scale and gpu,
    }


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
        s, ratio = (
            gsc.get("fedac", {}).get("s_per_round"),
            gsc.get("fedac", {}).get("speedup_vs_plain"),
        )
        full = w["gsc"].get("clients") == GSC_CLIENTS
        out.append(
            target(
                "gsc round", "fedac <= 0.3 s/round", s, None if s is None else s <= 0.3, full, gpu
            )
        )
        out.append(
            target(
                "gsc vs plain",
                "fedac >= 10x the plain loop",
                ratio,
                None if ratio is None else ratio >= 10,
                full,
                gpu,
            )
        )
    paper = paths("paper", "paths")
    if paper:
        s = paper.get("fedac", {}).get("s_per_round")
        out.append(
            target(
                "paper schedule",
                "fedac <= 0.06 s/round",
                s,
                None if s is None else s <= 0.06,
                w["paper"].get("per_round") == 48,
                gpu,
            )
        )
    for label, net in paths("kws", "networks").items():
        ratio = net["paths"].get("fedac", {}).get("speedup_vs_plain")
        out.append(
            target(
                f"kws {label} vs plain",
                "fedac >= 5x the plain loop",
                ratio,
                None if ratio is None else ratio >= 5,
                w["kws"].get("per_round") == 100,
                gpu,
            )
        )
    exit12 = paths("w2v2", "depths", "12", "paths")
    if exit12:
        plain, fedac = (
            exit12.get("plain", {}).get("s_per_round"),
            exit12.get("fedac", {}).get("s_per_round"),
        )
        ratio = fedac / plain if fedac and plain else None
        out.append(
            target(
                "w2v2 exit 12 vs plain HF",
                "fedac s/round <= 1.2x the plain HF loop's",
                ratio,
                None if ratio is None else ratio <= 1.2,
                w["w2v2"].get("size") == "w2v2_base",
                gpu,
            )
        )
    return out


def gsc_line(report: dict) -> str | None:
    """The GSC round in one line (what a lent machine's check waits for): fedac's s/round, the plain
    loop's, their ratio and the two targets, with whatever other paths are measured so far; None
    before fedac's."""
    gsc = report["workloads"].get("gsc", {})
    paths = gsc.get("paths", {})
    if "fedac" not in paths:
        return None
    verdicts = {t["target"]: t for t in report["targets"]}

    def verdict(name: str) -> str:
        t = verdicts.get(name)
        return "n/a" if t is None or t["pass"] is None else "PASS" if t["pass"] else "FAIL"

    measured = ", ".join(
        f"{name} {fmt(r.get('s_per_round'), '.4f')} s" if "error" not in r else f"{name} error"
        for name, r in paths.items()
    )
    speedup = paths["fedac"].get("speedup_vs_plain")
    known = max(
        paths[name].get("measured_after_s", 0) for name in ("fedac", "plain") if name in paths
    )
    deciding = any(t["decides"] for name, t in verdicts.items() if name.startswith("gsc"))
    return (
        f"gsc on {report['card']} ({gsc.get('clients')} clients, {gsc.get('per_round')} a round): "
        f"{measured} a round; fedac vs plain {fmt(speedup, '.2f')}x; targets <= 0.3 s "
        f"{verdict('gsc round')}, >= 10x {verdict('gsc vs plain')} "
        f"({'deciding' if deciding else 'not deciding'}); "
        f"{'fedac and plain' if 'plain' in paths else 'fedac'} measured {known:.0f} s into "
        "bench_gpu.py"
    )


def rows(report: dict) -> list[tuple]:
    """(workload, path, result) for every path in the report."""
    out = []
    for name, w in report["workloads"].items():
        if "error" in w:
            out.append((name, "-", w))
        groups = (
            [(name, w)]
            if "paths" in w
            else [(f"{name} {k}", v) for k, v in w.get("networks", {}).items()]
            + [(f"{name} exit {k}", v) for k, v in w.get("depths", {}).items()]
        )
        for label, group in groups:
            for path, result in group["paths"].items():
                out.append((label, path, result))
    return out


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(report: dict) -> str:
    head = (
        "workload",
        "path",
        "s/round",
        "samples/s",
        "TFLOP/s",
        "of peak",
        "peak GPU MB",
        "samples/s vs plain",
    )
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for label, path, r in rows(report):
        if "error" in r:
            lines.append(f"{label} | {path} | error: {r['error'].strip().splitlines()[-1][:80]}")
            continue
        lines.append(
            " | ".join(
                [
                    label,
                    path,
                    fmt(r.get("s_per_round"), ".4f"),
                    fmt(r.get("samples_per_s"), ",.0f"),
                    fmt(r.get("tflop_per_s"), ".3f"),
                    fmt(r.get("of_peak"), ".1%"),
                    fmt(r.get("peak_gpu_mb"), ",.0f"),
                    fmt(r.get("samples_per_s_vs_plain"), ".2f"),
                ]
            )
        )
    peaks = report["matmul_peak_tflops"]
    lines.append("")
    lines.append(
        f"card: {report['card']}; torch {report['torch']}, CUDA {report['cuda']}; matmul peak "
        "TFLOP/s: " + ", ".join(f"{k} {v:.2f}" for k, v in peaks.items() if k in PRECISIONS)
    )
    for t in report["targets"]:
        verdict = "n/a" if t["pass"] is None else "PASS" if t["pass"] else "FAIL"
        scope = (
            ""
            if t["decides"]
            else " (not deciding: "
            + ", ".join(
                s
                for s, bad in (
                    ("not a GPU", not t["on_gpu"]),
                    ("scaled down", not t["at_target_scale"]),
                )
                if bad
            )
            + ")"
        )
        lines.append(
            f"target {t['target']}: {t['rule']}: measured {fmt(t['measured'], '.4g')} -> "
            f"{verdict}{scope}"
        )
    lines.append(f"wall {report['wall_s']:.0f} s")
    return "\n".join(lines)


# --- main -----------------------------------------------------------------------------------------


def parse(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--device", default="auto", help="auto (CUDA when torch sees it), cpu, cuda or cuda:N"
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer rounds (GPU) / small workloads (CPU)"
    )
    parser.add_argument(
        "--only", default=",".join(WORKLOADS), help=f"comma list of {','.join(WORKLOADS)}"
    )
    parser.add_argument(
        "--paths",
        default="",
        help=f"comma list of the paths to time (default: every path of each "
        f"workload): {','.join(PATHS)}",
    )
    parser.add_argument(
        "--precision", default="fp32", choices=PRECISIONS, help="fedac paths' runtime.precision"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON path (default $OUT/bench_gpu.json or benchmarks/results/bench_gpu.json)",
    )
    parser.add_argument(
        "--summary",
        type=Path,
        default=None,
        help="also keep the GSC round's one-line summary here, rewritten after every path",
    )
    args = parser.parse_args(argv)
    only = [w.strip() for w in args.only.split(",") if w.strip()]
    # (WORKLOADS run by default; torchrun only when named)
    unknown = [w for w in only if w not in RUNS]
    if unknown or not only:
        parser.error(
            f"--only: unknown workload(s) {', '.join(unknown) or '(none given)'}; choose from "
            f"{', '.join(RUNS)}"
        )
    args.only = only
    args.paths = {p.strip() for p in args.paths.split(",") if p.strip()}
    if args.paths - set(PATHS):
        parser.error(
            f"--paths: unknown path(s) {', '.join(sorted(args.paths - set(PATHS)))}; choose from "
            f"{', '.join(PATHS)}"
        )
    setting = args.device
    if setting == "auto":
        setting = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        args.device = torch.device(setting)
    except RuntimeError:
        parser.error(f"--device {setting}: not a torch device (auto, cpu, cuda or cuda:N)")
    if args.device.type == "cuda" and not torch.cuda.is_available():
        parser.error(
            f"--device {setting}: this torch ({torch.__version__}, CUDA build "
            f"{torch.version.cuda}) sees no GPU"
        )
    if args.device.type not in ("cpu", "cuda"):
        parser.error(f"--device {setting}: only cpu and cuda are benchmarked")
    args.device_setting = setting
    return args


def main(argv=None) -> int:
    args = parse(argv)
    # check.sh stops a section with SIGINT: a traceback of where it was, even when started with
    # SIGINT ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    started = args.started = time.perf_counter()
    print(
        f"bench_gpu on {args.device} ({'quick' if args.quick else 'full'}): {', '.join(args.only)}",
        flush=True,
    )
    args.peaks = matmul_peaks(args.device, args.quick)
    args.peaks_cpu = (
        args.peaks if args.device.type == "cpu" else matmul_peaks(torch.device("cpu"), True)
    )
    info = machine(args.device)
    report: dict = {
        "benchmark": "gpu",
        "issue": 45,
        "started_utc": datetime.now(timezone.utc).isoformat(),
        "command": " ".join(
            ["benchmarks/bench_gpu.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "quick": args.quick,
        "precision": args.precision,
        **info,
        "matmul_peak_tflops": args.peaks,
        "cpu_matmul_peak_tflops": args.peaks_cpu,
        "scales": {k: scale(args, k) for k in SCALES},
        "workloads": {},
    }
    out = args.out or (
        Path(os.environ["OUT"]) / "bench_gpu.json"
        if os.environ.get("OUT")
        else BENCH / "results" / "bench_gpu.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)

    # after every path, so a run stopped by a time limit keeps what it measured
    def write() -> None:
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
            # a workload's node joins the report as soon as it is built, each path's result when
            # measured
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
