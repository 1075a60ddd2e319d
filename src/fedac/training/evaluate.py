"""Model evaluation: batched logits, a clip's windows averaged, then accuracy / macro-F1 / UAR; on
the waveform path also WER / CER of greedy CTC transcripts and the EER of cosine-scored speaker
trials. `evaluate_exits` scores every exit of an early-exit model for the cost of one encoder pass.

Over several processes (engine/distributed.py `evaluation`) a split's batches are shared out inside
`sharded`: process r runs batches r, r + size, ..., and one gather gives every process every batch's
output in order, from which each computes the same metrics (a batch's numbers do not depend on the
process that ran it, so they equal one process's)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fedac.data.waveform import Padded
from fedac.training.device import to_device
from fedac.training.metrics import (
    classification_metrics,
    equal_error_rate,
    false_accept_reject,
    transcription_metrics,
)
from fedac.training.types import EvalSplit, Labels, Windows

if TYPE_CHECKING:  # (models/ssl.py imports transformers: not at run time)
    from fedac.models.early_exit import MultiExitSSL

#: The negative classes of keyword spotting (12-class Speech Commands) for FA / FR.
KWS_NEGATIVES = ("_silence_", "_unknown_")


_shard: ContextVar[tuple[int, int, Callable[[list], list[list]]] | None] = ContextVar(
    "fedac_eval_shard", default=None
)


@contextmanager
def sharded(rank: int, size: int, gather: Callable[[list], list[list]] | None) -> Iterator[None]:
    """Within the block, `batch_outputs` runs this process's share of a split's batches (every
    `size`-th from `rank`) and `gather(its outputs)` returns every process's, in rank order; size 1:
    every batch here."""
    if size > 1 and gather is None:
        raise ValueError("evaluation sharded over several processes needs their `gather`")
    token = _shard.set((rank, size, gather) if size > 1 and gather is not None else None)
    try:
        yield
    finally:
        _shard.reset(token)


def batch_outputs(fn: Callable[[Any], Any], chunks: list, device) -> list:
    """`fn(chunk)` of every chunk, in order, on `device` (shared out over the processes inside
    `sharded`)."""
    shard = _shard.get()
    if shard is None:
        return [fn(chunk) for chunk in chunks]
    rank, size, gather = shard
    out: list = [None] * len(chunks)
    for r, outputs in enumerate(
        gather([to_device(fn(chunk), "cpu") for chunk in chunks[rank::size]])
    ):
        out[r::size] = outputs
    return to_device(out, device)


def _device(model: nn.Module, inputs: Any) -> torch.device:
    """Where `model` computes: its first parameter's or buffer's device; a model with neither (a
    fixed function, as tests use) computes where its inputs are."""
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        return tensor.device
    return getattr(inputs, "device", torch.device("cpu"))


@torch.no_grad()
def logits(model: nn.Module, x: Windows, batch_size: int = 512) -> torch.Tensor:
    model.eval()
    if len(x) == 0:
        return torch.zeros(0, device=_device(model, x))
    return torch.cat(batch_outputs(model, list(x.split(batch_size)), _device(model, x)))


def clip_argmax(split: EvalSplit, out: torch.Tensor) -> torch.Tensor:
    """Predicted class per clip: the argmax of the mean logits `out` over the clip's windows."""
    out = out.float()  # (bf16 / fp16 logits under runtime.precision: averaged in fp32)
    summed = out.new_zeros(split.num_clips, out.shape[1]).index_add_(0, split.clip, out)
    counts = torch.bincount(split.clip, minlength=split.num_clips).clamp(min=1).unsqueeze(1)
    return (summed / counts).argmax(dim=1)


def clip_predictions(model: nn.Module, split: EvalSplit, batch_size: int = 512) -> torch.Tensor:
    return clip_argmax(split, logits(model, split.x, batch_size))


def batch_output(model: Any, chunk, kind: str):
    """What a split's metrics need from one batch: greedy transcripts (ctc), pooled embeddings
    (verification) or logits (classification). (`model` is Any: `transcribe` and `embed` are the
    SSL models' and KWS nets' own methods, not nn.Module's.)"""
    if kind == "ctc":
        return model.transcribe(chunk)
    return model.embed(chunk) if kind == "verification" else model(chunk)


def split_metrics(split: EvalSplit, outputs: list) -> dict[str, float]:
    """The split's metrics from its batches' `batch_output`s, in order."""
    if split.kind == "ctc":
        assert split.texts is not None  # CTC splits carry their transcripts
        return transcription_metrics(split.texts, [text for out in outputs for text in out])
    if split.kind == "verification":  # trials scored by the cosine of the two clips' embeddings
        emb = nn.functional.normalize(torch.cat(outputs), dim=1)
        assert split.trials is not None  # verification splits carry their trials
        a, b, target = split.trials.unbind(1)
        return {
            "eer": equal_error_rate((emb[a] * emb[b]).sum(1).cpu().numpy(), target.cpu().numpy())
        }
    # metrics are computed on the host, once per split (one transfer, not one per batch)
    return classification_metrics(
        split.labels.cpu().numpy(), clip_argmax(split, torch.cat(outputs)).cpu().numpy()
    )


@torch.no_grad()
def evaluate(model: nn.Module, split: EvalSplit, batch_size: int = 512) -> dict[str, float]:
    model.eval()
    return split_metrics(
        split,
        batch_outputs(
            lambda chunk: batch_output(model, chunk, split.kind),
            list(split.x.split(batch_size)),
            _device(model, split.x),
        ),
    )


@torch.no_grad()
def evaluate_exits(
    model: MultiExitSSL, split: EvalSplit, batch_size: int = 512
) -> dict[int, dict[str, float]]:
    """`evaluate` at every exit of a MultiExitSSL ({exit: metrics}), with one encoder pass per
    batch: the batch's exits are scored shallow to deep, each continuing the encoder where the last
    stopped. The model is left at its deepest exit."""
    model.eval()

    def every_exit(chunk) -> dict[int, Any]:
        with model.shared_pass():
            return {
                depth: batch_output(model.use_exit(depth), chunk, split.kind)
                for depth in sorted(model.exits)
            }

    outputs = batch_outputs(every_exit, list(split.x.split(batch_size)), _device(model, split.x))
    model.use_exit(max(model.exits))  # (as the last batch leaves it, whichever process ran it)
    return {depth: split_metrics(split, [out[depth] for out in outputs]) for depth in model.exits}


def selection_score(metrics: dict[str, float]) -> float:
    """What `train.select=best_val` maximises: validation accuracy, or minus the WER on CTC
    tasks."""
    return metrics["accuracy"] if "accuracy" in metrics else -metrics["wer"]


def window_accuracy(model: nn.Module, x: Windows, y: Labels, batch_size: int = 512) -> float:
    """Accuracy over individual windows (a client's local held-out data); NaN for CTC targets."""
    if len(y) == 0 or isinstance(y, Padded):
        return float("nan")
    return float((logits(model, x, batch_size).argmax(dim=1) == y).float().mean())


def kws_rates(
    model: nn.Module, split: EvalSplit, classes: list[str], batch_size: int = 512
) -> dict[str, float]:
    """FA / FR (metrics.false_accept_reject) on a task with silence / unknown classes; {}
    elsewhere."""
    negatives = [i for i, name in enumerate(classes) if name in KWS_NEGATIVES]
    if not negatives:
        return {}
    return false_accept_reject(
        split.labels.cpu().numpy(),
        clip_predictions(model, split, batch_size).cpu().numpy(),
        negatives,
    )
