"""bench_gpu.py's `torchrun` workload (run only when named with --only): the default run (FedAvg, 24
clients a round) as 2 torchrun processes sharing one device, against one process (its baseline:
`speedup_vs_1process`), each a fresh torchrun through bench_distributed.py. No plain loop and no
target: one card shows the mechanics, not a gain of more devices."""

from __future__ import annotations

from pathlib import Path

from gpu_timing import device_settings


def workload_torchrun(args, tmp: Path) -> dict:
    """Several processes on one device (issue 59): the default run (FedAvg, 24 clients a round) as
    one process and as 2 torchrun processes that share the device (`--set runtime.device=cuda`: both
    ranks take GPU 0, and the backend is gloo, as NCCL refuses two ranks on one GPU), each a fresh
    torchrun (bench_distributed.py's `run`: median round time from round 2 on, evaluation included;
    each rank's payload bytes). One card shows the mechanics (sharing, the all-reduce, the sharded
    evaluation), not a gain of more devices."""
    from bench_distributed import run as torchrun_run

    rounds = 8 if not args.quick else 3  # (3: two gaps between rounds' rows)
    out = args.live({"rounds": rounds, "paths": {}})
    for processes in (1, 2):
        name = f"fedac_{processes}process{'es' if processes > 1 else ''}"
        if args.paths and name not in args.paths:
            continue
        print(f"    {name} ...", flush=True)
        result = torchrun_run(
            processes, rounds, device_settings(args), tmp / f"torchrun-{processes}"
        )
        out["paths"][name] = {"s_per_round": result["round_s"], "rounds": rounds, **result}
        args.save()
    one, two = (out["paths"].get(f"fedac_{p}") for p in ("1process", "2processes"))
    if one and two:
        two["speedup_vs_1process"] = one["s_per_round"] / two["s_per_round"]
    return out
