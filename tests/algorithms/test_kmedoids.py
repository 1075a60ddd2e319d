"""PAM against brute force: the optimum on small clustered cases (PAM is a heuristic, so on
arbitrary points only a swap-local optimum is guaranteed, checked on random points)."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest

from fedac.algorithms.zeroshot_kmedoids import pairwise_distances, pam, total_cost


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("k", [1, 2, 3])
def test_pam_matches_brute_force_on_small_cases(seed, k):
    rng = np.random.default_rng(seed)
    points = np.concatenate([rng.normal(c, 0.4, size=(4, 2)) for c in ([0, 0], [3, 0], [0, 3])])
    d = pairwise_distances(points)
    medoids, assign = pam(d, k)
    best = min(total_cost(d, combo) for combo in combinations(range(len(points)), k))
    assert total_cost(d, medoids) == pytest.approx(best)
    assert len(set(medoids.tolist())) == k
    np.testing.assert_array_equal(assign, d[:, medoids].argmin(axis=1))


def test_pam_result_is_swap_local_optimum_on_random_points():
    rng = np.random.default_rng(7)
    d = pairwise_distances(rng.normal(size=(30, 3)))
    medoids, _ = pam(d, 4)
    cost = total_cost(d, medoids)
    for slot in range(4):
        for h in range(30):
            trial = medoids.copy()
            trial[slot] = h
            if len(set(trial.tolist())) == 4:
                assert total_cost(d, trial) >= cost - 1e-9


def test_pairwise_distances_hand_case():
    d = pairwise_distances(np.array([[0.0, 0.0], [3.0, 4.0]]))
    np.testing.assert_allclose(d, [[0, 5], [5, 0]], atol=1e-7)


def test_pam_refuses_bad_k():
    with pytest.raises(ValueError, match="1 <= k <= number of points"):
        pam(np.zeros((3, 3)), 4)
