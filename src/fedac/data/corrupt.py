"""Data corruption of fedmlac.md Sections 5.6 (noisy audio) and 5.7 (label errors).

Both are reproducible: every draw derives from (seed, purpose, id), so the same file gets the same
noise in every run with that seed, and the same client gets the same label flips.
"""

from __future__ import annotations

import numpy as np

from fedac.seeding import numpy_rng

CLEAN_SNR_DB = 100.0


def add_white_noise(audio: np.ndarray, snr_db: float, seed: int, key: str) -> np.ndarray:
    """y = x + n with n ~ N(0, P_s * 10^(-SNR/10)), P_s = mean(x^2); SNR >= 100 dB returns x unchanged.

    `key` identifies the file (e.g. its path), so each file gets its own reproducible draw.
    """
    if snr_db >= CLEAN_SNR_DB:
        return audio
    signal_power = float(np.mean(np.square(audio, dtype=np.float64)))
    noise_std = np.sqrt(signal_power * 10.0 ** (-snr_db / 10.0))
    noise = numpy_rng(seed, "snr-noise", key).standard_normal(len(audio)) * noise_std
    return (audio + noise).astype(np.float32)


def transition_matrix(num_classes: int, error_rate: float) -> np.ndarray:
    """C x C row-stochastic matrix: diagonal 1 - e, the error mass spread evenly over the other classes."""
    if not 0.0 <= error_rate <= 1.0:
        raise ValueError(f"label error rate must lie in [0, 1], got {error_rate}")
    if num_classes < 2:
        return np.ones((num_classes, num_classes))
    off = error_rate / (num_classes - 1)
    matrix = np.full((num_classes, num_classes), off)
    np.fill_diagonal(matrix, 1.0 - error_rate)
    return matrix


def corrupt_labels(labels: np.ndarray, num_classes: int, error_rate: float, seed: int, client: str) -> np.ndarray:
    """Draw each label of one client from its row of the client's transition matrix."""
    labels = np.asarray(labels)
    if error_rate <= 0 or len(labels) == 0:
        return labels.copy()
    matrix = transition_matrix(num_classes, error_rate)
    rng = numpy_rng(seed, "label-error", client)
    cumulative = matrix[labels].cumsum(axis=1)
    draws = rng.random(len(labels))[:, None]
    return np.minimum((draws > cumulative).sum(axis=1), num_classes - 1).astype(labels.dtype)
