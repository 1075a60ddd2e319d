"""`fedac stream`: keyword spotting over a long recording with a trained keyword model.

The usual decoder of small-footprint keyword spotting (Chen, Parada and Heigold, ICASSP 2014):
1. slide the model's input window (1 s at the defaults) over the recording at `hop` seconds;
   windows whose level is below `gate_db` dBFS (RMS) are silence and get no posterior (an energy
   gate: the models know no silence class unless the task has one, and CMVN would blow a silent
   window's features up to unit variance);
2. each window's posteriors (softmax of its logits), smoothed by a centred moving average over
   `smooth` windows (centred rather than trailing, so that the smoothing does not delay the peak);
3. a detection wherever a keyword's smoothed posterior reaches `threshold`, kept by greedy
   non-maximum suppression: the highest-scoring window first, then each next one that lies more
   than `refractory` seconds from every window kept (so no two detections are closer than the
   refractory period, and of a keyword's neighbouring windows the one aligned with it, which
   scores highest, is the one reported). A detection is printed with its window's start (seconds
   into the recording), its keyword and its smoothed posterior. The whole file is read first (an
   online detector would hold each decision `refractory` seconds for the same result).

Keywords: every label not starting with `_` (GSC-12's `_silence_` and `_unknown_` are not), or the
ones given. `score` matches detections to known keyword positions (same label, within one hop) and
counts recall and false alarms; `concatenate` builds such a recording from clips and silence.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedac.errors import ConfigError
from fedac.export.predict import Classifier, softmax


@dataclass(frozen=True)
class StreamSettings:
    hop: float = 0.1
    """Seconds between window starts."""
    smooth: int = 3
    """Windows in the centred moving average of the posteriors (1: none)."""
    threshold: float = 0.7
    refractory: float = 1.0
    """Seconds after a detection in which no other is reported."""
    gate_db: float = -50.0
    """Windows with an RMS level below this (dBFS) count as silence."""
    window: float = 1.0
    """Seconds of a window for models that read whole clips (SSL encoders)."""


@dataclass(frozen=True)
class Detection:
    time: float
    """Start of the window (seconds into the recording)."""
    label: str
    score: float


def check_settings(s: StreamSettings) -> None:
    if s.hop <= 0 or s.refractory < 0 or s.smooth < 1 or s.window <= 0:
        raise ConfigError(
            f"fedac stream: --hop {s.hop} and --window {s.window} must be > 0, --smooth {s.smooth} "
            f">= 1 and --refractory {s.refractory} >= 0"
        )
    if not 0 < s.threshold <= 1:
        raise ConfigError(f"fedac stream: --threshold {s.threshold} must lie in (0, 1]")


def keyword_columns(labels: list[str], keywords: list[str] | None) -> list[int]:
    if not keywords:
        return [i for i, name in enumerate(labels) if not name.startswith("_")]
    unknown = [k for k in keywords if k not in labels]
    if unknown:
        raise ConfigError(
            f"--keywords {', '.join(unknown)}: not labels of this model (it knows "
            f"{', '.join(labels[:12])}{', ...' if len(labels) > 12 else ''})"
        )
    return [labels.index(k) for k in keywords]


def posteriors(clf: Classifier, audio: np.ndarray, s: StreamSettings) -> np.ndarray:
    """(windows, classes) smoothed posteriors; rows of gated (silent) windows are zero."""
    rate = clf.sample_rate
    size = clf.clip_samples or int(round(s.window * rate))
    step = max(1, int(round(s.hop * rate)))
    if len(audio) < size:
        audio = np.pad(audio, (0, size - len(audio)))
    starts = range(0, len(audio) - size + 1, step)
    windows = [audio[i : i + size] for i in starts]
    rms = np.array([np.sqrt(np.mean(np.square(w, dtype=np.float64))) for w in windows])
    loud = 20 * np.log10(np.maximum(rms, 1e-12)) >= s.gate_db
    probs = np.zeros((len(windows), len(clf.labels)))
    chosen = [w for w, keep in zip(windows, loud) if keep]
    if clf.clip_samples is None:  # whole-clip models: normalised per window as per utterance
        chosen = [((w - w.mean()) / (w.std() + 1e-7)).astype(np.float32) for w in chosen]
    for i in range(0, len(chosen), 256):
        rows = np.flatnonzero(loud)[i : i + 256]
        probs[rows] = softmax(clf.logits(chosen[i : i + 256]).astype(np.float64))
    if s.smooth > 1:
        kernel = np.ones(s.smooth) / s.smooth
        probs = np.stack(
            [np.convolve(probs[:, c], kernel, mode="same") for c in range(probs.shape[1])], 1
        )
    return probs


def detect(
    probs: np.ndarray, labels: list[str], columns: list[int], s: StreamSettings
) -> list[Detection]:
    """Thresholded detections with a refractory period (the module docstring), in time order."""
    scores = probs[:, columns]
    best, best_col = scores.max(axis=1), scores.argmax(axis=1)
    span = s.refractory / s.hop - 1e-9  # (windows)
    kept: list[int] = []
    for t in np.argsort(-best, kind="stable"):
        if best[t] < s.threshold:
            break
        if all(abs(int(t) - k) >= span for k in kept):
            kept.append(int(t))
    return [
        Detection(t * s.hop, labels[columns[best_col[t]]], float(best[t])) for t in sorted(kept)
    ]


def stream(
    clf: Classifier, audio: np.ndarray, s: StreamSettings, keywords: list[str] | None = None
) -> list[Detection]:
    check_settings(s)
    columns = keyword_columns(clf.labels, keywords)
    return detect(posteriors(clf, audio, s), clf.labels, columns, s)


def concatenate(clips: list[np.ndarray], rate: int, gap: float) -> tuple[np.ndarray, list[float]]:
    """The clips one after another, `gap` seconds of silence before each and after the last; with
    the start time of each clip."""
    silence = np.zeros(int(round(gap * rate)), np.float32)
    parts, starts, at = [silence], [], len(silence)
    for clip in clips:
        starts.append(at / rate)
        parts += [clip.astype(np.float32), silence]
        at += len(clip) + len(silence)
    return np.concatenate(parts), starts


def score(
    detections: list[Detection], truth: list[tuple[float, str]], tolerance: float
) -> dict[str, float]:
    """Detections against known (start, label) keyword positions: a hit is the same label within
    `tolerance` seconds, each position matched once; every other detection is a false alarm."""
    free = list(truth)
    hits = 0
    for d in detections:
        match = next(
            (p for p in free if p[1] == d.label and abs(p[0] - d.time) <= tolerance + 1e-9), None
        )
        if match is not None:
            free.remove(match)
            hits += 1
    return {
        "keywords": len(truth),
        "detections": len(detections),
        "hits": hits,
        "recall": hits / len(truth) if truth else float("nan"),
        "false_alarms": len(detections) - hits,
    }
