"""Model evaluation: batched logits, a clip's windows averaged, then accuracy / macro-F1 / UAR; on the
waveform path also WER / CER of greedy CTC transcripts and the EER of cosine-scored speaker trials."""

from __future__ import annotations

import torch
from torch import nn

from fedac.data.waveform import Padded
from fedac.engine.data import EvalSplit
from fedac.metrics import classification_metrics, equal_error_rate, false_accept_reject, transcription_metrics

#: The negative classes of keyword spotting (12-class Speech Commands) for FA / FR.
KWS_NEGATIVES = ("_silence_", "_unknown_")


@torch.no_grad()
def logits(model: nn.Module, x: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
    model.eval()
    if len(x) == 0:
        return torch.zeros(0)
    return torch.cat([model(chunk) for chunk in x.split(batch_size)])


def clip_predictions(model: nn.Module, split: EvalSplit, batch_size: int = 512) -> torch.Tensor:
    """Predicted class per clip: the argmax of the mean logits over the clip's windows."""
    out = logits(model, split.x, batch_size)
    summed = torch.zeros(split.num_clips, out.shape[1]).index_add_(0, split.clip, out)
    counts = torch.bincount(split.clip, minlength=split.num_clips).clamp(min=1).unsqueeze(1)
    return (summed / counts).argmax(dim=1)


def evaluate(model: nn.Module, split: EvalSplit, batch_size: int = 512) -> dict[str, float]:
    if split.kind == "ctc":
        return transcription_metrics(split.texts, transcripts(model, split.x, batch_size))
    if split.kind == "verification":
        return {"eer": verification_eer(model, split, batch_size)}
    return classification_metrics(split.labels.numpy(), clip_predictions(model, split, batch_size).numpy())


@torch.no_grad()
def transcripts(model: nn.Module, x: Padded, batch_size: int = 512) -> list[str]:
    model.eval()
    return [text for chunk in x.split(batch_size) for text in model.transcribe(chunk)]


@torch.no_grad()
def verification_eer(model: nn.Module, split: EvalSplit, batch_size: int = 512) -> float:
    """EER of the trials scored by the cosine of the two clips' pooled embeddings (`model.embed`)."""
    model.eval()
    emb = nn.functional.normalize(torch.cat([model.embed(chunk) for chunk in split.x.split(batch_size)]), dim=1)
    a, b, target = split.trials.unbind(1)
    return equal_error_rate((emb[a] * emb[b]).sum(1).numpy(), target.numpy())


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
    return false_accept_reject(split.labels.numpy(), clip_predictions(model, split, batch_size).numpy(), negatives)
