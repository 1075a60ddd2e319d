"""One run over several processes started by torchrun (`torchrun --nproc-per-node N -m fedac run
...`; also `fedac compare` and `fedac reproduce`, whose runs every rank runs in turn:
experiments/compare.py).

Design (the simplest one that gives one process's numbers for every method):
- every rank builds the same data and samples the same cohort from the run's seed (nothing random
  depends on the rank);
- a round's clients are shared out by their owner where the algorithm keeps client states, else by
  their modelled cost (`training/schedule.py`'s rows: steps x
  STEP_ROWS + samples), costliest first onto the least loaded rank, so each rank trains about 1/N of
  the round, stacked where the algorithm is;
- one all-gather brings every client's result (upload, new persistent state, metrics) to every rank,
  in cohort order; every rank then runs the same server update on the same ordered list: the robust
  rules, LPA, DP noise drawn from the run's seed and FedOpt's server optimiser see exactly what one
  process sees. Where the algorithm and the rule declare that the server reads the uploads only
  through their weighted mean (`sums_uploads`), one all-reduce of the float64 weighted sums replaces
  the uploads in that gather (`all_reduce_mean`): the sums' order differs, float rounding only;
- every rank evaluates, each its share of a split's batches and of the clients' held-out scores
  (`evaluation`, `World.each`), gathered so that all hold the same metrics; rank 0 alone writes the
  run directory and the checkpoints; the other ranks write into a scratch folder of their own that
  is removed at the end (`scratch_run_dir`);
- every rank holds the global state; a client's persistent state (FedMLAC's own models, FedKWS-UI's
  private heads) lives on the rank that owns the client alone (`owner`: its index among the run's
  clients modulo the world size), which trains it and scores its own model; a new state stays where
  it was trained (only its finiteness travels), so each rank's memory for states is about 1/N of one
  process's. At a checkpoint the states are gathered to rank 0, which writes one whole checkpoint; a
  resume on any number of processes, one included, has rank 0 read it and hand each rank the states
  it owns under the new world size (engine/checkpoint.py).

A client's training does not depend on which rank trains it (its batches and dropout masks derive
from (seed, round, client) only). One-client-at-a-time training therefore gives one process's
numbers bit for bit; the stacked path groups a rank's share into different chunks than one process
would, which moves numbers at float rounding only (docs/performance.md, "Several processes:
torchrun").

A collective that fails (a rank died: its sockets close) or waits longer than `runtime.dist_timeout`
(a rank hangs) raises `DistributedError` on every surviving rank, naming the rank and the round;
rank 0's last checkpoint stays as it was.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import pickle
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from fedac.errors import ConfigError, FedacError
from fedac.training.device import to_device
from fedac.training.evaluate import sharded
from fedac.training.schedule import STEP_ROWS, batch_sizes
from fedac.training.stacking import client_progress, progress_callback
from fedac.training.types import all_finite

log = logging.getLogger(__name__)

#: What torchrun sets for every worker; WORLD_SIZE above 1 makes a run distributed.
ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
#: A folder that receives each rank's payload bytes per collective
#: (benchmarks/bench_distributed.py).
TRAFFIC_LOG = "FEDAC_TRAFFIC_LOG"


class DistributedError(FedacError):
    """A collective of a run over several processes failed or timed out."""


@dataclass
class World:
    """This process's place in the run: rank `rank` of `size` (1: one process, today's path)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    timeout_s: float = 0.0
    backend: str = ""
    group: Any = field(default=None, repr=False)
    """The process group of the object collectives (gloo: results travel through the host)."""
    run_dir: str = "RUN_DIR"
    """Rank 0's run directory (named in the errors; set by the command)."""
    again: str = ""
    """How to continue after a failed collective, when not `fedac run --resume RUN_DIR` (compare,
    reproduce)."""
    traffic: str = field(default_factory=lambda: os.environ.get(TRAFFIC_LOG, ""))
    """A folder: each collective's payload bytes are appended to its rank<R>.jsonl
    (`log_traffic`)."""

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def writes(self) -> bool:
        """Rank 0 alone evaluates and writes the run directory, the checkpoints, progress and
        logs."""
        return self.rank == 0

    def _collective(self, what: str, round_idx: int | None, call: Callable[[], None]) -> None:
        started = time.monotonic()
        try:
            call()
        except Exception as exc:  # gloo raises RuntimeError / DistBackendError subclasses
            when = f"round {round_idx}" if round_idx is not None else "start"
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise DistributedError(
                f"rank {self.rank} of {self.size}, {when}: {what} failed after "
                f"{time.monotonic() - started:.1f} s (runtime.dist_timeout={self.timeout_s:g} s): "
                f"another rank stopped or did not reach it ({first}). Rank 0's last checkpoint is "
                f"kept: continue with {self.again or f'`fedac run --resume {self.run_dir}`'} on "
                "any number of processes"
            ) from None

    def gather(self, obj: Any, what: str, round_idx: int | None = None) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank."""
        if not self.distributed:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.size
        self._collective(
            what, round_idx, lambda: dist.all_gather_object(out, obj, group=self.group)
        )
        if self.traffic:  # (pickled again to measure: only when asked)
            sizes = [len(pickle.dumps(o)) for o in out]
            self.log_traffic(what, round_idx, sizes[self.rank], sum(sizes) - sizes[self.rank])
        return out

    def log_traffic(self, what: str, round_idx: int | None, sent: int, received: int) -> None:
        """One line of `traffic`: a collective's payload bytes from and to this rank (pickled
        objects for the gathers, as all_gather_object sends them less its padding; the buffer for an
        all-reduce)."""
        Path(self.traffic).mkdir(parents=True, exist_ok=True)
        with open(Path(self.traffic) / f"rank{self.rank}.jsonl", "a") as handle:
            handle.write(
                json.dumps({"what": what, "round": round_idx, "sent": sent, "received": received})
                + "\n"
            )

    def to_rank0(self, obj: Any, what: str, round_idx: int | None = None) -> list[Any] | None:
        """Every rank's `obj`, in rank order, on rank 0 alone (None on the others)."""
        if not self.distributed:
            return [obj]
        import torch.distributed as dist

        out: list[Any] | None = [None] * self.size if self.writes else None
        self._collective(
            what, round_idx, lambda: dist.gather_object(obj, out, dst=0, group=self.group)
        )
        return out

    def from_rank0_each(self, objs: list[Any] | None, what: str) -> Any:
        """Rank 0's `objs[r]` on rank r (`objs` is read on rank 0 alone)."""
        if not self.distributed:
            return objs[0] if objs else None
        import torch.distributed as dist

        box: list[Any] = [None]
        self._collective(
            what,
            None,
            lambda: dist.scatter_object_list(
                box, objs if self.writes else None, src=0, group=self.group
            ),
        )
        return box[0]

    def log_held(self, round_idx: int, clients: int, nbytes: int) -> None:
        """One line of `traffic`/held<R>.jsonl: the client states this rank holds after a round."""
        Path(self.traffic).mkdir(parents=True, exist_ok=True)
        with open(Path(self.traffic) / f"held{self.rank}.jsonl", "a") as handle:
            handle.write(
                json.dumps({"round": round_idx, "clients": clients, "bytes": nbytes}) + "\n"
            )

    def from_rank0(self, obj: Any, what: str, round_idx: int | None = None) -> Any:
        """Rank 0's `obj` on every rank."""
        if not self.distributed:
            return obj
        import torch.distributed as dist

        box = [obj if self.rank == 0 else None]
        self._collective(
            what, round_idx, lambda: dist.broadcast_object_list(box, src=0, group=self.group)
        )
        return box[0]

    def each(
        self, items: list, score: Callable[[Any], Any], what: str, round_idx: int | None = None
    ) -> list:
        """`score(item)` of every item, in order, on every rank: rank r scores items r, r + size,
        ... (a split's batches inside are then not shared out again) and one gather brings the
        others'."""
        if not self.distributed:
            return [score(item) for item in items]
        with sharded(0, 1, None):
            mine = [to_device(score(item), "cpu") for item in items[self.rank :: self.size]]
        out: list = [None] * len(items)
        for rank, theirs in enumerate(self.gather(mine, what, round_idx)):
            out[rank :: self.size] = theirs
        return out

    def on_rank0(self, decide: Callable[[], Any], what: str) -> Any:
        """`decide()` run on rank 0 alone (what it reads may be on rank 0's disk only), its value on
        every rank; a FedacError it raises is raised on every rank, so all stop with rank 0's
        reason."""
        if not self.distributed:
            return decide()
        outcome: tuple[Any, FedacError | None] = (None, None)
        if self.writes:
            try:
                outcome = (decide(), None)
            except FedacError as exc:
                outcome = (None, exc)
        value, error = self.from_rank0(outcome, what)
        if error is not None:
            raise error
        return value


_world = World()


def current_world() -> World:
    """The world `start` joined (one process when torchrun did not start this one)."""
    return _world


def start(timeout_s: float, device_setting: str) -> World:
    """Join torchrun's process group when WORLD_SIZE > 1 (else: one process, nothing changes). Each
    rank takes LOCAL_RANK's GPU when `runtime.device` is auto or cuda and a GPU is there; the
    backend is NCCL when every local rank has a GPU of its own, gloo otherwise (CPUs, or several
    ranks sharing one GPU, which NCCL refuses). Results always travel through a gloo group (they are
    gathered on the host)."""
    global _world
    size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if size <= 1:
        _world = World()
        return _world
    missing = [name for name in ENV if name not in os.environ]
    if missing:
        raise ConfigError(
            f"WORLD_SIZE={size} but {', '.join(missing)} unset: start several processes with "
            "torchrun (docs/performance.md, 'Several processes: torchrun')"
        )
    if timeout_s <= 0:
        raise ConfigError(f"runtime.dist_timeout must be > 0 seconds, got {timeout_s}")
    import torch.distributed as dist

    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", size))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    own_gpu = device_setting in ("auto", "cuda") and gpus > 0 and not os.environ.get("FEDAC_DEVICE")
    if own_gpu:
        torch.cuda.set_device(local_rank % gpus)  # `auto` / `cuda` then resolve to this rank's GPU
    backend = "nccl" if own_gpu and local_size <= gpus else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(backend, timeout=timeout)
    group = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else None
    _world = World(rank, size, local_rank, timeout_s, backend, group)
    return _world


@contextmanager
def joined(timeout_s: float, device_setting: str, again: str = "") -> Iterator[World]:
    """`start` ... `stop` around a command (`fedac compare`, `fedac reproduce`: every rank runs the
    same sequence of runs, rank 0 alone writes and prints); the ranks other than 0 log errors
    only."""
    world = start(timeout_s, device_setting)
    world.again = again
    level = logging.getLogger().level
    try:
        if not world.writes:
            logging.getLogger().setLevel(logging.ERROR)  # (rank 0 logs the runs' warnings)
        yield world
    finally:
        logging.getLogger().setLevel(level)
        stop()


def evaluation(world: World, round_idx: int | None):
    """Around an evaluation run by every rank (the simulator's rounds and final results): a split's
    batches are shared out over the ranks and gathered (training/evaluate.py `sharded`); the
    per-client scores share out their clients (`World.each`). Every rank ends with the same
    metrics."""
    return sharded(
        world.rank,
        world.size,
        lambda outputs: world.gather(outputs, "gathering the evaluation", round_idx),
    )


def stop() -> None:
    """Leave the process group (a no-op in one process)."""
    global _world
    if _world.distributed:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    _world = World()


def scratch_run_dir(world: World, run_dir: Path) -> Path:
    """Where this rank writes: the run directory on rank 0, a private temporary folder on the others
    (their copies of metrics.csv and the like are never read; `cleanup` removes the folder)."""
    if world.writes:
        return run_dir
    return Path(tempfile.mkdtemp(prefix=f"fedac-rank{world.rank}-"))


def cleanup(world: World, run_dir: Path) -> None:
    if not world.writes:
        shutil.rmtree(run_dir, ignore_errors=True)


# --- sharing a round's clients ------------------------------------------------------------------
def owner(index: int, size: int) -> int:
    """The rank that owns the client at `index` of the run's clients: it holds the client's
    persistent state, trains it and scores its own model (engine/clients.py `shared_out` shares
    clients by the same rule). Depends on the world size only, so a resume on another one moves the
    states (engine/checkpoint.py)."""
    return index % size


def client_cost(samples: int, cfg) -> float:
    """A client's modelled training cost in padded rows (training/schedule.py): STEP_ROWS per step
    plus the rows of its batches."""
    steps = (
        [cfg.batch_size] * cfg.local_steps
        if cfg.local_steps
        else batch_sizes(samples, cfg.batch_size, cfg.local_epochs)
    )
    return STEP_ROWS * len(steps) + float(sum(steps))


def shares(costs: list[float], size: int) -> list[list[int]]:
    """Positions of the cohort per rank: costliest client first onto the least loaded rank (ties:
    the earlier position, the lower rank), each share in cohort order. Every rank computes the same
    shares."""
    loads, out = [0.0] * size, [list[int]() for _ in range(size)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        rank = min(range(size), key=lambda r: (loads[r], r))
        out[rank].append(i)
        loads[rank] += costs[i]
    return [sorted(share) for share in out]


class PlanProgress:
    """A rank's progress counted as the round's, with no collective inside the training: each of its
    `share` clients that finishes stands for `total / share` of the cohort (the shares balance the
    modelled cost, so the other ranks are about as far), and `finish`, after the gather, reports the
    rest. `outer` (the round's client bar, engine/rounds.py) thus always hears of `total` clients in
    all."""

    def __init__(self, outer: Callable[[int], None] | None, total: int, share: int):
        self.outer, self.total, self.share = outer, total, share
        self.done = self.shown = 0

    def __call__(self, count: int) -> None:
        self.done += count
        self._show(self.done * self.total // max(1, self.share))

    def finish(self) -> None:
        self._show(self.total)

    def _show(self, target: int) -> None:
        target = min(target, self.total)
        if target > self.shown and self.outer is not None:
            self.outer(target - self.shown)
        self.shown = max(self.shown, target)


# --- the weighted-sum path ------------------------------------------------------------------------
def sums_uploads(algorithm, attack, privacy) -> bool:
    """Whether a round's uploads travel as one all-reduce of their weighted sums instead of an
    all-gather: the algorithm (`Algorithm.sums_uploads`) and the aggregation rule
    (rules/aggregation.py `weighted_sum`) declare that the new model reads the uploads only through
    their weighted mean, and no layer needs each upload (model poisoning, DP's per-update clipping,
    compression). Every rank decides the same."""
    from fedac.rules import AGGREGATORS
    from fedac.settings.codecs import codec_spec

    rule = AGGREGATORS.load(algorithm.cfg.aggregation.method)
    return bool(
        type(algorithm).sums_uploads
        and getattr(rule, "sums_uploads", False)
        and not privacy.on
        and attack.poisons != "upload"
        and codec_spec(algorithm.cfg.compression.method).off
    )


def how_shared(world: World, summed: bool) -> str:
    """The run's first line's note of how a round's uploads travel ("" in one process)."""
    if not world.distributed:
        return ""
    how = "one all-reduce of their weighted sums" if summed else "an all-gather of every upload"
    return f"; {world.size} processes ({world.backend}), uploads by {how}"


class Summed:
    """On every rank, an upload that went into the round's all-reduce instead of travelling: its
    size (engine/clients.py's ByteLedger counts it) and its entries that are not floats (BatchNorm's
    counters, which the mean takes from the first upload, as rules/aggregation.weighted_mean
    does)."""

    __slots__ = ("bytes", "fixed")

    def __init__(self, upload: dict[str, torch.Tensor]):
        from fedac.training.device import nbytes

        self.bytes = nbytes(upload)
        self.fixed = {k: v for k, v in upload.items() if not v.is_floating_point()}


class Round(list):
    """run_shared's results in cohort order; `summed`: on the weighted-sum path, the cohort's
    weighted mean of the usable uploads with their summed weight (one upload that stands for all),
    else None."""

    summed: tuple[dict[str, torch.Tensor], int] | None = None


def all_reduce_mean(
    world: World,
    uploads: list[tuple[dict[str, torch.Tensor], int]],
    template: dict[str, torch.Tensor],
    weighting: str,
    round_idx: int,
) -> tuple[dict[str, torch.Tensor], float]:
    """The weighted mean over every rank's `uploads` of their floating entries, by one all-reduce of
    sum_k w_k theta_k and sum_k w_k in float64 (`weighting`: n_k, or 1 each). `template` (the
    broadcast) gives every rank the same entries and shapes, uploads or not. The sums' order differs
    from one process's (per rank, then across ranks): float rounding only (docs/performance.md)."""
    import torch.distributed as dist

    from fedac.rules.aggregation import weighted_uploads

    floats = [k for k, v in template.items() if v.is_floating_point()]
    sizes = [template[k].numel() for k in floats]
    buffer = torch.zeros(sum(sizes) + 1, dtype=torch.float64)
    for upload, weight in weighted_uploads(uploads, weighting):
        if upload.keys() != template.keys():
            raise ConfigError(
                "the algorithm's class declares sums_uploads, but its uploads' entries differ from "
                "the broadcast's: set sums_uploads = False on it (algorithms/base.py)"
            )
        buffer[:-1] += float(weight) * torch.cat(
            [upload[k].detach().reshape(-1).cpu().double() for k in floats]
        )
        buffer[-1] += float(weight)
    what = "all-reducing the uploads' weighted sums"
    world._collective(what, round_idx, lambda: dist.all_reduce(buffer, group=world.group))
    if world.traffic:  # (this rank's part of the sum, and the sum it gets back)
        world.log_traffic(
            what,
            round_idx,
            buffer.numel() * buffer.element_size(),
            buffer.numel() * buffer.element_size(),
        )
    total = float(buffer[-1])
    means = buffer[:-1] / total if total else buffer[:-1]
    return {
        k: part.reshape(template[k].shape).to(template[k].dtype)
        for k, part in zip(floats, means.split(sizes))
    }, total


def run_shared(
    world: World,
    plan,
    payload: Any,
    states: list[Any],
    datas: list,
    round_idx: int,
    seed: int,
    usable: Callable[[Any], bool] | None = None,
    owners: list[int] | None = None,
) -> Round:
    """`plan.run` (engine/execution.py's `ExecutionPlan`) over the ranks: this rank trains its
    share, and every rank gets every client's result in `datas` order. Where the plan measures its
    path, every rank then follows rank 0's measurement (each rank timed its own share).

    `usable` (the weighted-sum path, `sums_uploads`): the results it accepts travel without their
    upload (a `Summed` stands in), and one all-reduce gives every rank their weighted mean
    (`Round.summed`); the rest (new client states, metrics, an upload it refuses) still travel in
    the gather.

    `owners` (each position's owning rank, where states live with their owner): each rank trains the
    clients it owns (`states` need hold only those), and a new state stays on its rank: it travels
    as None when finite (the others need only know that it is; a non-finite one travels, so every
    rank rejects the client alike). Else the shares balance the modelled cost (a sampled cohort's
    clients fall unevenly by owner, and a stateless client's training can run anywhere)."""
    algorithm = plan.algorithm
    if not world.distributed:
        return Round(plan.run(payload, states, datas, round_idx, seed))
    if owners is not None:
        mine = [i for i, rank in enumerate(owners) if rank == world.rank]
    else:
        mine = shares([client_cost(d.num_samples, algorithm.cfg.train) for d in datas], world.size)[
            world.rank
        ]
    bar = PlanProgress(progress_callback(), len(datas), len(mine))
    with client_progress(bar):  # (rank 0's bar shows the round's cohort)
        results = (
            plan.run(payload, [states[i] for i in mine], [datas[i] for i in mine], round_idx, seed)
            if mine
            else []
        )
    travel = results
    if owners is not None:
        travel = [replace(r, state=None if all_finite(r.state) else r.state) for r in results]
    travel, kept, summed = to_device(travel, "cpu"), [False] * len(results), None
    if usable is not None:
        kept = [usable(r) for r in results]
        summed = all_reduce_mean(
            world,
            [(r.upload, datas[i].num_samples) for i, r, ok in zip(mine, results, kept) if ok],
            to_device(payload, "cpu"),
            algorithm.server_weighting(algorithm.cfg),
            round_idx,
        )
        travel = [replace(r, upload=Summed(r.upload)) if ok else r for r, ok in zip(travel, kept)]
    gathered = world.gather(
        (mine, travel, dict(plan.measured)), "gathering the clients' results", round_idx
    )
    bar.finish()  # every rank's share is done
    out = Round([None] * len(datas))
    for rank, (positions, theirs, _) in enumerate(gathered):
        for i, result in zip(positions, theirs):
            out[i] = to_device(result, algorithm.device) if rank != world.rank else None
    for j, i in enumerate(mine):  # this rank's own results as trained (on its device)
        out[i] = replace(results[j], upload=travel[j].upload) if kept[j] else results[j]
    if summed is not None and summed[1] > 0:
        means, total = summed
        # (the cohort's first usable upload)
        first = next(r.upload for r in out if isinstance(r.upload, Summed))
        mean = {k: means[k] if k in means else first.fixed[k] for k in payload}
        out.summed = (to_device(mean, algorithm.device), round(total))
    plan.adopt(gathered[0][2])
    return out
