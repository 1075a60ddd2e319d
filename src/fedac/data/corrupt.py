"""Data corruption of fedmlac.md Sections 5.6 (noisy audio) and 5.7 (label errors).

Both are reproducible: every draw derives from (seed, purpose, id), so the same file gets the same
noise in every run with that seed, and the same client gets the same label flips.

Label errors follow the protocol of FedAudio that fedmlac.md cites: each client owns a C x C
row-stochastic transition matrix T with T[c, c] = 1 - e, and a training label c is replaced by a
draw from row c. How the error mass e is spread over the other C - 1 classes is not pinned down by
the paper; `spread="uniform"` (default) gives e / (C - 1) to each, so every client has the same
matrix and only its draws differ; `spread="random"` gives each client its own seeded split of e
over the other classes (a Dirichlet(1) draw per row), i.e. client-specific confusions. Either way
the expected flip rate of every class is exactly e, for any C >= 2. Only training labels change:
validation, test and each client's local hold-out keep their true labels
(`corrupt_training_labels`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from fedac.data.manifest import Manifest
from fedac.errors import ConfigError
from fedac.seeding import numpy_rng

CLEAN_SNR_DB = 100.0
SPREADS = ("uniform", "random")


def add_white_noise(audio: np.ndarray, snr_db: float, seed: int, key: str) -> np.ndarray:
    """y = x + n with n ~ N(0, P_s * 10^(-SNR/10)), P_s = mean(x^2); SNR >= 100 dB returns x
    unchanged.

    `key` identifies the file (e.g. its path), so each file gets its own reproducible draw. The
    power is measured over the whole clip, silences included, as the paper's formula states.
    """
    if not math.isfinite(snr_db):
        raise ConfigError(f"data.snr_db must be a finite number of dB, got {snr_db}")
    if snr_db >= CLEAN_SNR_DB:
        return audio
    signal_power = float(np.mean(np.square(audio, dtype=np.float64)))
    noise_std = np.sqrt(signal_power * 10.0 ** (-snr_db / 10.0))
    noise = numpy_rng(seed, "snr-noise", key).standard_normal(len(audio)) * noise_std
    return (audio + noise).astype(np.float32)


def _check_rate(error_rate: float) -> None:
    if not 0.0 <= error_rate <= 1.0:
        raise ConfigError(f"data.label_error must lie in [0, 1], got {error_rate}")


def transition_matrix(
    num_classes: int, error_rate: float, rng: np.random.Generator | None = None
) -> np.ndarray:
    """C x C row-stochastic matrix: diagonal 1 - e, the error mass e spread over the other classes.

    rng None: spread evenly (e / (C - 1) each). With an rng: each row's e is split by a Dirichlet(1)
    draw over the C - 1 other classes (a client-specific matrix when the rng is the client's).
    """
    _check_rate(error_rate)
    if num_classes < 2:
        return np.ones((num_classes, num_classes))
    if rng is None:
        matrix = np.full((num_classes, num_classes), error_rate / (num_classes - 1))
    else:
        matrix = np.zeros((num_classes, num_classes))
        off = ~np.eye(num_classes, dtype=bool)
        matrix[off] = (
            error_rate * rng.dirichlet(np.ones(num_classes - 1), size=num_classes)
        ).ravel()
    np.fill_diagonal(matrix, 1.0 - error_rate)
    return matrix


def client_matrix(
    num_classes: int, error_rate: float, seed: int, client: str, spread: str = "uniform"
) -> np.ndarray:
    """The transition matrix of one client (see the module notes on `spread`)."""
    if spread not in SPREADS:
        raise ConfigError(f"label-error spread must be one of {', '.join(SPREADS)}, got {spread!r}")
    rng = numpy_rng(seed, "label-error-matrix", client) if spread == "random" else None
    return transition_matrix(num_classes, error_rate, rng)


def corrupt_labels(
    labels: np.ndarray,
    num_classes: int,
    error_rate: float,
    seed: int,
    client: str,
    spread: str = "uniform",
) -> np.ndarray:
    """Draw each label of one client from its row of the client's transition matrix."""
    labels = np.asarray(labels)
    _check_rate(error_rate)
    if error_rate <= 0 or len(labels) == 0:
        return labels.copy()
    if labels.min() < 0 or labels.max() >= num_classes:
        raise ValueError(
            f"labels of client {client} must lie in [0, {num_classes}), got "
            f"{labels.min()}..{labels.max()}"
        )
    matrix = client_matrix(num_classes, error_rate, seed, client, spread)
    rng = numpy_rng(seed, "label-error", client)
    cumulative = matrix[labels].cumsum(axis=1)
    draws = rng.random(len(labels))[:, None]
    return np.minimum((draws > cumulative).sum(axis=1), num_classes - 1).astype(labels.dtype)


def corrupt_training_labels(
    manifest: Manifest, clients: Iterable, error_rate: float, seed: int, spread: str = "uniform"
) -> np.ndarray:
    """Labels of every manifest clip, with each client's training clips drawn through its matrix.

    `clients` are partition.ClientSplit objects (name, train, holdout). Clips outside any client's
    `train` list (validation, test, local hold-outs) keep their labels.
    """
    truth = np.array([clip.label for clip in manifest.clips], dtype=np.int64)
    labels = truth.copy()
    for client in clients:
        train = np.asarray(client.train, dtype=np.int64)
        if len(train):
            labels[train] = corrupt_labels(
                truth[train], manifest.num_classes, error_rate, seed, client.name, spread
            )
    return labels
