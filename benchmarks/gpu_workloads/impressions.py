"""bench_gpu.py's `impressions` workload: zero-shot data-impression synthesis (Eq. 3) of round 4's
reports of the homogeneous scenario (bench_impressions.py's capture), fedac's `synthesize_reports`,
against `plain`: ImpressionFloor, Eq. 3 as a user writes it (one batch of impressions after another,
per report and new class), on the same device; fedac_cpu is fedac's CPU default. Timed per new class
(`s_per_class`). No target is set for it."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from fedac.models import build_model
from gpu_timing import device_settings, floor_path, flop_counter, run_paths, scale, with_cpu
from workloads import capture_reports


class ImpressionFloor:
    """Eq. 3 as a user writes it: per report, per new class, per batch of di_batch rows, Adam on the
    batch's mean soft-label cross-entropy of model(x) / tau, x re-z-scored after every step; one
    batch after another."""

    def __init__(self, reports, zs, count: int, shape: tuple[int, ...], features: int, device):
        self.zs, self.count, self.shape, self.device = zs, count, shape, device
        self.models = []
        for report in reports:
            model = build_model(report.arch, features, report.num_known + len(report.local_ids))
            model.load_state_dict({k: v.cpu() for k, v in report.state.items()})
            self.models.append(
                (model.to(device).eval().requires_grad_(False), len(report.local_ids))
            )
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
    runner, reports = capture_reports(
        "speech_commands", steps, tuple(device_settings(args)), str(tmp / "zs")
    )
    alg, zs = runner.algorithm, runner.cfg.zeroshot
    first = alg.synthesize_reports(reports, 4)
    count, classes = len(first[0][0][0]), sum(len(r.local_ids) for r in reports)
    shape = tuple(alg.public_x.shape[1:])
    per_class_samples = count * steps

    def fedac(runner, reports):
        return lambda: (
            (lambda r: runner.algorithm.synthesize_reports(reports, 4)),
            lambda r: classes * per_class_samples,
        )

    def cpu_side():
        return fedac(
            *capture_reports("speech_commands", steps, ("runtime.device=cpu",), str(tmp / "zs-cpu"))
        )

    probe = ImpressionFloor(reports[:1], zs, count, shape, alg.task.num_features, "cpu")
    model = probe.models[0][0].requires_grad_(False)
    x = torch.randn(2, *shape, requires_grad=True)
    with flop_counter() as counter:
        F.log_softmax(model(x), 1).sum().backward()
    flops = counter.get_total_flops() / 2  # per impression and step
    paths = with_cpu(
        args,
        {
            "fedac": fedac(runner, reports),
            "plain": floor_path(
                lambda: ImpressionFloor(
                    reports, zs, count, shape, alg.task.num_features, args.device
                )
            ),
        },
        cpu_side,
    )
    out = args.live(
        {
            "reports": [(r.user, r.arch, len(r.local_ids)) for r in reports],
            "classes": classes,
            "impressions_per_class": count,
            "di_steps": steps,
            "di_batch": zs.di_batch,
            "flop_per_sample": flops,
            "sample": "one impression for one Adam step",
            "paths": {},
        }
    )
    for r in run_paths(args, paths, flops, cpu_rounds=1, into=out["paths"]).values():
        if "s_per_round" in r:  # a "round" synthesizes every class of the round's reports
            r["s_per_class"] = r["s_per_round"] / classes
    return out
