"""k-medoids by PAM (Kaufman & Rousseeuw 1990): a greedy BUILD, then SWAP until no swap lowers the
cost.

Why hand-written: the `kmedoids` package (FasterPAM) is GPL-3.0-or-later while fedac is Apache-2.0,
and scikit-learn-extra's KMedoids does not import under numpy 2 (binary incompatibility). The
zero-shot algorithm clusters a few thousand points into a handful of clusters, where PAM's O(k n^2)
per swap pass over a precomputed distance matrix is cheap. Tested against brute force on small
cases.
"""

from __future__ import annotations

import numpy as np


def pairwise_distances(points: np.ndarray) -> np.ndarray:
    """Euclidean distances between the rows of `points` (n, d)."""
    points = np.asarray(points, dtype=np.float64)
    sq = (points**2).sum(1)
    d = np.sqrt(np.clip(sq[:, None] + sq[None, :] - 2.0 * points @ points.T, 0.0, None))
    np.fill_diagonal(d, 0.0)  # the expansion leaves rounding residue where it must be exactly 0
    return d


def total_cost(distances: np.ndarray, medoids) -> float:
    """Sum over points of the distance to their nearest medoid."""
    return float(distances[:, list(medoids)].min(axis=1).sum())


def pam(distances: np.ndarray, k: int, max_iter: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """(medoid indices (k,), cluster of each point (n,) as an index into the medoids).

    BUILD adds, one at a time, the point that lowers the total cost most; SWAP then replaces a
    medoid by a non-medoid while that lowers the cost (the best swap of each pass). Deterministic:
    ties go to the lowest index.
    """
    d = np.asarray(distances, dtype=np.float64)
    n = d.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"k-medoids needs 1 <= k <= number of points ({n}), got k={k}")
    medoids = [int(d.sum(axis=0).argmin())]
    nearest = d[:, medoids[0]].copy()
    while len(medoids) < k:
        gain = np.minimum(nearest[:, None], d).sum(axis=0)
        gain[medoids] = np.inf
        best = int(gain.argmin())
        medoids.append(best)
        nearest = np.minimum(nearest, d[:, best])
    cost = total_cost(d, medoids)
    for _ in range(max_iter):
        best_cost, best_swap = cost, None
        for slot in range(k):
            others = [m for j, m in enumerate(medoids) if j != slot]
            rest = d[:, others].min(axis=1) if others else np.full(n, np.inf)
            costs = np.minimum(rest[:, None], d).sum(axis=0)
            costs[medoids] = np.inf
            h = int(costs.argmin())
            if costs[h] < best_cost - 1e-12:
                best_cost, best_swap = float(costs[h]), (slot, h)
        if best_swap is None:
            break
        medoids[best_swap[0]] = best_swap[1]
        cost = best_cost
    medoids_arr = np.array(medoids)
    return medoids_arr, d[:, medoids_arr].argmin(axis=1)
