"""Cohort vs sequential vs the compute floor (issue 6). One command, writes JSON to
benchmarks/results/:

    .venv/bin/pip install -e .[bench]                      # once: Flower's simulation engine (Ray)
    .venv/bin/python benchmarks/bench_cohort.py            # everything (about 20 min on 2 cores)
    .venv/bin/python benchmarks/bench_cohort.py --quick    # fewer clients and repeats, a smoke run

Measured in one process per part, paths interleaved round by round, so ratios compare like with like
on a machine shared with other jobs. Every timing is reported as wall seconds and as process CPU
seconds (user + sys): on one torch thread the CPU time is the work itself, unaffected by other jobs
stealing the core, and it is the number to read when the load average is high (it is in the JSON).

Parts
- threads: the sequential floor of workload W with 1 and with 2 torch threads (and 2 threads with
  OpenMP's passive waiting), one fresh process each.
- w: workload W (issue 6): CRNN-Lite on 40 x 101 features, 100 clients x 40 samples, 10 per round,
  1 local epoch, batch 16, SGD lr 0.01 (no momentum), dropout 0.1. Per round: the floor (the same
  SGD steps back to back in a plain torch loop: one model, weights loaded per client, no fedac
  code), fedac's sequential path and fedac's stacked path (`Simulator.run_round`, so sampling, the
  server update and all bookkeeping are inside). The end-to-end run is in the flower part.
- vmap: one SGD step of 10 clients through torch.func (stack_module_state + functional_call +
  vmap(grad)) against the stacked formulation of models/stacked.py and a loop, dropout off.
- fedmlac: FedMLAC with CRNN-Base personalized models and a CRNN-Lite Plug-in, 500 clients x 40
  samples, 100 per round (LPA aggregation); the floor is the same mutual-learning steps in a plain
  loop; the stacked path also with 2 worker threads (`runtime.cohort_workers=2`; every other path
  uses one core).
- gsc: GSC scale in a fresh process (so its peak RSS is its own): 2,618 clients of 20-60 windows
  (mean 40; 20% held out locally, as the GSC protocol does), random 40 x 101 features, every
  client's CRNN-Base personalized model resident, 20% active, FedMLAC on the default (cohort) path,
  with 1 thread, with 2 cohort worker threads, and with 2 torch intra-op threads (one fresh process
  each).
- flower: end to end, launch to finish. fedac: a fresh Python process running `Simulator.run()`
  (what `fedac run` does) on the benchmark's data. Flower: `flwr run benchmarks <connection>` with
  `address = ":local:"` (the local simulation `flwr run` starts itself; stopped after each run),
  with Flower's default client resources (2 CPUs per ClientApp: one Ray actor on 2 cores) and with
  one CPU per ClientApp (two actors); the apps are in flower_apps.py. W: 100 rounds, Flower's FedAvg
  against fedac's default path. FedMLAC 500/100: `--fedmlac-rounds` rounds, the fedac Flower app
  (personalized models in `context.state`) against fedac with 1 and with 2 cohort worker threads.
  Start-up, first round and the median later round are reported apart. Without `flwr[simulation]`
  only fedac's side runs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

from fedac.engine.simulator import Simulator
from fedac.flower.local import free_port, stop_local_superlink
from fedac.models import build_model
from workloads import (
    BASE_SETTINGS,
    CLASSES,
    FEATURES,
    FEDMLAC_SETTINGS,
    FRAMES,
    GSC_CLIENTS,
    W_CLIENTS,
    W_PER_ROUND,
    W_SETTINGS,
    MutualFloor,
    SupervisedFloor,
    config,
    cpu_info,
    federated,
    gsc_scale_clients,
    uniform_federation,
)

RESULTS = Path(__file__).resolve().parent / "results"


# --- timing helpers -------------------------------------------------------------------------------


def timed(fn) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def summarize(samples: dict[str, list[tuple[float, float]]], floor: str | None = "floor") -> dict:
    """Median wall / CPU seconds per path, and each path's ratio to the floor (ratio of medians, and
    the median of per-repeat ratios, which cancels slow phases of a shared machine)."""
    out: dict = {}
    for name, values in samples.items():
        walls, cpus = [w for w, _ in values], [c for _, c in values]
        out[name] = {
            "wall_s": statistics.median(walls),
            "cpu_s": statistics.median(cpus),
            "wall_s_all": [round(w, 4) for w in walls],
            "cpu_s_all": [round(c, 4) for c in cpus],
        }
    if floor in samples:
        for name in samples:
            if name == floor:
                continue
            pairs = list(zip(samples[name], samples[floor]))
            out[name]["vs_floor_wall"] = out[name]["wall_s"] / out[floor]["wall_s"]
            out[name]["vs_floor_cpu"] = out[name]["cpu_s"] / out[floor]["cpu_s"]
            out[name]["vs_floor_wall_paired"] = statistics.median(a[0] / b[0] for a, b in pairs)
            out[name]["vs_floor_cpu_paired"] = statistics.median(a[1] / b[1] for a, b in pairs)
    return out


def interleave(
    paths: dict, rounds: list[int], warmup: int = 1
) -> dict[str, list[tuple[float, float]]]:
    """Run every path on every round (in turn, rotating the order), after `warmup` untimed
    rounds."""
    for r in range(warmup):
        for fn in paths.values():
            fn(10_000 + r)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in paths}
    names = list(paths)
    for i, r in enumerate(rounds):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            samples[name].append(timed(lambda: paths[name](r)))
    return samples


def fedac_round(sim: Simulator, state: dict):
    return lambda round_idx: sim.run_round(state, round_idx)


def simulator(cfg, data, tmp: Path) -> tuple[Simulator, dict]:
    sim = Simulator(cfg, tmp, data, progress=False)
    return sim, sim._fresh_state()


# --- parts ----------------------------------------------------------------------------------------


def floor_child(args) -> dict:
    """The W floor on `args.threads_child` torch threads, in this (child) process."""
    torch.set_num_threads(args.threads_child)
    floor = SupervisedFloor(uniform_federation(W_CLIENTS, 0).clients, W_PER_ROUND)
    floor(0)  # warm-up
    return {"samples": [timed(lambda: floor(r)) for r in range(1, args.threads_repeats + 1)]}


def run_child(*flags: str, env: dict | None = None, script: str = __file__) -> dict:
    """`script` (this one) in a fresh process with `flags`; its result is the JSON on the last line
    it prints."""
    done = subprocess.run([sys.executable, script, *flags], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        how = (
            f"killed by signal {-done.returncode}"
            if done.returncode < 0
            else f"exit {done.returncode}"
        )
        raise RuntimeError(
            f"child {' '.join(flags)} failed ({how}; 9 is often the out-of-memory killer): "
            f"{done.stderr[-3000:]}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def write_report(report: dict, out: Path, headline: dict) -> None:
    """The full report as JSON at `out`, the headline numbers on stdout."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps(headline, indent=2))
    print(f"wrote {out}")


def part_threads(args) -> dict:
    """Each setting in a fresh process: OpenMP's wait policy is read once, when a process starts."""
    settings = [
        ("threads_1", 1, None),
        ("threads_2", 2, None),
        ("threads_2_omp_passive", 2, "PASSIVE"),
    ]
    samples = {}
    for name, threads, policy in settings:
        env = dict(os.environ)
        if policy:
            env["OMP_WAIT_POLICY"] = policy
        child = run_child(
            "--threads-child", str(threads), "--threads-repeats", str(args.threads_repeats), env=env
        )
        samples[name] = [tuple(v) for v in child["samples"]]
    out = summarize(samples, floor="threads_1")
    out["note"] = (
        "sequential floor of workload W, s/round, one fresh process per setting; vs_floor_* is the "
        "ratio to threads_1; omp_passive sets OMP_WAIT_POLICY=PASSIVE"
    )
    return out


def part_w(args, tmp: Path) -> dict:
    data = uniform_federation(W_CLIENTS)
    seq = simulator(config(*W_SETTINGS, "runtime.execution=sequential"), data, tmp / "w-seq")
    coh = simulator(config(*W_SETTINGS, "runtime.execution=cohort"), data, tmp / "w-cohort")
    paths = {
        "floor": SupervisedFloor(data.clients, W_PER_ROUND),
        "fedac_sequential": fedac_round(*seq),
        "fedac_cohort": fedac_round(*coh),
    }
    out = summarize(interleave(paths, list(range(1, args.repeats + 1)), warmup=2))
    return out


def part_fedmlac(args, tmp: Path) -> dict:
    count = 500 if not args.quick else 100
    per_round = count // 5
    data = uniform_federation(count, 0)
    seq = simulator(config(*FEDMLAC_SETTINGS, "runtime.execution=sequential"), data, tmp / "m-seq")
    coh = simulator(config(*FEDMLAC_SETTINGS, "runtime.execution=cohort"), data, tmp / "m-cohort")
    coh2 = simulator(
        config(*FEDMLAC_SETTINGS, "runtime.execution=cohort", "runtime.cohort_workers=2"),
        data,
        tmp / "m-cohort2",
    )
    paths = {
        "floor": MutualFloor(data.clients, per_round),
        "fedac_sequential": fedac_round(*seq),
        "fedac_cohort": fedac_round(*coh),
        "fedac_cohort_2_workers": fedac_round(*coh2),
    }
    out = summarize(interleave(paths, list(range(1, max(2, args.repeats // 2) + 1)), warmup=1))
    out["clients"], out["per_round"] = count, per_round
    return out


def part_vmap(args) -> dict:
    """One SGD step of K=10 clients x 16 samples, dropout off (vmap cannot replay a client's own
    masks): torch.func (stack_module_state + functional_call + vmap(grad)) against this package's
    stacked formulation (models/stacked.py) and a loop over the clients' nn.Modules."""
    from torch.func import functional_call, grad, stack_module_state, vmap

    from fedac.models.stacked import stacked_model
    from fedac.training.local import cross_entropy
    from fedac.training.stacking import grads_of, leaves

    out = {}
    k, b = 10, 16
    for name in ("crnn_lite", "crnn_base"):
        models = [build_model(name, FEATURES, CLASSES, 0.0) for _ in range(k)]
        params, buffers = stack_module_state(models)
        params = {n: v.detach().clone() for n, v in params.items()}
        skeleton = build_model(name, FEATURES, CLASSES, 0.0).to("meta")
        x, y = torch.randn(k, b, FEATURES, FRAMES), torch.randint(0, CLASSES, (k, b))
        weight = torch.full((k, b), 1.0 / b)

        def loss_one(p, buf, xx, yy):
            return F.cross_entropy(functional_call(skeleton, (p, buf), (xx,)), yy)

        def with_vmap(_):
            grads = vmap(grad(loss_one))(params, buffers, x, y)
            for n, g in grads.items():
                params[n].sub_(0.01 * g)

        stacked = stacked_model(name, 0.0)
        sparams = {n: v.clone() for n, v in params.items()}

        def with_stacked(_):
            leaf = leaves(sparams, k)
            grads = grads_of(cross_entropy(stacked(leaf, x), y, weight).sum(), leaf)
            for n, g in grads.items():
                sparams[n].sub_(0.01 * g)

        opts = [torch.optim.SGD(m.parameters(), lr=0.01) for m in models]

        def with_loop(_):
            for i, (m, opt) in enumerate(zip(models, opts)):
                opt.zero_grad()
                F.cross_entropy(m(x[i]), y[i]).backward()
                opt.step()

        samples = interleave(
            {"floor": with_loop, "torch_func_vmap": with_vmap, "stacked": with_stacked},
            list(range(max(3, args.repeats // 2))),
            warmup=1,
        )
        out[name] = summarize(samples)
    out["note"] = "s per step of 10 clients; 'floor' here is the per-client nn.Module loop"
    return out


def rss_mb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def part_gsc(args, tmp: Path) -> dict:
    """Runs in its own process (see main)."""
    count = GSC_CLIENTS if not args.quick else 300
    threads, workers = args.gsc_threads, args.gsc_workers
    torch.set_num_threads(threads)
    load_start = os.getloadavg()
    started = time.perf_counter()
    clients = gsc_scale_clients(count)
    data = federated(clients)
    setup = {"data_s": time.perf_counter() - started, "rss_after_data_mb": rss_mb()}
    cfg = config(
        *FEDMLAC_SETTINGS, f"runtime.threads={threads}", f"runtime.cohort_workers={workers}"
    )
    sim, state = simulator(cfg, data, tmp / "gsc")
    started = time.perf_counter()
    for c in clients:  # every personalized model resident from the start
        sim._client_state(state, c.name)
    setup.update({"init_models_s": time.perf_counter() - started, "rss_after_models_mb": rss_mb()})
    rounds = []
    for r in range(1, args.gsc_rounds + 1):
        rounds.append(timed(lambda: sim.run_round(state, r)))
    walls, cpus = [w for w, _ in rounds], [c for _, c in rounds]
    return {
        "clients": count,
        "active_per_round": max(1, round(0.2 * count)),
        "train_windows": sum(c.num_samples for c in clients),
        "holdout_windows": sum(len(c.holdout_y) for c in clients),
        "torch_threads": threads,
        "cohort_workers": workers,
        "execution": cfg.runtime.execution,
        "cohort_chunk": cfg.runtime.cohort_chunk,
        "load_average_start": load_start,
        "load_average_end": os.getloadavg(),
        "s_per_round_wall": statistics.median(walls),
        "s_per_round_cpu": statistics.median(cpus),
        "wall_s_all": [round(w, 3) for w in walls],
        "cpu_s_all": [round(c, 3) for c in cpus],
        **setup,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "note": "s/round excludes evaluation and checkpoints (writing 2,618 models is a separate, "
        "checkpoint_every-controlled cost)",
    }


# --- end to end: fedac against Flower's simulation ------------------------------------------------

BENCH_DIR = Path(__file__).resolve().parent


def w_rounds(args) -> int:
    return 100 if not args.quick else 10


def fedmlac_clients(args) -> int:
    return 500 if not args.quick else 100


def e2e_child(args, tmp: Path) -> dict:
    """One fedac run in this fresh process: what `fedac run` does, on the benchmark's data."""
    started = time.time()
    if args.e2e_child == "w":
        data, settings = (
            uniform_federation(W_CLIENTS),
            [*W_SETTINGS, "train.eval_every=10", "train.checkpoint_every=10"],
        )
    else:
        data, settings = uniform_federation(fedmlac_clients(args)), FEDMLAC_SETTINGS
    cfg = config(
        *settings, f"train.rounds={args.e2e_rounds}", f"runtime.cohort_workers={args.e2e_workers}"
    )
    data_ready = time.time()
    Simulator(cfg, tmp / f"e2e-{args.e2e_child}", data, progress=False).run()
    return {
        "main_start": started,
        "data_ready": data_ready,
        "end": time.time(),
        "execution": cfg.runtime.execution,
    }


def fedac_end_to_end(workload: str, rounds: int, workers: int, quick: bool = False) -> dict:
    """Wall seconds from launching a fresh Python process to its exit, like `flwr run` below."""
    launched = time.time()
    marks = run_child(
        "--e2e-child",
        workload,
        "--e2e-rounds",
        str(rounds),
        "--e2e-workers",
        str(workers),
        *(["--quick"] if quick else []),
    )
    exited = time.time()
    return {
        "rounds": rounds,
        "cohort_workers": workers,
        "execution": marks["execution"],
        "wall_s": exited - launched,
        "startup_s": marks["data_ready"] - launched,
        "run_s": marks["end"] - marks["data_ready"],
        "includes": "Python + torch + fedac import, data, every round, final validation / test, "
        "results.json, figures"
        + (", validation and checkpoints every 10 rounds" if workload == "w" else ""),
    }


def toml_value(value) -> str:
    return (
        json.dumps(value)
        if isinstance(value, str)
        else repr(value).lower()
        if isinstance(value, bool)
        else repr(value)
    )


def flower_run(
    tmp: Path, name: str, nodes: int, actors: int, run_config: dict, timeout: float
) -> dict:
    """`flwr run benchmarks <local simulation>` with `nodes` simulated SuperNodes and `actors` Ray
    actors (each given cores / actors CPUs); times from the launch of `flwr run` and the ServerApp's
    marks."""
    home = tmp / f"flwr-{name}"
    home.mkdir(parents=True, exist_ok=True)
    http_port, control_port = free_port(), free_port()
    cpus = len(os.sched_getaffinity(0))
    (home / "config.toml").write_text(
        '[superlink]\ndefault = "bench"\n\n[superlink.bench]\naddress = ":local:"\n'
        f"options.num-supernodes = {nodes}\n"
        f"options.backend.client-resources.num-cpus = {max(1, cpus // actors)}\n"
        "options.backend.client-resources.num-gpus = 0.0\n"
    )
    marks_file = home / "marks.json"
    overrides = home / "run_config.toml"
    overrides.write_text(
        "".join(
            f"{k} = {toml_value(v)}\n"
            for k, v in {**run_config, "marks-file": str(marks_file)}.items()
        )
    )
    env = {
        **os.environ,
        "FLWR_HOME": str(home),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(http_port),
        "FLWR_LOCAL_CONTROL_API_PORT": str(control_port),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    cmd = [
        str(Path(sys.executable).parent / "flwr"),
        "run",
        str(BENCH_DIR),
        "bench",
        "--stream",
        "--run-config",
        str(overrides),
    ]
    launched = time.time()
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        exited, failure = (
            time.time(),
            None if done.returncode == 0 else f"flwr run exited {done.returncode}",
        )
        output = done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        exited, failure = time.time(), f"timed out after {timeout:.0f} s"
        output = str(exc.stdout or "") + str(exc.stderr or "")
    finally:
        stopped = stop_local_superlink(http_port)
    (home / "flwr_run.log").write_text(output)
    marks = json.loads(marks_file.read_text()) if marks_file.exists() else []
    out: dict = {
        "nodes": nodes,
        "ray_actors": actors,
        "cpus_per_actor": max(1, cpus // actors),
        "flwr_run_exit_s": exited - launched,
        "processes_stopped_after": stopped,
        "log": str(home / "flwr_run.log"),
    }
    if failure or not any(event == "serverapp_end" for event, _ in marks):
        out["error"] = f"{failure or 'no serverapp_end mark'}; last output: {output[-3000:]}"
        return out
    out.update(flower_timings(marks, launched, every_boundary=run_config["workload"] == "w"))
    return out


def flower_timings(marks: list, launched: float, every_boundary: bool) -> dict:
    """Start-up, round and total times from the ServerApp's marks. `every_boundary`: the marks are
    every round boundary (start of round 1 ... end of the last, as W's evaluate_fn gives them);
    otherwise they are round starts and the last round ends with the ServerApp."""
    times = {event: t for event, t in marks if event != "round_start"}
    starts = [t for event, t in marks if event == "round_start"]
    bounds = starts if every_boundary else [*starts, times["serverapp_end"]]
    rounds = [b - a for a, b in zip(bounds, bounds[1:])]
    return {
        "rounds": len(rounds),
        "launch_to_serverapp_s": times["serverapp_start"] - launched,
        "startup_s": starts[0] - launched,
        "first_round_s": rounds[0],
        "steady_round_s": statistics.median(rounds[1:] if len(rounds) > 2 else rounds),
        "round_s_all": [round(r, 3) for r in rounds],
        "wall_s": times["serverapp_end"] - launched,
    }


def part_gsc_settings(args) -> list[dict]:
    """`part_gsc` once per THREADSxWORKERS setting, each in a fresh process (so its peak RSS is its
    own)."""
    out = []
    for setting in args.gsc_settings.split(","):
        print(f"  gsc {setting} (torch threads x cohort workers) ...", flush=True)
        try:
            out.append(
                run_child(
                    "--gsc-child",
                    "--gsc-settings",
                    setting,
                    "--gsc-rounds",
                    str(args.gsc_rounds),
                    *(["--quick"] if args.quick else []),
                )
            )
        except RuntimeError as exc:
            out.append({"setting": setting, "error": str(exc)})
    return out


def part_flower(args, tmp: Path) -> dict:
    """End to end, launch to finish: fedac in a fresh process against `flwr run` local
    simulation."""
    out: dict = {
        "how": "flwr run <benchmarks> <connection with address ':local:'> --stream; local "
        "SuperLink started by flwr run and stopped after each run; startup_s = launch to the first "
        "round's start, steady_round_s = median round after the first"
    }
    try:
        import flwr
        import ray

        out.update({"flwr": flwr.__version__, "ray": ray.__version__})
        flower = True
    except ImportError as exc:
        out["flower_missing"] = f"{exc}: install with `.venv/bin/pip install -e .[bench]`"
        flower = False
    rounds = w_rounds(args)
    w: dict = {"rounds": rounds, "fedac": fedac_end_to_end("w", rounds, 1, args.quick)}
    for actors in (1, 2) if flower else ():
        w[f"flower_{actors}_actor"] = flower_run(
            tmp,
            f"w-{actors}",
            W_CLIENTS,
            actors,
            {"workload": "w", "nodes": W_CLIENTS, "rounds": rounds, "lr": 0.01, "torch-threads": 1},
            timeout=1800,
        )
    out["w"] = w
    count, rounds = fedmlac_clients(args), args.fedmlac_rounds
    m: dict = {
        "clients": count,
        "per_round": count // 5,
        "rounds": rounds,
        "fedac_1_worker": fedac_end_to_end("fedmlac", rounds, 1, args.quick),
        "fedac_2_workers": fedac_end_to_end("fedmlac", rounds, 2, args.quick),
    }
    fedac_set = ";".join(
        [*BASE_SETTINGS, *FEDMLAC_SETTINGS, f"data.num_clients={count}", f"train.rounds={rounds}"]
    )
    for actors in (1, 2) if flower else ():
        m[f"flower_{actors}_actor"] = flower_run(
            tmp,
            f"fedmlac-{actors}",
            count,
            actors,
            {
                "workload": "fedmlac",
                "rounds": rounds,
                "fedac-set": fedac_set,
                "min-nodes": count,
                "poll-interval": 0.05,
                "run-dir": str(tmp / f"flower-fedmlac-{actors}"),
            },
            timeout=3600,
        )
    out["fedmlac"] = m
    for part in (w, m):
        for name, run in list(part.items()):
            if name.startswith("flower") and "wall_s" in run:
                for fedac_name, fedac in part.items():
                    if fedac_name.startswith("fedac"):
                        run[f"{fedac_name}_speedup_end_to_end"] = run["wall_s"] / fedac["wall_s"]
    return out


def machine() -> dict:
    return {
        **cpu_info(),
        "torch_threads_default": torch.get_num_threads(),
        "torch_threads_used": 1,
        "load_average_start": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer clients and repeats (smoke run)"
    )
    parser.add_argument(
        "--parts",
        default="threads,w,vmap,fedmlac,gsc,flower",
        help="comma list of threads,w,vmap,fedmlac,gsc,flower",
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="timed rounds per path (default 9, quick 3)"
    )
    parser.add_argument(
        "--gsc-settings",
        default="1x1,1x2,2x1",
        help="GSC runs as THREADSxWORKERS (torch intra-op threads x cohort worker threads)",
    )
    parser.add_argument("--gsc-rounds", type=int, default=3)
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON path (default benchmarks/results/cohort-<utc>.json)",
    )
    parser.add_argument(
        "--threads-repeats", type=int, default=5, help="timed rounds per thread setting"
    )
    parser.add_argument(
        "--fedmlac-rounds",
        type=int,
        default=None,
        help="rounds of the end-to-end FedMLAC runs, fedac and Flower (default 10, quick 2)",
    )
    parser.add_argument("--gsc-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--e2e-child", choices=("w", "fedmlac"), default=None, help=argparse.SUPPRESS
    )
    parser.add_argument("--e2e-rounds", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--e2e-workers", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--threads-child", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.repeats = args.repeats or (3 if args.quick else 9)
    args.fedmlac_rounds = args.fedmlac_rounds or (2 if args.quick else 10)
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"fedac-bench-{os.getpid()}"
    torch.set_num_threads(1)

    if args.threads_child:
        print(json.dumps(floor_child(args)))
        return
    if args.e2e_child:
        print(json.dumps(e2e_child(args, tmp)))
        return
    if args.gsc_child:
        args.gsc_threads, args.gsc_workers = (int(v) for v in args.gsc_settings.split("x"))
        print(json.dumps(part_gsc(args, tmp)))
        return

    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    report: dict = {
        "benchmark": "cohort",
        "issue": 6,
        "started_utc": datetime.now(timezone.utc).isoformat(),
        "quick": args.quick,
        "machine": machine(),
        "repeats": args.repeats,
    }
    runs = {  # part: (what it measures, how), in this order
        "threads": ("sequential floor with 1 and 2 torch threads", lambda: part_threads(args)),
        "w": ("workload W, floor / sequential / cohort", lambda: part_w(args, tmp)),
        "vmap": (
            "torch.func vmap(grad) vs the stacked formulation vs a loop",
            lambda: part_vmap(args),
        ),
        "fedmlac": (
            "CRNN-Base + CRNN-Lite Plug-in, floor / sequential / cohort",
            lambda: part_fedmlac(args, tmp),
        ),
        "gsc": ("2,618 clients, one fresh process per setting", lambda: part_gsc_settings(args)),
        "flower": (
            "end to end, fedac vs Flower's simulation (W, then FedMLAC)",
            lambda: part_flower(args, tmp),
        ),
    }
    for name, (what, run) in runs.items():
        if name in parts:
            print(f"{name}: {what} ...", flush=True)
            report[name] = run()
    report["machine"]["load_average_end"] = os.getloadavg()
    report["finished_utc"] = datetime.now(timezone.utc).isoformat()
    write_report(
        report,
        args.out
        or RESULTS / f"cohort-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}.json",
        summary(report),
    )


def summary(report: dict) -> dict:
    """The headline numbers (the full samples are in the JSON)."""
    out = {}
    for part in ("w", "fedmlac"):
        if part in report:
            out[part] = {
                k: {
                    m: round(v[m], 4)
                    for m in (
                        "wall_s",
                        "cpu_s",
                        "vs_floor_wall",
                        "vs_floor_cpu",
                        "vs_floor_cpu_paired",
                    )
                    if m in v
                }
                for k, v in report[part].items()
                if isinstance(v, dict) and "cpu_s" in v
            }
    for name, v in report.get("vmap", {}).items():
        if isinstance(v, dict):
            out[f"vmap_{name}"] = {k: round(x.get("vs_floor_cpu", 1.0), 3) for k, x in v.items()}
    if "threads" in report:
        out["threads"] = {
            k: {"wall_s": round(v["wall_s"], 4), "cpu_s": round(v["cpu_s"], 4)}
            for k, v in report["threads"].items()
            if isinstance(v, dict)
        }
    for part in ("w", "fedmlac"):
        for name, run in report.get("flower", {}).get(part, {}).items():
            if isinstance(run, dict):
                out[f"e2e_{part}_{name}"] = {
                    k: round(v, 3) if isinstance(v, float) else v
                    for k, v in run.items()
                    if k
                    in ("wall_s", "startup_s", "first_round_s", "steady_round_s", "run_s", "error")
                    or k.endswith("speedup_end_to_end")
                }
    for g in report.get("gsc", []):
        name = f"gsc_threads_{g.get('torch_threads')}_workers_{g.get('cohort_workers')}"
        out[g.get("setting", name)] = {
            k: g.get(k)
            for k in (
                "s_per_round_wall",
                "s_per_round_cpu",
                "peak_rss_mb",
                "load_average_start",
                "error",
            )
            if k in g
        }
    return out


if __name__ == "__main__":
    main()
