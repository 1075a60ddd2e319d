"""The KWS part of the GPU check (benchmarks/gpu/check.sh, sections `kws` and `profile`):
FedKWS-UI's four networks trained stacked, against the per-client loops and the vmap path, with
determinism and precision as settings. One command per section, JSON written after every
measurement:

    python benchmarks/gpu/kws_check.py --device cuda --out $OUT/kws_check.json  # section kws
    python benchmarks/gpu/kws_check.py --device cuda --profile --out-dir $OUT   # section profile
    python benchmarks/gpu/kws_check.py --device cpu --clients 4 --steps 1 --batch 8  # a dry run

Section kws, per network (dscnn, mhattrnn, resnet15, kwt; KWT with AdamW as FedKWS-UI trains it),
one FedKWS-UI client update of `--clients` clients (100: FedKWS-UI's cohort at the paper's scale)
from one payload, each path warmed up once and then timed once (`torch.cuda.synchronize` around it):
- stacked: `runtime.execution=cohort`, the hand-written stacked form (models/kws_stacked.py);
- vmap: the same through training/functional.py's vmap (the form before it);
- sequential: fedac's own per-client path (`train_client`: the private phase, ALT's steps, the ALO
  loss, clipping at 50), the loop the stacked path must reproduce: the benchmark's *plain loop*;
- bare: the least a per-client loop can do, the second reference: the network alone (one head),
  cross-entropy, the optimiser, `--steps` steps of `--batch` a client, no private phase, no
  clipping, no augmentation, no fedac code. It does less work than the FedKWS-UI update (no private
  phase, no second head), so stacked / bare understates the speed-up over a real loop;
- nondeterministic: stacked and sequential again with `runtime.deterministic=false` (the price of
  determinism, per network: deterministic / nondeterministic seconds);
- tf32, bf16: stacked with `runtime.precision=tf32` / `bf16` (CUDA only), timed, and their uploads
  against fp32's: the largest relative difference of any parameter after the round and the mean
  training loss's difference (`tolerance`: 2e-2 relative on the parameters, 5e-2 on the loss, the
  bound a precision is `within` to be usable for these networks).
Each network has `--budget` seconds (times $BUDGET_SCALE, which check.sh's dry run sets to its
calibration): a path other than stacked and sequential that would start past it is recorded as
skipped, so the section ends in bounded time whatever the device.

Section profile (`--profile`): torch.profiler over one stacked FedKWS-UI round of each network and
one GSC FedMLAC round (benchmarks/gpu_workloads/gsc.py's workload), the top operators by self CUDA
time (self CPU time on the CPU) written to `--out-dir` as profile_<name>.txt and profile.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from fedac.algorithms import build_algorithm  # noqa: E402
from fedac.algorithms.base import ClientData, Task  # noqa: E402
from fedac.config import load_config  # noqa: E402
from fedac.engine.execution import run_clients  # noqa: E402
from fedac.models import KWS_MODELS  # noqa: E402
from fedac.training.runtime import start_runtime  # noqa: E402

NETWORKS = {
    "dscnn": [],
    "mhattrnn": [],
    "resnet15": [],
    "kwt": ["train.optimizer=adamw", "train.lr=0.001"],
}
FEATURES, FRAMES, CLASSES, SAMPLES = 40, 101, 12, 64
TOLERANCE = {"params_rel": 2e-2, "loss_abs": 5e-2}


def clients(count: int, device: torch.device) -> list[ClientData]:
    g = torch.Generator().manual_seed(0)
    return [
        ClientData(
            f"c{i}",
            torch.randn(SAMPLES, FEATURES, FRAMES, generator=g).to(device),
            torch.randint(0, CLASSES, (SAMPLES,), generator=g).to(device),
            torch.zeros(0, FEATURES, FRAMES, device=device),
            torch.zeros(0, dtype=torch.long, device=device),
        )
        for i in range(count)
    ]


def algorithm(net: str, args, datas, *settings: str):
    counts = [torch.bincount(d.y.cpu(), minlength=CLASSES).tolist() for d in datas]
    cfg = load_config(
        overrides=[
            "algorithm=fedkwsui",
            f"model.name={net}",
            f"train.batch_size={args.batch}",
            f"runtime.device={args.device}",
            "train.max_grad_norm=50",
            "train.lr=0.1",
            "train.momentum=0.9",
            f"fedkwsui.local_steps={args.steps}",
            *NETWORKS[net],
            *settings,
        ]
    )
    runtime = start_runtime(cfg.runtime)  # precision and determinism, process-wide
    return build_algorithm(cfg, Task(FEATURES, CLASSES, [d.name for d in datas], counts), runtime)


@contextmanager
def vmap_only():
    """The stacked path through vmap: the hand-written KWS forms hidden from `stacked_kind`."""
    import fedac.models.kws_stacked as forms

    real = forms.stacked_kws
    forms.stacked_kws = lambda model: None
    try:
        yield
    finally:
        forms.stacked_kws = real


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fedac_round(algo, datas):
    payload = algo.broadcast(algo.init_server())
    states = [algo.init_client_state(d.name) for d in datas]
    return lambda: run_clients(algo, payload, states, datas, 1, 0)


def bare_round(net: str, args, datas):
    """The bare per-client loop (see the module docstring)."""
    torch.manual_seed(0)
    model = KWS_MODELS[net](FEATURES, CLASSES).to(args.device)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    adamw = "train.optimizer=adamw" in NETWORKS[net]

    def run():
        for d in datas:
            model.load_state_dict(start)
            model.train()
            opt = (
                torch.optim.AdamW(model.parameters(), lr=1e-3)
                if adamw
                else torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            )
            for s in range(args.steps):
                rows = slice((s * args.batch) % SAMPLES, (s * args.batch) % SAMPLES + args.batch)
                opt.zero_grad()
                F.cross_entropy(model(d.x[rows]), d.y[rows]).backward()
                opt.step()

    return run


def timed(run, device: torch.device):
    run()  # warm-up: templates, kernels, cuDNN plans
    sync(device)
    started = time.perf_counter()
    out = run()
    sync(device)
    return time.perf_counter() - started, out


def compare(results, reference) -> dict:
    """Largest relative parameter difference and the mean-loss difference of two rounds."""
    rel = 0.0
    for a, b in zip(results, reference):
        for name, value in b.upload.items():
            ref = value.float()
            # (floor 1e-3: a convolution's bias before BatchNorm stays ~1e-8, rounding noise)
            scale = max(float(ref.abs().max()), 1e-3)
            rel = max(rel, float((a.upload[name].float() - ref).abs().max()) / scale)
    loss = [r.metrics["loss"] for r in results]
    ref_loss = [r.metrics["loss"] for r in reference]
    diff = abs(sum(loss) / len(loss) - sum(ref_loss) / len(ref_loss))
    return {
        "params_max_rel_diff": rel,
        "mean_loss_diff": diff,
        "within": rel <= TOLERANCE["params_rel"] and diff <= TOLERANCE["loss_abs"],
    }


def network_paths(net: str, args, datas) -> dict:
    """name -> (build the round, settings note); in order of importance."""
    paths = {
        "stacked": lambda: fedac_round(
            algorithm(net, args, datas, "runtime.execution=cohort"), datas
        ),
        "sequential": lambda: fedac_round(
            algorithm(net, args, datas, "runtime.execution=sequential"), datas
        ),
        "vmap": lambda: fedac_round(algorithm(net, args, datas, "runtime.execution=cohort"), datas),
        "bare": lambda: bare_round(net, args, datas),
    }
    for path in ("stacked", "sequential"):
        paths[f"{path}_nondeterministic"] = lambda path=path: fedac_round(
            algorithm(
                net,
                args,
                datas,
                f"runtime.execution={'cohort' if path == 'stacked' else 'sequential'}",
                "runtime.deterministic=false",
            ),
            datas,
        )
    if args.device.startswith("cuda"):
        for precision in ("tf32", "bf16"):
            paths[f"stacked_{precision}"] = lambda p=precision: fedac_round(
                algorithm(net, args, datas, "runtime.execution=cohort", f"runtime.precision={p}"),
                datas,
            )
    return paths


def check_network(net: str, args, datas, save, row: dict) -> None:
    """Every path of `net` into `row` (the report's node, saved after each path)."""
    began = time.perf_counter()
    device = torch.device(args.device)
    reference = None
    for name, build in network_paths(net, args, datas).items():
        # (the stacked form and fedac's own loop always run: the comparison the section is for)
        if time.perf_counter() - began > args.budget and name not in ("stacked", "sequential"):
            row["paths"][name] = {"skipped": f"past the network's budget of {args.budget} s"}
            continue
        try:
            with vmap_only() if name == "vmap" else _nothing():
                seconds, out = timed(build(), device)
            entry: dict = {"s": seconds}
            if name == "stacked":
                reference = out
            elif out is not None and reference is not None and name.startswith("stacked_"):
                entry.update(compare(out, reference))
            if name in ("sequential", "vmap") and out is not None and reference is not None:
                entry["vs_stacked"] = compare(reference, out)
        except Exception as exc:  # noqa: BLE001 - a check reports a broken path and goes on
            entry = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
        row["paths"][name] = entry
        print(f"  {net} {name}: {entry}", flush=True)
        ratios(row)
        save()


@contextmanager
def _nothing():
    yield


def ratios(row: dict) -> None:
    """Speed-ups of the stacked form, and the price of determinism, where both sides are timed."""
    p = {k: v["s"] for k, v in row["paths"].items() if "s" in v}
    if "stacked" in p:
        for other in ("sequential", "vmap", "bare"):
            if other in p:
                row[f"stacked_vs_{other}"] = p[other] / p["stacked"]
    for path in ("stacked", "sequential"):
        if path in p and f"{path}_nondeterministic" in p:
            row[f"determinism_price_{path}"] = p[path] / p[f"{path}_nondeterministic"]


def profile_table(run, device: torch.device, rows: int = 25) -> tuple[str, list[dict]]:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    run()  # warm-up
    sync(device)
    with profile(activities=activities) as prof:
        run()
        sync(device)
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = prof.key_averages()
    table = events.table(sort_by=key, row_limit=rows)
    top = sorted(events, key=lambda e: getattr(e, key, 0), reverse=True)
    data = [
        {
            "op": e.key,
            "calls": e.count,
            "self_cpu_ms": e.self_cpu_time_total / 1e3,
            "self_device_ms": getattr(e, "self_device_time_total", 0) / 1e3,
        }
        for e in top[:rows]
    ]
    return table, data


def gsc_round(args):
    """One GSC FedMLAC round through `Simulator.run_round` (bench_gpu.py's gsc workload)."""
    import tempfile

    from gpu_timing import GSC_CLIENTS, NO_EVAL, SCHEDULE, fedac_path
    from workloads import FEDMLAC_SETTINGS, federated, gsc_scale_clients

    count = GSC_CLIENTS if args.device.startswith("cuda") else args.gsc_clients
    cfg = load_config(
        overrides=[*SCHEDULE, *FEDMLAC_SETTINGS, *NO_EVAL, f"runtime.device={args.device}"]
    )
    start_runtime(cfg.runtime)
    run_dir = Path(tempfile.mkdtemp(prefix="kws-check-gsc-"))
    run, _ = fedac_path(cfg, lambda: federated(gsc_scale_clients(count)), run_dir, True)()
    counter = iter(range(1, 1000))
    return lambda: run(next(counter))


def profile_section(args) -> dict:
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    report: dict = {"device": args.device, "clients": args.clients, "profiles": {}}
    builds = {"gsc": lambda: gsc_round(args)}
    datas = clients(args.clients, device)
    for net in args.networks.split(","):
        builds[f"kws_{net}"] = lambda net=net: fedac_round(
            algorithm(net, args, datas, "runtime.execution=cohort"), datas
        )
    began = time.perf_counter()
    for name, build in builds.items():
        if time.perf_counter() - began > args.budget * 2:
            report["profiles"][name] = {"skipped": "past the section's budget"}
            continue
        table, data = profile_table(build(), device)
        (out_dir / f"profile_{name}.txt").write_text(table)
        report["profiles"][name] = data
        (out_dir / "profile.json").write_text(json.dumps(report, indent=2))
        print(f"== profile {name}: top operator {data[0]['op'] if data else '-'}", flush=True)
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--steps", type=int, default=5, help="fedkwsui.local_steps (E)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--budget", type=float, default=35.0, help="seconds a network may take")
    parser.add_argument("--networks", default=",".join(NETWORKS))
    parser.add_argument("--gsc-clients", type=int, default=50, help="the GSC round's on the CPU")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "kws_check.json"))
    parser.add_argument(
        "--out-dir", default=os.environ.get("OUT", str(ROOT / "benchmarks/results"))
    )
    args = parser.parse_args(argv)
    # check.sh's dry run scales every limit by how slow the machine is now (calibrate.py)
    args.budget *= float(os.environ.get("BUDGET_SCALE", "1"))
    unknown = set(args.networks.split(",")) - set(NETWORKS)
    if unknown:
        parser.error(f"unknown network(s) {', '.join(sorted(unknown))}")
    if args.profile:
        profile_section(args)
        return 0
    datas = clients(args.clients, torch.device(args.device))
    report: dict = {
        "device": args.device,
        "card": torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU",
        "torch": torch.__version__,
        "clients": args.clients,
        "local_steps": args.steps,
        "batch_size": args.batch,
        "tolerance": TOLERANCE,
        "networks": {},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save():
        out.write_text(json.dumps(report, indent=2))

    for net in args.networks.split(","):
        print(f"== kws {net}", flush=True)
        report["networks"][net] = {"paths": {}}
        check_network(net, args, datas, save, report["networks"][net])
    return 0


if __name__ == "__main__":
    sys.exit(main())
