"""Local SGD shared by the algorithms: batch order from a seeded generator, one optimizer per call."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import nn

from fedac.config import TrainConfig
from fedac.errors import ConfigError


def batch_indices(num_samples: int, batch_size: int, epochs: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Shuffled mini-batches for `epochs` passes; the last partial batch of an epoch is kept."""
    for _ in range(epochs):
        order = torch.randperm(num_samples, generator=generator)
        yield from order.split(batch_size)


def local_steps(num_samples: int, cfg: TrainConfig) -> int:
    """SGD steps of one local update: `batch_indices` keeps each epoch's last partial batch."""
    return cfg.local_epochs * -(-num_samples // cfg.batch_size)


def cross_entropy(logits: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """Batch-mean cross-entropy; with per-sample `weight` (clients, batch) from the cohort path, the
    weighted sum over each client's batch (weight 1/b on its b real samples, 0 on padding) -> (clients,)."""
    if weight is None:
        return nn.functional.cross_entropy(logits, y)
    per_sample = nn.functional.cross_entropy(logits.flatten(0, -2), y.flatten(), reduction="none")
    return (per_sample.view_as(weight) * weight).sum(-1)


def make_optimizer(params, cfg: TrainConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.optimizer != "sgd":
        raise ConfigError(f"train.optimizer must be sgd or adamw, got {cfg.optimizer!r}")
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def train_supervised(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    cfg: TrainConfig,
    generator: torch.Generator,
    regularizer: Callable[[nn.Module], torch.Tensor] | None = None,
) -> dict[str, float]:
    """Cross-entropy SGD on (x, y) for cfg.local_epochs; returns the mean training loss."""
    model.train()
    optimizer = make_optimizer(model.parameters(), cfg)
    total, steps = 0.0, 0
    own_loss = getattr(model, "task_loss", None)  # SSL models' CTC / padded-batch loss (models/ssl.py)
    for idx in batch_indices(len(y), cfg.batch_size, cfg.local_epochs, generator):
        loss = own_loss(x[idx], y[idx]) if own_loss is not None else nn.functional.cross_entropy(model(x[idx]), y[idx])
        if regularizer is not None:
            loss = loss + regularizer(model)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        total += float(loss.detach())
        steps += 1
    return {"loss": total / max(steps, 1), "steps": float(steps)}
