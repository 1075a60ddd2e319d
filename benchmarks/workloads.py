"""The benchmark workloads (issue 6), shared by bench_cohort.py, bench_gpu.py and the Flower apps in
flower_apps.py.

Both sides build the same data from the same seeds: random 40 x 101 features (the timing does not
depend on their values), so fedac, the plain-torch floor and Flower's simulation train identical
clients. The floors (`SupervisedFloor`, `MutualFloor`) are the loops a user would write: one model,
one client after another, plain torch (the networks are the model zoo's nn.Modules, so both sides
train the same network), on the CPU or a GPU.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F

from fedac.algorithms.base import ClientData, Task
from fedac.config import Config, load_config
from fedac.engine.data import EvalSplit, FederatedData
from fedac.models import build_model

FEATURES, FRAMES, CLASSES = 40, 101, 35
SAMPLES = 40
"""Training windows per client (W and FedMLAC at 500 clients)."""
EVAL_CLIPS = 200
"""Clips of the validation and test splits in end-to-end runs."""

#: Workload W: 1 local epoch, batch 16, plain SGD lr 0.01, dropout 0.1, one torch thread; no
#: periodic evaluation or checkpoints unless a run asks for them.
BASE_SETTINGS = [
    "train.lr=0.01",
    "train.momentum=0.0",
    "train.local_epochs=1",
    "train.batch_size=16",
    "runtime.threads=1",
    "runtime.cohort_workers=1",
    "model.dropout=0.1",
    "train.checkpoint_every=1000000",
    "train.eval_every=1000000",
]
W_SETTINGS = ["algorithm=fedavg", "model.name=crnn_lite", "train.fraction=0.1"]
W_CLIENTS, W_PER_ROUND = 100, 10
#: FedMLAC: CRNN-Base personalized models, CRNN-Lite Plug-in, 20 % of the clients per round, LPA.
FEDMLAC_SETTINGS = [
    "algorithm=fedmlac",
    "model.client_model=crnn_base",
    "fedmlac.plugin_model=crnn_lite",
    "train.fraction=0.2",
]
GSC_CLIENTS = 2618
"""Speakers of Speech Commands v0.02's training list: the GSC-scale federation
(`gsc_scale_clients`)."""


def make_clients(
    count: int, sizes: list[int], holdout: float = 0.0, seed: int = 0, classes: int = CLASSES
) -> list[ClientData]:
    g = torch.Generator().manual_seed(seed)
    clients = []
    for i, n in zip(range(count), sizes):
        n_hold = int(holdout * n)
        x = torch.randn(n, FEATURES, FRAMES, generator=g)
        y = torch.randint(0, classes, (n,), generator=g)
        clients.append(
            ClientData(
                f"client{i:04d}",
                x[n_hold:].contiguous(),
                y[n_hold:].contiguous(),
                x[:n_hold].contiguous(),
                y[:n_hold].contiguous(),
            )
        )
    return clients


def federated(
    clients: list[ClientData], eval_clips: int = 0, seed: int = 1, classes: int = CLASSES
) -> FederatedData:
    g = torch.Generator().manual_seed(seed)

    def split() -> EvalSplit:
        return EvalSplit(
            torch.randn(eval_clips, FEATURES, FRAMES, generator=g),
            torch.arange(eval_clips),
            torch.randint(0, classes, (eval_clips,), generator=g),
        )

    return FederatedData(
        Task(FEATURES, classes, [c.name for c in clients]),
        None,
        clients,  # type: ignore[arg-type]
        split() if eval_clips else None,
        split() if eval_clips else None,
    )  # type: ignore[arg-type]


@lru_cache(maxsize=4)
def uniform_federation(count: int, eval_clips: int = EVAL_CLIPS) -> FederatedData:
    """`count` clients of SAMPLES windows each, with validation / test splits (cached per
    process)."""
    return federated(make_clients(count, [SAMPLES] * count), eval_clips)


def gsc_scale_clients(count: int = GSC_CLIENTS, classes: int = CLASSES) -> list[ClientData]:
    """GSC scale: `count` clients of 20-60 windows (mean 40; 20 % held out locally, as the GSC
    protocol does), random 40 x 101 features."""
    sizes = np.random.default_rng(0).integers(20, 61, size=count).tolist()
    return make_clients(count, sizes, holdout=0.2, classes=classes)


def config(*overrides: str) -> Config:
    return load_config(overrides=[*BASE_SETTINGS, *overrides])


def cpu_info() -> dict:
    """The CPU a benchmark ran on, for its JSON: the model name (`lscpu`'s, from /proc/cpuinfo), the
    vector width torch's kernels and the fused GRU's build use (torch's CPU capability, which
    honours ATEN_CPU_CAPABILITY) and the CPU's own AVX2 / AVX-512 flags, so figures from different
    machines are never compared unawares."""
    import os
    import platform

    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())  # the first CPU's
    except OSError:  # not Linux: the capability still says what ran
        pass
    flags = set(fields.get("flags", "").split())
    # a VM may name only "AMD EPYC": vendor, family and model still tell the generation (25/17: Zen
    # 4)
    return {
        "cpu_model": fields.get("model name", "?"),
        "cpu_vendor": fields.get("vendor_id", "?"),
        "cpu_family_model": f"{fields.get('cpu family', '?')}/{fields.get('model', '?')}",
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_avx2": "avx2" in flags,
        "cpu_avx512f": "avx512f" in flags,
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


# --- the floors: plain torch loops, no fedac code in the loop -------------------------------------


def sample(clients: list[ClientData], per_round: int, round_idx: int) -> list[ClientData]:
    picked = np.random.default_rng(round_idx).choice(len(clients), per_round, replace=False)
    return [clients[i] for i in sorted(picked)]


def plain_batches(n: int, batch: int, steps: int = 0, device="cpu") -> list[torch.Tensor]:
    """One local update's index batches, as a user writes them: one shuffled epoch (steps=0), or
    exactly `steps` batches, reshuffling when the data runs out (partial last batch kept)."""
    if steps <= 0:
        return list(torch.randperm(n, device=device).split(batch))
    out: list[torch.Tensor] = []
    while len(out) < steps and n > 0:
        out += list(torch.randperm(n, device=device).split(batch))[: steps - len(out)]
    return out


class Floor:
    """One client after another: every client's data moved to `device` up front (a resident dataset,
    as fedac's engine holds it), the global weights loaded into one model, fresh optimizers, `step`
    per batch. `pick(round_idx)` names the round's clients (default: `per_round` drawn from the
    round index)."""

    def __init__(
        self,
        clients: list[ClientData],
        per_round: int = 0,
        device="cpu",
        pick=None,
        batch: int = 16,
        steps: int = 0,
    ):
        self.clients, self.device, self.batch, self.steps = (
            {c.name: c for c in clients},
            torch.device(device),
            batch,
            steps,
        )
        self.pick = pick or (lambda r: [c.name for c in sample(clients, per_round, r)])
        # no copy on the CPU
        self.resident = {c.name: (c.x.to(self.device), c.y.to(self.device)) for c in clients}
        self.samples = 0
        """Samples trained in the last round."""

    def __call__(self, round_idx: int) -> None:
        self.samples = 0
        for name in self.pick(round_idx):
            x, y = self.resident[name]
            optimizers = self.start(name)
            for idx in plain_batches(len(y), self.batch, self.steps, self.device):
                self.step(x[idx], y[idx], optimizers)
                self.samples += len(idx)
            self.finish(name)

    def start(self, name: str) -> list[torch.optim.Optimizer]:
        raise NotImplementedError

    def step(
        self, x: torch.Tensor, y: torch.Tensor, optimizers: list[torch.optim.Optimizer]
    ) -> None:
        raise NotImplementedError

    def finish(self, name: str) -> None:
        """After a client's last step (a personalized model is kept here)."""


class SupervisedFloor(Floor):
    """FedAvg's local steps: cross-entropy, SGD (or AdamW), optional gradient clipping. `model`: a
    model zoo name or an nn.Module."""

    def __init__(
        self,
        clients,
        per_round=0,
        model="crnn_lite",
        lr=0.01,
        device="cpu",
        pick=None,
        batch=16,
        steps=0,
        optimizer="sgd",
        momentum=0.0,
        weight_decay=0.0,
        max_grad_norm=0.0,
    ):
        super().__init__(clients, per_round, device, pick, batch, steps)
        self.lr, self.optimizer, self.momentum, self.weight_decay, self.max_grad_norm = (
            lr,
            optimizer,
            momentum,
            weight_decay,
            max_grad_norm,
        )
        self.model = (
            build_model(model, FEATURES, CLASSES, 0.1) if isinstance(model, str) else model
        ).to(self.device)
        self.global_state = {k: v.clone() for k, v in self.model.state_dict().items()}

    def start(self, name):
        self.model.load_state_dict(self.global_state)
        self.model.train()
        if self.optimizer == "adamw":
            return [
                torch.optim.AdamW(
                    self.model.parameters(), lr=self.lr, weight_decay=self.weight_decay
                )
            ]
        return [
            torch.optim.SGD(
                self.model.parameters(),
                lr=self.lr,
                momentum=self.momentum,
                weight_decay=self.weight_decay,
            )
        ]

    def loss(self, x, y):
        return F.cross_entropy(self.model(x), y)

    def step(self, x, y, optimizers):
        loss = self.loss(x, y)
        optimizers[0].zero_grad()
        loss.backward()
        if self.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        optimizers[0].step()


class MutualFloor(Floor):
    """FedMLAC's steps (personalized CE + KL step, then Plug-in KL step, per batch) in a plain loop,
    every client's personalized model kept (on `device`)."""

    def __init__(
        self, clients, per_round=0, lr=0.01, device="cpu", pick=None, batch=16, classes=CLASSES
    ):
        super().__init__(clients, per_round, device, pick, batch)
        self.lr = lr
        self.omega = build_model("crnn_base", FEATURES, classes, 0.1).to(self.device)
        self.theta = build_model("crnn_lite", FEATURES, classes, 0.1).to(self.device)
        self.states = {
            c.name: {k: v.clone() for k, v in self.omega.state_dict().items()} for c in clients
        }
        self.plugin = {k: v.clone() for k, v in self.theta.state_dict().items()}
        self.name = ""

    def start(self, name):
        self.name = name
        self.omega.load_state_dict(self.states[name])
        self.theta.load_state_dict(self.plugin)
        self.omega.train(), self.theta.train()
        return [
            torch.optim.SGD(self.omega.parameters(), lr=self.lr),
            torch.optim.SGD(self.theta.parameters(), lr=self.lr),
        ]

    def step(self, x, y, optimizers):
        omega, theta = self.omega, self.theta
        opt_o, opt_t = optimizers
        lo = omega(x)
        with torch.no_grad():
            lt = theta(x)
        kl_o = F.kl_div(
            F.log_softmax(lo, 1), F.log_softmax(lt, 1), log_target=True, reduction="batchmean"
        )
        loss = 0.5 * F.cross_entropy(lo, y) + 0.5 * kl_o
        opt_o.zero_grad()
        loss.backward()
        opt_o.step()
        kl_t = F.kl_div(
            F.log_softmax(theta(x), 1),
            F.log_softmax(lo.detach(), 1),
            log_target=True,
            reduction="batchmean",
        )
        opt_t.zero_grad()
        kl_t.backward()
        opt_t.step()

    def finish(self, name):
        self.states[name] = {k: v.clone() for k, v in self.omega.state_dict().items()}


# --- zero-shot FL: the reports a server synthesizes impressions from ------------------------------


def capture_reports(
    dataset: str, steps: int, overrides: tuple[str, ...] = (), out: str | None = None
):
    """Train round 4 of the homogeneous scenario (seed 0) and keep the reports the server receives:
    (the ZeroShotDriver, [report]). `out`: the runner's folder (default
    /tmp/fedac-bench-impressions-<dataset>)."""
    # lazy: the zero-shot machinery, for two benchmarks only
    from fedac.algorithms.zeroshot import ClassReport
    from fedac.engine.zeroshot import ZeroShotDriver
    from fedac.seeding import torch_generator

    cfg = load_config(
        None,
        ["zeroshot.scenario=homogeneous", f"zeroshot.di_steps={steps}", *overrides],
        algorithm="zeroshot",
        dataset=dataset,
        seed=0,
    )
    cfg.out = out or f"/tmp/fedac-bench-impressions-{dataset}"
    runner = ZeroShotDriver(cfg, cfg.out, progress=False)
    payload = runner.algorithm.broadcast(runner.algorithm.init_server())
    reports = []
    for user in runner.scenario.users:
        result = runner.algorithm.client_update(
            payload, None, runner.client_data(user, 4), 4, torch_generator(0, "bench", user)
        )
        if isinstance(result.upload, ClassReport):
            reports.append(result.upload)
    return runner, reports
