"""Model evaluation: batched logits, a clip's windows averaged, then accuracy / macro-F1 / UAR; on the
waveform path also WER / CER of greedy CTC transcripts and the EER of cosine-scored speaker trials.
`evaluate_exits` scores every exit of an early-exit model for the cost of one encoder pass."""

from __future__ import annotations

import torch
from torch import nn

from fedac.data.waveform import Padded
from fedac.training.types import EvalSplit
from fedac.training.metrics import classification_metrics, equal_error_rate, false_accept_reject, transcription_metrics

#: The negative classes of keyword spotting (12-class Speech Commands) for FA / FR.
KWS_NEGATIVES = ("_silence_", "_unknown_")


@torch.no_grad()
def logits(model: nn.Module, x: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
    model.eval()
    if len(x) == 0:
        return torch.zeros(0, device=next(model.parameters()).device)
    return torch.cat([model(chunk) for chunk in x.split(batch_size)])


def clip_argmax(split: EvalSplit, out: torch.Tensor) -> torch.Tensor:
    """Predicted class per clip: the argmax of the mean logits `out` over the clip's windows."""
    out = out.float()  # (bf16 / fp16 logits under train.precision: averaged in fp32)
    summed = out.new_zeros(split.num_clips, out.shape[1]).index_add_(0, split.clip, out)
    counts = torch.bincount(split.clip, minlength=split.num_clips).clamp(min=1).unsqueeze(1)
    return (summed / counts).argmax(dim=1)


def clip_predictions(model: nn.Module, split: EvalSplit, batch_size: int = 512) -> torch.Tensor:
    return clip_argmax(split, logits(model, split.x, batch_size))


def batch_output(model: nn.Module, chunk, kind: str):
    """What a split's metrics need from one batch: greedy transcripts (ctc), pooled embeddings
    (verification) or logits (classification)."""
    if kind == "ctc":
        return model.transcribe(chunk)
    return model.embed(chunk) if kind == "verification" else model(chunk)


def split_metrics(split: EvalSplit, outputs: list) -> dict[str, float]:
    """The split's metrics from its batches' `batch_output`s, in order."""
    if split.kind == "ctc":
        return transcription_metrics(split.texts, [text for out in outputs for text in out])
    if split.kind == "verification":  # trials scored by the cosine of the two clips' embeddings
        emb = nn.functional.normalize(torch.cat(outputs), dim=1)
        a, b, target = split.trials.unbind(1)
        return {"eer": equal_error_rate((emb[a] * emb[b]).sum(1).cpu().numpy(), target.cpu().numpy())}
    # metrics are computed on the host, once per split (one transfer, not one per batch)
    return classification_metrics(split.labels.cpu().numpy(), clip_argmax(split, torch.cat(outputs)).cpu().numpy())


@torch.no_grad()
def evaluate(model: nn.Module, split: EvalSplit, batch_size: int = 512) -> dict[str, float]:
    model.eval()
    return split_metrics(split, [batch_output(model, chunk, split.kind) for chunk in split.x.split(batch_size)])


@torch.no_grad()
def evaluate_exits(model: nn.Module, split: EvalSplit, batch_size: int = 512) -> dict[int, dict[str, float]]:
    """`evaluate` at every exit of a MultiExitSSL ({exit: metrics}), with one encoder pass per batch:
    the batch's exits are scored shallow to deep, each continuing the encoder where the last stopped.
    The model is left at its deepest exit."""
    model.eval()
    outputs: dict[int, list] = {depth: [] for depth in model.exits}
    for chunk in split.x.split(batch_size):
        with model.shared_pass():
            for depth in sorted(outputs):
                outputs[depth].append(batch_output(model.use_exit(depth), chunk, split.kind))
    return {depth: split_metrics(split, out) for depth, out in outputs.items()}


def selection_score(metrics: dict[str, float]) -> float:
    """What `train.select=best_val` maximises: validation accuracy, or minus the WER on CTC tasks."""
    return metrics["accuracy"] if "accuracy" in metrics else -metrics["wer"]


def window_accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 512) -> float:
    """Accuracy over individual windows (a client's local held-out data); NaN for CTC targets."""
    if len(y) == 0 or isinstance(y, Padded):
        return float("nan")
    return float((logits(model, x, batch_size).argmax(dim=1) == y).float().mean())


def kws_rates(model: nn.Module, split: EvalSplit, classes: list[str], batch_size: int = 512) -> dict[str, float]:
    """FA / FR (metrics.false_accept_reject) on a task with silence / unknown classes; {} elsewhere."""
    negatives = [i for i, name in enumerate(classes) if name in KWS_NEGATIVES]
    if not negatives:
        return {}
    return false_accept_reject(split.labels.cpu().numpy(), clip_predictions(model, split, batch_size).cpu().numpy(),
                               negatives)
