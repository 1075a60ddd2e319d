"""Classification metrics (scikit-learn): accuracy, macro-F1, UAR (unweighted average recall)."""

from __future__ import annotations

import warnings

import numpy as np


def classification_metrics(y_true, y_pred) -> dict[str, float]:
    """Accuracy, macro-F1 and UAR. Macro-F1 averages over classes present in truth or prediction."""
    # lazy: start-up time
    from sklearn.metrics import accuracy_score, balanced_accuracy_score, f1_score

    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    if len(y_true) == 0:
        return {"accuracy": float("nan"), "macro_f1": float("nan"), "uar": float("nan")}
    with warnings.catch_warnings():
        # balanced_accuracy warns when a predicted class never occurs in truth; that is expected
        # here.
        warnings.simplefilter("ignore")
        return {
            "accuracy": float(accuracy_score(y_true, y_pred)),
            "macro_f1": float(f1_score(y_true, y_pred, average="macro", zero_division=0)),
            "uar": float(balanced_accuracy_score(y_true, y_pred)),
        }


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and population std over clients (what Fig. 2/3 of fedmlac.md plot as bars and error
    bars)."""
    arr = np.asarray([v for v in values if np.isfinite(v)], dtype=float)
    if arr.size == 0:
        return float("nan"), float("nan")
    return float(arr.mean()), float(arr.std())


def false_accept_reject(y_true, y_pred, negatives) -> dict[str, float]:
    """Keyword spotting's false accept and false reject rates, pooled over all M clips as
    FedKWS-UI's code computes them (`test_fa_fr`): with the negative classes R (silence, unknown),
    FA = #(true in R, predicted not in R) / M and FR = #(true not in R, predicted in R) / M, from
    the arg-max predictions (no threshold). A keyword confused with another keyword counts as
    neither. The paper's text says "average their FA rates" over the 10 words; the code, whose
    numbers Table 3 shows, pools."""
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    if len(y_true) == 0:
        return {"fa": float("nan"), "fr": float("nan")}
    true_neg, pred_neg = np.isin(y_true, negatives), np.isin(y_pred, negatives)
    return {"fa": float(np.mean(true_neg & ~pred_neg)), "fr": float(np.mean(~true_neg & pred_neg))}


def transcription_metrics(references: list[str], hypotheses: list[str]) -> dict[str, float]:
    """Corpus WER and CER (jiwer): (substitutions + deletions + insertions) / reference words
    (characters)."""
    import jiwer

    if not references:
        return {"wer": float("nan"), "cer": float("nan")}
    return {
        "wer": float(jiwer.wer(references, hypotheses)),
        "cer": float(jiwer.cer(references, hypotheses)),
    }


def equal_error_rate(scores, targets) -> float:
    """EER of verification scores (higher = same speaker): the ROC point where the false-acceptance
    rate equals the false-rejection rate, linearly interpolated between the two ROC points around
    it."""
    from sklearn.metrics import roc_curve

    targets = np.asarray(targets)
    if targets.min() == targets.max():
        return float("nan")  # needs both target and non-target trials
    far, tpr, _ = roc_curve(targets, np.asarray(scores, dtype=float))
    frr = 1.0 - tpr
    k = int(np.argmax(far >= frr))  # first point where FAR has caught up with FRR
    if k == 0:
        return float(far[0])
    # FAR - FRR changes sign between k-1 and k: intersect the two lines.
    d0, d1 = far[k - 1] - frr[k - 1], far[k] - frr[k]
    t = d0 / (d0 - d1) if d0 != d1 else 0.0
    return float(far[k - 1] + t * (far[k] - far[k - 1]))


def confusion(y_true, y_pred, num_classes: int) -> np.ndarray:
    """Counts[true, predicted] over `num_classes` classes (int64)."""
    y_true, y_pred = np.asarray(y_true, dtype=np.int64), np.asarray(y_pred, dtype=np.int64)
    flat = np.bincount(y_true * num_classes + y_pred, minlength=num_classes * num_classes)
    return flat.reshape(num_classes, num_classes)


def confusion_metrics(counts: np.ndarray) -> dict[str, float]:
    """`classification_metrics` from a confusion matrix, without scikit-learn's per-call cost (a run
    scores every client at every evaluation): macro-F1 over the classes present in truth or
    prediction (F1 0 where a class has no true positive), UAR over the classes present in truth."""
    counts = np.asarray(counts, dtype=np.float64)
    total = counts.sum()
    if total == 0:
        return {"accuracy": float("nan"), "macro_f1": float("nan"), "uar": float("nan")}
    hits, true, pred = np.diag(counts), counts.sum(1), counts.sum(0)
    present = (true + pred) > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        f1 = np.where(hits > 0, 2 * hits / (true + pred), 0.0)
        recall = hits[true > 0] / true[true > 0]
    return {
        "accuracy": float(hits.sum() / total),
        "macro_f1": float(f1[present].mean()),
        "uar": float(recall.mean()),
    }


#: The share of clients whose mean is the "worst" figure of a spread (the lowest 10 % of scores).
WORST_SHARE = 0.1


def spread(values, weights=None) -> dict[str, float]:
    """How a per-client metric is spread over clients: mean, n_k-weighted mean (`weights`),
    population std, 10th / 50th / 90th percentiles (linear interpolation) and the mean of the worst
    10 % (the ceil(0.1 n) lowest values: a score where higher is better), over the finite values."""
    values = np.asarray(values, dtype=float)
    weights = np.ones_like(values) if weights is None else np.asarray(weights, dtype=float)
    keep = np.isfinite(values)
    values, weights = values[keep], weights[keep]
    if values.size == 0:
        return dict.fromkeys(
            ("mean", "weighted_mean", "std", "p10", "p50", "p90", "worst10_mean"), float("nan")
        )
    worst = np.sort(values)[: int(np.ceil(WORST_SHARE * values.size))]
    p10, p50, p90 = np.percentile(values, [10, 50, 90])
    weighted = float(np.average(values, weights=weights)) if weights.sum() > 0 else float("nan")
    return {
        "mean": float(values.mean()),
        "weighted_mean": weighted,
        "std": float(values.std()),
        "p10": float(p10),
        "p50": float(p50),
        "p90": float(p90),
        "worst10_mean": float(worst.mean()),
    }
