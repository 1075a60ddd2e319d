"""Stacked cohort training: the clients of one round that share an architecture train as one
computation.

The machinery here knows nothing about losses: each method writes its stacked client step on top of
it, in its own file (FedAvg's in algorithms/fedavg.py, FedMLAC's in fedmlac.py, FedKWS-UI's in
fedkwsui.py, a `LocalObjective`'s in objective.py), and `engine/execution.py` dispatches a round to
them. What it
provides:

- `plan_chunks`: each client's batch order, drawn exactly as the sequential path draws it
  (`torch_generator(seed, "batches", round, client)` through `training.local.client_batches`), laid
  out step by step. Clients are sorted by sample count (stable), so the clients still training at
  step s are a prefix of the chunk and every stacked tensor is sliced, never gathered. A client
  whose batch is smaller than the step's widest one is padded with copies of its own first sample at
  weight 0.
- chunking: at most `runtime.cohort_chunk` clients are stacked at once, which bounds the memory of
  activations kept for the backward pass; training/schedule.py cuts chunks by modelled cost
  (padding, per-step overheads, an even share per worker); `run_chunks` trains them on
  `runtime.cohort_workers` threads, costliest first. On a GPU auto packs chunks by free memory
  instead (training/packing.py).
- dropout: every client owns a generator seeded with `derive_seed(seed, "dropout", round, client)`,
  the seed the sequential path gives the global RNG, and draws its masks with the op `nn.Dropout`
  uses on CPU (`bernoulli_` into a fresh buffer, then `div_(1 - p)`), layer by layer in forward
  order. So each client sees the masks, and hence the numbers, it would see training alone.
- `StackedSGD`: torch.optim.SGD's update (momentum, weight decay) on stacked parameters, touching
  only the clients still training.
- `client_progress` / `clients_done`: a round's progress (engine/rounds.py) hears of every finished
  client, whichever path trained it, without the algorithms' hooks passing a callback along.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, as_completed, wait
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

import torch

from fedac.config import RuntimeConfig, TrainConfig
from fedac.errors import ConfigError
from fedac.seeding import torch_generator
from fedac.training.device import to_device
from fedac.training.local import client_batches, local_steps
from fedac.training.packing import Packing
from fedac.training.schedule import split_by_cost
from fedac.training.types import ClientData, ClientResult, class_labels, feature_windows

if TYPE_CHECKING:  # (the augmenting windows load the audio readers; only the annotation is needed)
    from fedac.data.augment import AugmentedWindows

_clients_done: ContextVar[Callable[[int], None] | None] = ContextVar(
    "fedac_clients_done", default=None
)


@contextmanager
def client_progress(callback: Callable[[int], None]) -> Iterator[None]:
    """Within the block, `callback(n)` hears of every n clients that finish their update (one per
    client on the sequential paths, a chunk's clients at once on the stacked one), in the caller's
    thread."""
    token = _clients_done.set(callback)
    try:
        yield
    finally:
        _clients_done.reset(token)


def clients_done(count: int) -> None:
    """Report `count` finished clients to the `client_progress` in effect (none: nothing to do)."""
    callback = _clients_done.get()
    if callback is not None:
        callback(count)


def progress_callback() -> Callable[[int], None] | None:
    """The `client_progress` callback in effect (engine/distributed.py counts a rank's share as the
    round's)."""
    return _clients_done.get()


@dataclass
class Step:
    """One SGD step of a chunk: the first `active` clients train on batches padded to `width`."""

    active: int
    width: int
    sizes: list[int]
    """Each active client's real batch size."""
    index: torch.Tensor
    """(active, width) rows of the chunk's concatenated data."""
    weight: torch.Tensor
    """(active, width): 1 / size for a client's real samples, 0 for padding (so sums are batch
    means)."""
    number: int = 0
    """The step's place in its chunk's schedule."""


class CohortChunk:
    """Up to `runtime.cohort_chunk` clients of one architecture, their data and their step
    schedule."""

    def __init__(
        self,
        positions: list[int],
        datas: list[ClientData],
        cfg: TrainConfig,
        round_idx: int,
        seed: int,
        batches: list[list[torch.Tensor]] | None = None,
    ):
        self.positions = positions
        """Where each client of the chunk sits in the caller's list."""
        self.datas = datas
        # (the SSL encoders' padded waveforms never get here: a model with a task_loss of its own
        # has no stacked form, functional.unstackable_reason)
        self.windows = [feature_windows(d.x, "the stacked path") for d in datas]
        labels = [class_labels(d.y, "the stacked path") for d in datas]
        # `features.augment`: a client's x draws fresh windows per batch
        # (data/augment.AugmentedWindows), so there is no tensor to concatenate; `batch` draws each
        # client's rows from its own generator.
        tensors = [x for x in self.windows if isinstance(x, torch.Tensor)]
        self.augmented = len(tensors) < len(datas)
        self.x = None if self.augmented else torch.cat(tensors) if len(datas) > 1 else tensors[0]
        self.y = torch.cat(labels) if len(datas) > 1 else labels[0]
        device = self.y.device
        offsets = [0]
        for d in datas[:-1]:
            offsets.append(offsets[-1] + d.num_samples)
        self.offsets = offsets
        # (a method with its own step plan, FedKWS-UI's, gives each client's batches, longest first)
        if batches is None:
            batches = [
                list(
                    client_batches(
                        d.num_samples, cfg, torch_generator(seed, "batches", round_idx, d.name)
                    )
                )
                for d in datas
            ]
        # (the virtual clock's partial work: a client's first step_limit steps)
        batches = [b if d.step_limit is None else b[: d.step_limit] for b, d in zip(batches, datas)]
        self.batches = batches
        """Each client's own rows per step (CPU indices into its data)."""
        self.client_steps = [len(b) for b in batches]
        self.steps: list[Step] = []
        for s in range(max(self.client_steps)):
            # a prefix: clients are sorted by size
            active = sum(1 for n in self.client_steps if n > s)
            rows = [batches[k][s] + offsets[k] for k in range(active)]
            sizes = [len(r) for r in rows]
            width = max(sizes)
            # planned on the host (the batch order comes from CPU generators), then moved to the
            # data
            index = torch.empty(active, width, dtype=torch.long, device="cpu")
            weight = torch.zeros(active, width, device="cpu")
            for k, r in enumerate(rows):
                index[k, : len(r)] = r
                index[k, len(r) :] = offsets[k]
                weight[k, : len(r)] = 1.0 / len(r)
            self.steps.append(
                Step(
                    active,
                    width,
                    sizes,
                    index.to(device, non_blocking=True),
                    weight.to(device, non_blocking=True),
                    s,
                )
            )
        # Masks are drawn where the activations are: on a GPU from a GPU generator with the same
        # seed (a stream of its own, so a GPU run's dropout masks differ from the CPU's).
        self._dropout_ids = [(seed, "dropout", round_idx, d.name) for d in datas]
        self._seed_generators(device)

    def _seed_generators(self, device: torch.device) -> None:
        """Each client's dropout generator on `device` and augmentation generator on the CPU, seeded
        as `train_client` seeds the global RNG. Alone, a client draws its augmentation from the
        CPU's global stream and its masks from the device's: on the CPU that is one stream
        (augmentation, then the step's masks), so there the two are one generator."""
        self.augment_generators = (
            [torch_generator(*ids) for ids in self._dropout_ids] if self.augmented else []
        )
        if self.augmented and torch.device(device).type == "cpu":
            self.dropout_generators = self.augment_generators
        else:
            self.dropout_generators = [
                torch_generator(*ids, device=device) for ids in self._dropout_ids
            ]

    @property
    def device(self) -> torch.device:
        return self.y.device

    def to(self, device: torch.device) -> CohortChunk:
        """This chunk with its data and step schedule on `device` (`runtime.devices`), its
        generators seeded anew there (every GPU draws the same masks; the CPU draws its own
        stream)."""
        if torch.device(device) == self.device:
            return self
        moved = copy.copy(self)
        moved.x = None if self.x is None else self.x.to(device)
        moved.y = self.y.to(device)
        moved.windows = [x.to(device) for x in self.windows] if self.augmented else self.windows
        moved.steps = [
            replace(s, index=s.index.to(device), weight=s.weight.to(device)) for s in self.steps
        ]
        moved._seed_generators(device)
        return moved

    def __len__(self) -> int:
        return len(self.datas)

    def batch(self, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        """(active, width, features, frames) inputs and (active, width) labels of one step
        (augmented data: each client's windows drawn afresh from its own generator, padding rows
        zero)."""
        flat = step.index.reshape(-1)
        y = self.y.index_select(0, flat).view(step.active, step.width)
        if self.augmented:
            # augmented: every client's x is AugmentedWindows (engine/data.py), not a tensor
            parts = [
                cast("AugmentedWindows", self.windows[k]).draw(
                    self.batches[k][step.number], self.augment_generators[k]
                )
                for k in range(step.active)
            ]
            x = parts[0].new_zeros(step.active, step.width, *parts[0].shape[1:])
            for k, part in enumerate(parts):
                x[k, : len(part)] = part
            return x, y
        assert self.x is not None  # (None for augmented data only)
        x = self.x.index_select(0, flat)
        return x.view(step.active, step.width, *x.shape[1:]), y

    def dropout(self, step: Step) -> Callable[[tuple[int, ...], float], torch.Tensor | None]:
        """Mask source for one forward pass at `step`; each call draws one dropout layer for every
        active client."""

        def masks(shape: tuple[int, ...], p: float) -> torch.Tensor | None:
            if p == 0:
                return None  # F.dropout returns its input untouched and draws nothing
            if p == 1:
                return step.weight.new_zeros(step.active, step.width, *shape)  # nor here
            buf = step.weight.new_ones(step.active, step.width, *shape)
            for k, size in enumerate(step.sizes):
                # buf[k, :size] is contiguous, so this fills it exactly as nn.Dropout fills a fresh
                # tensor
                buf[k, :size].bernoulli_(1 - p, generator=self.dropout_generators[k])
            return buf.div_(1 - p)

        return masks


def plan_chunks(
    datas: Sequence[ClientData],
    positions: Sequence[int],
    cfg: TrainConfig,
    round_idx: int,
    seed: int,
    packing: Packing | None = None,
    key: str = "",
    workers: int | None = None,
) -> Iterator[CohortChunk]:
    """Sort one architecture's clients (`key`) by training size (largest first, so similar sizes
    share a chunk and pad little) and build their chunks one at a time (a chunk holds a copy of its
    data). With a chunk size (a fixed `runtime.cohort_chunk`, or auto on the CPU)
    training/schedule.py cuts them by modelled cost (little padding, and an even share of the work
    per chunk when several workers train at once), the costliest first so the workers finish
    together; auto on a GPU packs each chunk as full as the free memory allows
    (training/packing.py). `packing` None: auto on the CPU; `workers` None:
    `runtime.cohort_workers`'s auto (the run's runtime holds both)."""
    packing = packing if packing is not None else Packing(0, torch.device("cpu"))
    if packing.chunk < 0:
        raise ConfigError(
            "runtime.cohort_chunk must be >= 0 (clients stacked at once; 0: auto), got "
            f"{packing.chunk}"
        )
    # (most steps first: a step's active clients are a prefix; without step limits, by size)
    order = sorted(
        range(len(datas)), key=lambda i: (-step_count(datas[i], cfg), -datas[i].num_samples)
    )

    def build(picked: list[int]) -> CohortChunk:
        return CohortChunk(
            [positions[i] for i in picked], [datas[i] for i in picked], cfg, round_idx, seed
        )

    if packing.by_memory:
        yield from packing.chunks(order, key, build)
        return
    if workers is None:  # (the run's runtime holds it resolved: training/runtime.py)
        workers = cohort_workers(RuntimeConfig(), packing.device)
    ranges = split_by_cost(
        [datas[i].num_samples for i in order],
        cfg.batch_size,
        cfg.local_epochs,
        packing.fixed_chunk,
        workers,
    )
    for part, _ in sorted(ranges, key=lambda rc: -rc[1]):
        yield build([order[i] for i in part])


def step_count(data: ClientData, cfg: TrainConfig) -> int:
    """The local steps `data`'s update takes (its `step_limit` where set)."""
    steps = local_steps(data.num_samples, cfg)
    return steps if data.step_limit is None else min(steps, data.step_limit)


def cohort_workers(cfg: RuntimeConfig, device: torch.device | None = None) -> int:
    """`runtime.cohort_workers`, with 0 (auto) read as one worker per usable core not already taken
    by torch's intra-op threads, or one on a GPU (its chunks queue on one device; packing fills
    it)."""
    workers = cfg.cohort_workers
    if workers < 0:
        raise ConfigError(
            f"runtime.cohort_workers must be >= 0 (0: one per free core), got {workers}"
        )
    if workers == 0:
        if device is not None and device.type != "cpu":
            return 1
        cores = (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else (os.cpu_count() or 1)
        )
        # (torchrun's processes on this node share its cores: LOCAL_WORLD_SIZE,
        # engine/distributed.py)
        processes = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
        workers = max(1, cores // max(1, torch.get_num_threads()) // processes)
    return workers


def run_chunks(
    train: Callable[[CohortChunk], list[tuple[int, Any]]],
    chunks: Iterator[CohortChunk],
    cfg: RuntimeConfig,
    device: torch.device | None = None,
    devices: Sequence[torch.device] = (),
    first_alone: bool = False,
    workers: int | None = None,
) -> Iterator[tuple[int, Any]]:
    """`train` over the chunks, on `workers` threads (the runtime's; None: `cohort_workers(cfg)`):
    chunks hold different clients and every client's randomness is its own, so the results do not
    depend on the schedule. torch releases the GIL inside its ops (and the fused GRU inside its
    whole recurrence), so with one intra-op thread each, two workers keep two cores busy. A worker
    takes the next chunk as soon as it is free (results come back in completion order, with their
    positions); at most `workers` chunks (and their activations) are in memory at once. Several
    `devices` (`runtime.devices`): one worker per device, each chunk trained where its worker sits
    and its results brought back to `device`; `first_alone`: the first chunk trains before the next
    is planned (packing's probe, whose memory is measured on the first device)."""
    if len(devices) > 1:
        yield from _spread(
            train, chunks, devices, device if device is not None else devices[0], first_alone
        )
        return
    if workers is None:  # (the run's runtime holds it resolved: training/runtime.py)
        workers = cohort_workers(cfg, device)
    if workers == 1:
        for chunk in chunks:
            yield from _reported(train(chunk))
        return
    yield from _pooled(lambda _, chunk: train(chunk), chunks, range(workers), "fedac-cohort")


def _spread(
    train: Callable[[CohortChunk], list[tuple[int, Any]]],
    chunks: Iterator[CohortChunk],
    devices: Sequence[torch.device],
    home: torch.device,
    first_alone: bool,
) -> Iterator[tuple[int, Any]]:
    """`run_chunks` over several devices: the next chunk goes to the first device that is free (the
    first one alone on the first device when `first_alone`)."""

    def on(device: torch.device, chunk: CohortChunk) -> list[tuple[int, Any]]:
        with torch.cuda.device(device) if device.type == "cuda" else nullcontext():
            return to_device(train(chunk.to(device)), home)

    chunks = iter(chunks)
    if first_alone:
        first = next(chunks, None)
        if first is None:
            return
        yield from _reported(on(devices[0], first))
    yield from _pooled(on, chunks, devices, "fedac-device")


def _pooled(
    work: Callable[[Any, CohortChunk], list[tuple[int, Any]]],
    chunks: Iterator[CohortChunk],
    slots: Sequence[Any],
    prefix: str,
) -> Iterator[tuple[int, Any]]:
    """`work(slot, chunk)` for every chunk on one thread per slot (a worker, a device): a chunk
    waits for the first slot that is free, so at most len(slots) chunks are in memory at once;
    results come back in completion order."""
    with ThreadPoolExecutor(len(slots), thread_name_prefix=prefix) as pool:
        free, running = list(slots), dict[Any, Any]()
        for chunk in chunks:
            if not free:
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    free.append(running.pop(future))
                    yield from _reported(future.result())
            slot = free.pop(0)
            running[pool.submit(work, slot, chunk)] = slot
        for future in as_completed(running):
            yield from _reported(future.result())


class OnDevices:
    """A value every chunk of a round reads (the broadcast payload), copied once to each device
    asking."""

    def __init__(self, value: Any):
        self.value = value
        self._copies: dict[torch.device, Any] = {}

    def __call__(self, device: torch.device) -> Any:
        if device not in self._copies:
            self._copies[device] = to_device(self.value, device)
        return self._copies[device]


def _reported(results: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
    """A finished chunk's results, its clients counted as done (here, in the caller's thread)."""
    clients_done(len(results))
    return results


def broadcast_params(params: dict[str, torch.Tensor], count: int) -> dict[str, torch.Tensor]:
    """One parameter dict copied for `count` clients, as (count, ...) tensors."""
    return {
        name: value.detach().unsqueeze(0).expand(count, *value.shape).clone()
        for name, value in params.items()
    }


def leaves(params: dict[str, torch.Tensor], active: int) -> dict[str, torch.Tensor]:
    """Gradient leaves over the first `active` clients' parameters (views: the optimizer updates in
    place)."""
    return {name: value[:active].detach().requires_grad_() for name, value in params.items()}


class StackedSGD:
    """torch.optim.SGD (dampening 0, no Nesterov) on stacked parameters, one new instance per round
    as the sequential path builds one optimizer per client update: buffers start at zero, so the
    first momentum step is buf = d exactly as torch's clone of d."""

    def __init__(self, params: dict[str, torch.Tensor], cfg: TrainConfig):
        self.params = params
        self.lr, self.momentum, self.weight_decay = cfg.lr, cfg.momentum, cfg.weight_decay
        self.buffers: dict[str, torch.Tensor] = {}

    def step(self, grads: dict[str, torch.Tensor | None], active: int) -> None:
        with torch.no_grad():
            for name, grad in grads.items():
                if grad is None:  # as torch.optim.SGD skips parameters without a gradient
                    continue
                param = self.params[name][:active]
                d = grad.add(param, alpha=self.weight_decay) if self.weight_decay != 0 else grad
                if self.momentum != 0:
                    if name not in self.buffers:
                        self.buffers[name] = torch.zeros_like(self.params[name])
                    buf = self.buffers[name][:active]
                    buf.mul_(self.momentum).add_(d)
                    d = buf
                param.add_(d, alpha=-self.lr)


def grads_of(loss: torch.Tensor, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor | None]:
    # Backward outside autocast (runtime.precision), as torch recommends: each op's backward follows
    # its forward's dtype, and the stacked models' hand-written backward passes are fp32.
    with torch.autocast(loss.device.type, enabled=False):
        values = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    return dict(zip(params, values))


def group_positions(keys: Sequence[str]) -> dict[str, list[int]]:
    """Positions of each distinct key (architecture), in first-seen order."""
    groups: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return groups


def train_chunks(
    algo,
    train: Callable[[CohortChunk], list[tuple[int, ClientResult]]],
    datas: list[ClientData],
    positions,
    arch: str,
    round_idx: int,
    seed: int,
):
    """(position, result) of every client of architecture `arch`: its chunks planned by the
    algorithm's packing and trained on its devices (the probe, while `arch` is unmeasured, alone
    first)."""
    probing = algo.packing.probing(arch)  # asked before planning: planning the probe measures it
    workers = algo.runtime.workers
    chunks = plan_chunks(
        datas, positions, algo.cfg.train, round_idx, seed, algo.packing, arch, workers
    )
    return run_chunks(train, chunks, algo.cfg.runtime, algo.device, algo.devices, probing, workers)


def train_cohort(
    algo,
    train: Callable[[CohortChunk], list[tuple[int, ClientResult]]],
    datas: list[ClientData],
    arch: str,
    round_idx: int,
    seed: int,
) -> list[ClientResult]:
    """Every client's result in `datas`' order, all of architecture `arch` (`train_chunks`: every
    position is some chunk's)."""
    results: list[ClientResult | None] = [None] * len(datas)
    for position, result in train_chunks(
        algo, train, datas, range(len(datas)), arch, round_idx, seed
    ):
        results[position] = result
    return results  # type: ignore[return-value]
