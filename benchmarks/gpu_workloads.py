"""bench_gpu.py's workloads (its docstring describes them): each builds its paths, puts its node in
the report (`args.live`) and times the paths into it (gpu_timing.run_paths)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from bench_paper import SETTINGS as PAPER_SETTINGS
from fedac.algorithms.base import ClientData, Task
from fedac.config import load_config
from fedac.data.waveform import Padded
from fedac.engine.data import FederatedData, build_federated_data
from fedac.experiments.fedkws import KWS_NETWORKS, KWS_PROTOCOL
from fedac.models import build_model
from fedac.models.crnn import CRNN_SPECS
from gpu_timing import (
    NO_EVAL,
    SCHEDULE,
    cohort,
    device_settings,
    fedac_path,
    floor_path,
    flop_counter,
    run_paths,
    scale,
    step_flops,
    with_cpu,
)
from workloads import (
    FEATURES,
    FEDMLAC_SETTINGS,
    FRAMES,
    MutualFloor,
    SupervisedFloor,
    capture_reports,
    federated,
    gsc_scale_clients,
)

REPO = Path(__file__).resolve().parents[1]
SSL_CLIPS, SSL_FRAMES, SSL_CLASSES = 16, 49, 35


# --- workloads ------------------------------------------------------------------------------------


def workload_paper(args, tmp: Path) -> dict:
    fraction = scale(args, "paper_fraction")
    overrides = [*PAPER_SETTINGS, f"train.fraction={fraction}"]
    cfg = load_config(
        REPO / "configs" / "paper.yaml", overrides=[*overrides, *device_settings(args)]
    )
    cpu_cfg = lambda: load_config(
        REPO / "configs" / "paper.yaml", overrides=[*overrides, "train.device=cpu"]
    )  # noqa: E731
    data = lambda: build_federated_data(cpu_cfg(), progress=False)  # noqa: E731 - on the CPU: each Simulator places it
    sample = data()
    names = [c.name for c in sample.clients if c.num_samples > 0]
    t = cfg.train

    def floor(device):
        return MutualFloor(
            sample.clients,
            device=device,
            pick=cohort(cfg, names),
            lr=t.lr,
            batch=t.batch_size,
            classes=sample.task.num_classes,
        )

    flops = step_flops(
        MutualFloor(sample.clients[:1], classes=sample.task.num_classes),
        torch.randn(4, sample.task.num_features, sample.clients[0].x.shape[-1]),
        torch.zeros(4, dtype=torch.long),
    )
    paths = with_cpu(
        args,
        {
            "fedac": fedac_path(cfg, data, tmp / "paper"),
            "plain": floor_path(lambda: floor(args.device)),
        },
        lambda: fedac_path(cpu_cfg(), data, tmp / "paper-cpu"),
    )
    out = args.live(
        {
            "clients": len(names),
            "per_round": len(cohort(cfg, names)(1)),
            "flop_per_sample": flops,
            "paths": {},
        }
    )
    run_paths(args, paths, flops, into=out["paths"])
    return out


def workload_gsc(args, tmp: Path) -> dict:
    count = scale(args, "gsc_clients")
    data = lambda: federated(gsc_scale_clients(count))  # noqa: E731
    settings = [*SCHEDULE, *FEDMLAC_SETTINGS, *NO_EVAL]
    cfg = load_config(overrides=[*settings, *device_settings(args)])
    clients = gsc_scale_clients(count)
    names = [c.name for c in clients]
    flops = step_flops(
        MutualFloor(clients[:1]), torch.randn(4, FEATURES, FRAMES), torch.zeros(4, dtype=torch.long)
    )
    # fedac and the plain loop first: their ratio is the number a lent machine's check waits for
    paths = {
        "fedac": fedac_path(cfg, data, tmp / "gsc", resident=True),
        "plain": floor_path(
            lambda: MutualFloor(clients, device=args.device, pick=cohort(cfg, names))
        ),
    }
    # packing's choice (auto: chunks from free memory) against the CPU's 16
    if args.device.type == "cuda":
        paths["fedac_chunk16"] = fedac_path(
            load_config(overrides=[*settings, *device_settings(args), "train.cohort_chunk=16"]),
            data,
            tmp / "gsc16",
            resident=True,
        )
        # the stacked GRU's recurrence: the Triton kernel (auto's choice on a GPU) against the
        # pure-torch loop
        paths["fedac_gru_torch"] = fedac_path(
            load_config(overrides=[*settings, *device_settings(args), "train.gru_kernel=torch"]),
            data,
            tmp / "gsc-gru",
            resident=True,
        )
    paths = with_cpu(
        args,
        paths,
        lambda: fedac_path(
            load_config(overrides=[*settings, "train.device=cpu"]),
            data,
            tmp / "gsc-cpu",
            resident=True,
        ),
    )
    out = args.live(
        {
            "clients": count,
            "per_round": len(cohort(cfg, names)(1)),
            "flop_per_sample": flops,
            "paths": {},
        }
    )
    run_paths(args, paths, flops, into=out["paths"])
    return out


KWS_CLASSES = 12
KWS_TRAIN = [
    s
    for s in KWS_PROTOCOL
    if s.startswith("train.")
    and not s.startswith(
        (
            "train.rounds=",
            "train.eval_every=",
            "train.checkpoint_every=",
            "train.select=",
            "train.test_curve=",
            "train.local_steps=",
            "train.fraction=",
        )
    )
]
"""FedKWS-UI's local training (batch 32, lr, weight decay, clipping at 50) without its schedule."""


def workload_kws(args, tmp: Path) -> dict:
    count, steps = scale(args, "kws_clients"), scale(args, "kws_steps")
    cpu_per_round = scale(args, "kws_cpu_per_round")
    data = lambda: federated(gsc_scale_clients(count, KWS_CLASSES), classes=KWS_CLASSES)  # noqa: E731
    clients = gsc_scale_clients(count, KWS_CLASSES)
    names = [c.name for c in clients]
    out: dict = args.live(
        {"clients": count, "per_round": count // 2, "local_steps": steps, "networks": {}}
    )
    for label, network in KWS_NETWORKS:
        print(f"  {label}", flush=True)
        base = [
            "algorithm=fedavg",
            *KWS_TRAIN,
            *network,
            f"train.local_steps={steps}",
            f"train.batch_size={scale(args, 'kws_batch')}",
            *NO_EVAL,
        ]
        cfg = load_config(overrides=[*base, "train.fraction=0.5", *device_settings(args)])
        cpu_cfg = lambda base=base: load_config(  # noqa: E731
            overrides=[*base, f"train.fraction={cpu_per_round / count}", "train.device=cpu"]
        )
        t = cfg.train

        def floor(device, cfg=cfg, t=t):
            return SupervisedFloor(
                clients,
                model=build_model(cfg.model.name, FEATURES, KWS_CLASSES),
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

        flops = step_flops(
            floor("cpu"), torch.randn(4, FEATURES, FRAMES), torch.zeros(4, dtype=torch.long)
        )
        paths = with_cpu(
            args,
            {
                "fedac": fedac_path(cfg, data, tmp / f"kws-{label}"),
                "plain": floor_path(lambda floor=floor: floor(args.device)),
            },
            (
                lambda cpu_cfg=cpu_cfg, label=label: fedac_path(
                    cpu_cfg(), data, tmp / f"kws-{label}-cpu"
                )
            )
            if cpu_per_round
            else None,
        )
        out["networks"][label] = {
            "model": cfg.model.name,
            "optimizer": t.optimizer,
            "flop_per_sample": flops,
            "paths": {},
        }
        run_paths(args, paths, flops, into=out["networks"][label]["paths"])
    return out


class HFExitClassifier(nn.Module):
    """The plain Hugging Face model at an exit: Wav2Vec2Model's feature projection and encoder with
    its layers cut at `depth`, on the frozen CNN's frames, [mean; std] pooling and a linear head."""

    def __init__(self, size: str, depth: int, classes: int):
        from transformers import Wav2Vec2Model

        # the same sizes as fedac's (a transformers Wav2Vec2Config)
        from fedac.models.ssl import size_config

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
    """Each client's 16 clips of 1 s as CNN frames (49 x conv, float16 as the engine caches
    them)."""
    g = torch.Generator().manual_seed(0)
    return [
        torch.randn(SSL_CLIPS, SSL_FRAMES, conv, generator=g).to(torch.float16)
        for _ in range(count)
    ]


def workload_w2v2(args, tmp: Path) -> dict:
    from fedac.models.ssl_sizes import SIZES

    size, count = scale(args, "ssl_size"), scale(args, "ssl_clients")
    cpu_per_round = scale(args, "ssl_cpu_per_round")
    conv = SIZES[size].conv
    frames = ssl_clients(count, conv)
    labels = [
        torch.randint(0, SSL_CLASSES, (SSL_CLIPS,), generator=torch.Generator().manual_seed(i))
        for i in range(count)
    ]
    lengths = torch.full((SSL_CLIPS,), SSL_FRAMES)
    names = [f"client{i:04d}" for i in range(count)]

    def data() -> FederatedData:
        clients = [
            ClientData(
                n,
                Padded(x, lengths.clone()),
                y,
                Padded.stack([], (conv,)),
                torch.zeros(0, dtype=torch.long),
            )
            for n, x, y in zip(names, frames, labels)
        ]
        return FederatedData(Task(conv, SSL_CLASSES, names), None, clients, None, None)  # type: ignore[arg-type]

    plain_clients = [ClientData(n, x, y, x[:0], y[:0]) for n, x, y in zip(names, frames, labels)]
    base = [
        "algorithm=earlyexit",
        f"model.name={size}",
        "model.encoder_path=random",
        "earlyexit.mode=homo",
        "train.batch_size=8",
        "train.local_epochs=1",
        "train.local_steps=0",
        *NO_EVAL,
    ]
    out: dict = args.live(
        {
            "size": size,
            "clients": count,
            "per_round": count // 2,
            "clips_per_client": SSL_CLIPS,
            "frames_per_clip": SSL_FRAMES,
            "depths": {},
        }
    )
    last = SIZES[size].layers
    for depth in (3, 6, 9, 12):
        print(f"  exit {depth}", flush=True)
        settings = [*base, f"earlyexit.depth={depth}"]
        cfg = load_config(overrides=[*settings, "train.fraction=0.5", *device_settings(args)])
        layer = max(1, round(depth * last / 12))
        t = cfg.train

        def floor(device, layer=layer, t=t, cfg=cfg):
            model = HFExitClassifier(size, layer, SSL_CLASSES)
            return SupervisedFloor(
                plain_clients,
                model=model,
                lr=t.lr,
                device=device,
                pick=cohort(cfg, names),
                batch=t.batch_size,
                optimizer=t.optimizer,
                momentum=t.momentum,
                weight_decay=t.weight_decay,
                max_grad_norm=t.max_grad_norm,
            )

        flops = step_flops(floor("cpu"), frames[0][:2], labels[0][:2])
        paths = {"fedac": fedac_path(cfg, data, tmp / f"w2v2-{depth}")}
        if depth == 12:
            paths["plain"] = floor_path(lambda floor=floor: floor(args.device))
            cpu_cfg = lambda settings=settings: load_config(  # noqa: E731
                overrides=[*settings, f"train.fraction={cpu_per_round / count}", "train.device=cpu"]
            )
            with_cpu(
                args,
                paths,
                (lambda: fedac_path(cpu_cfg(), data, tmp / "w2v2-cpu")) if cpu_per_round else None,
            )
        node = out["depths"][str(depth)] = {"layer": layer, "flop_per_sample": flops, "paths": {}}
        result = run_paths(args, paths, flops, into=node["paths"])
        node["peak_gpu_mb"] = result["fedac"].get("peak_gpu_mb")
    return out


class ImpressionFloor:
    """Eq. 3 as a user writes it: per report, per new class, per batch of di_batch rows, Adam on the
    batch's mean soft-label cross-entropy of model(x) / tau, x re-z-scored after every step; one
    batch after another."""

    def __init__(self, reports, zs, count: int, shape: tuple[int, ...], features: int, device):
        self.zs, self.count, self.shape, self.device = zs, count, shape, device
        self.models = []
        for report in reports:
            model = build_model(
                report["arch"], features, report["num_known"] + len(report["local_ids"])
            )
            model.load_state_dict({k: v.cpu() for k, v in report["state"].items()})
            self.models.append(
                (model.to(device).eval().requires_grad_(False), len(report["local_ids"]))
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
    count, classes = len(first[0][0][0]), sum(len(r["local_ids"]) for r in reports)
    shape = tuple(alg.public_x.shape[1:])
    per_class_samples = count * steps

    def fedac(runner, reports):
        return lambda: (
            (lambda r: runner.algorithm.synthesize_reports(reports, 4)),
            lambda r: classes * per_class_samples,
        )

    def cpu_side():
        return fedac(
            *capture_reports("speech_commands", steps, ("train.device=cpu",), str(tmp / "zs-cpu"))
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
            "reports": [(r["user"], r["arch"], len(r["local_ids"])) for r in reports],
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


def gru_case(args, clients: int):
    """One direction of CRNN-Base's GRU for a packed chunk at GSC scale: its input frames (K, T * B,
    C), stacked weights and an upstream gradient, on the run's device (frames after two poolings of
    101)."""
    spec, b, t = CRNN_SPECS["crnn_base"], 16, FRAMES // 4
    c, hidden = spec.conv_channels[-1], spec.hidden
    gen = torch.Generator().manual_seed(0)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(args.device).requires_grad_()

    inputs = (
        rand(clients, t * b, c),
        rand(clients, 3 * hidden, c, scale=0.1),
        rand(clients, 3 * hidden, scale=0.1),
        rand(clients, 3 * hidden, hidden, scale=0.1),
        rand(clients, 3 * hidden, scale=0.1),
    )
    return inputs, torch.randn(clients, t, b, hidden, generator=gen).to(args.device), t, b


def workload_gru(args, tmp: Path) -> dict:
    """The stacked GRU's recurrence, forward and backward of one layer direction for a packed chunk
    (a "round" is 5 of them), each way a GPU can run it (issue 45, item 2): fedac's pure-torch
    recurrence (`torch`), the Triton kernel (`triton`), the torch recurrence replayed from a CUDA
    graph (`torch_graph`), and `plain`: one cuDNN GRU call per client (torch.gru with that client's
    weights), what a per-client loop runs."""
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
        # (K, B, T, C)
        x = frames.detach().view(clients, t, b, -1).transpose(1, 2).contiguous().requires_grad_()
        weights = [w_ih, w_hh, b_ih, b_hh]
        grads = grad.transpose(1, 2).contiguous()

        def once() -> None:
            outs = [
                torch.gru(
                    x[k],
                    x.new_zeros(1, b, w_hh.shape[2]),
                    [w[k] for w in weights],
                    True,
                    1,
                    0.0,
                    True,
                    False,
                    True,
                )[0]
                for k in range(clients)
            ]
            torch.autograd.grad(outs, [x, *weights], list(grads.unbind(0)))

        return (lambda r: [once() for _ in range(reps)]), (lambda r: clients * reps)

    paths = {"torch": layer_path("torch")}
    if args.device.type == "cuda":
        paths["triton"] = layer_path("triton")
        paths["torch_graph"] = graph_path
    paths["plain"] = plain_path
    out = args.live(
        {
            "clients": clients,
            "shape": dict(
                zip(
                    ("K", "T", "B", "C", "H"),
                    (
                        clients,
                        FRAMES // 4,
                        16,
                        CRNN_SPECS["crnn_base"].conv_channels[-1],
                        CRNN_SPECS["crnn_base"].hidden,
                    ),
                )
            ),
            "sample": "one client's forward and backward of the layer",
            "paths": {},
        }
    )
    try:
        run_paths(args, paths, None, into=out["paths"])
    finally:
        kernels.set_gru_kernel("auto")
    timed = {
        name: r["s_per_round"] / reps for name, r in out["paths"].items() if "s_per_round" in r
    }
    out.update({"s_per_layer": timed, "fastest": min(timed, key=timed.get) if timed else None})
    return out


def workload_torchrun(args, tmp: Path) -> dict:
    """Several processes on one device (issue 59): the default run (FedAvg, 24 clients a round) as
    one process and as 2 torchrun processes that share the device (`--set train.device=cuda`: both
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


RUNS = {
    "paper": workload_paper,
    "gsc": workload_gsc,
    "kws": workload_kws,
    "w2v2": workload_w2v2,
    "impressions": workload_impressions,
    "gru": workload_gru,
    "torchrun": workload_torchrun,
}
