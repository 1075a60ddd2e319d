"""Local SGD shared by the algorithms: batch order from a seeded generator, one optimizer per
call."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from itertools import islice

import torch
from torch import nn

from fedac.config import TrainConfig
from fedac.errors import ConfigError
from fedac.training.types import Labels, TrainWindows


def batch_indices(
    num_samples: int, batch_size: int, epochs: int, generator: torch.Generator
) -> Iterator[torch.Tensor]:
    """Shuffled mini-batches for `epochs` passes; the last partial batch of an epoch is kept."""
    for _ in range(epochs):
        # the CPU stream fixes the order
        order = torch.randperm(num_samples, generator=generator, device="cpu")
        yield from order.split(batch_size)


def cycling_batches(
    num_samples: int, batch_size: int, steps: int, generator: torch.Generator
) -> Iterator[torch.Tensor]:
    """Exactly `steps` mini-batches of a loader that is reshuffled whenever it runs out (partial
    last batch kept), as step-based local training (FedKWS-UI's protocol) reads it. No data: no
    batches."""
    while steps > 0 and num_samples > 0:
        for idx in torch.randperm(num_samples, generator=generator, device="cpu").split(batch_size)[
            :steps
        ]:
            yield idx
            steps -= 1


#: The local steps the client being trained one at a time may take (`ClientData.step_limit`, set
#: by training/step.py's `train_client` around the method's `client_update`, so that every method
#: reading its batches from `client_batches` honours it); None: all.
STEP_LIMIT: ContextVar[int | None] = ContextVar("step_limit", default=None)


def client_batches(
    num_samples: int, cfg: TrainConfig, generator: torch.Generator
) -> Iterator[torch.Tensor]:
    """One local update's mini-batches: `train.local_steps` cycling steps when set, else
    `local_epochs` passes; the first `STEP_LIMIT` of them where one is set."""
    if cfg.local_steps > 0:
        batches = cycling_batches(num_samples, cfg.batch_size, cfg.local_steps, generator)
    else:
        batches = batch_indices(num_samples, cfg.batch_size, cfg.local_epochs, generator)
    limit = STEP_LIMIT.get()
    return batches if limit is None else islice(batches, limit)


def on_device(batches: Iterable[torch.Tensor], x) -> Iterable[torch.Tensor]:
    """A client's batch indices moved where its data `x` lives, in one copy per client update.
    Indexing a GPU tensor with a CPU index copies the index at every step, and a copy from pageable
    host memory waits for the device's queued work: a host sync per step, which made the sequential
    GPU loop ~15% slower than a plain one. The indices come from a CPU generator (the CPU
    stream fixes the order), so they are drawn up front, pinned and sent at once. Data on the CPU,
    or that is no tensor (augmented windows, padded waveforms, indexed on the host): the batches as
    they are."""
    if not isinstance(x, torch.Tensor) or x.device.type == "cpu":
        return batches
    parts = list(batches)
    if not parts:
        return parts
    flat = torch.cat(parts)
    if x.device.type == "cuda":
        flat = flat.pin_memory()  # a copy from pinned memory does not wait for the device
    return list(flat.to(x.device, non_blocking=True).split([len(p) for p in parts]))


def local_steps(num_samples: int, cfg: TrainConfig) -> int:
    """SGD steps of one local update: `batch_indices` keeps each epoch's last partial batch."""
    if cfg.local_steps > 0:
        return cfg.local_steps if num_samples else 0
    return cfg.local_epochs * -(-num_samples // cfg.batch_size)


def cross_entropy(
    logits: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """Batch-mean cross-entropy; with per-sample `weight` (clients, batch) from the stacked path,
    the weighted sum over each client's batch (weight 1/b on its b real samples, 0 on padding) ->
    (clients,)."""
    if weight is None:
        return nn.functional.cross_entropy(logits, y)
    per_sample = nn.functional.cross_entropy(logits.flatten(0, -2), y.flatten(), reduction="none")
    return (per_sample.view_as(weight) * weight).sum(-1)


def make_optimizer(params, cfg: TrainConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.optimizer != "sgd":
        raise ConfigError(f"train.optimizer must be sgd, adam or adamw, got {cfg.optimizer!r}")
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def clip_gradients(model: nn.Module, cfg: TrainConfig) -> None:
    """`train.max_grad_norm` > 0: scale the model's gradient to at most that L2 norm (before the
    step)."""
    if cfg.max_grad_norm > 0:
        nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)


def local_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, loss: torch.Tensor, cfg: TrainConfig
) -> torch.Tensor:
    """One local step of any method: backward, the optional gradient clip, the update; returns the
    loss as a float64 tensor where it was computed, so callers sum it without a host round-trip per
    step."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    clip_gradients(model, cfg)
    optimizer.step()
    return loss.detach().double()


def train_supervised(
    model: nn.Module,
    x: TrainWindows,
    y: Labels,
    cfg: TrainConfig,
    generator: torch.Generator,
    regularizer: Callable[[nn.Module], torch.Tensor] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> dict[str, float]:
    """Cross-entropy SGD (or the given optimizer) on (x, y) for cfg.local_epochs; returns the mean
    loss."""
    model.train()
    optimizer = optimizer or make_optimizer(model.parameters(), cfg)
    total: float | torch.Tensor = 0.0  # (local_step returns the loss as a tensor: no host sync)
    steps = 0
    # SSL models' CTC / padded-batch loss (models/ssl.py)
    own_loss = getattr(model, "task_loss", None)
    for idx in on_device(client_batches(len(y), cfg, generator), x):
        if own_loss is not None:
            loss = own_loss(x[idx], y[idx])
        elif isinstance(y, torch.Tensor):
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        else:
            raise TypeError(
                "train_supervised: CTC targets need a model with its own task_loss "
                f"(models/ssl.py), not {type(model).__name__}"
            )
        if regularizer is not None:
            loss = loss + regularizer(model)
        total += local_step(model, optimizer, loss, cfg)
        steps += 1
    return {"loss": float(total) / max(steps, 1), "steps": float(steps)}  # read once per update
