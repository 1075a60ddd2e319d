"""Robust aggregators (issue 13): hand-computed cases and equality with Flower 1.41's own
functions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip(
    "flwr", reason="flwr is not installed (pip install 'flwr>=1.41,<1.42'); Flower tests skipped"
)

from flwr.server.strategy.aggregate import (
    aggregate_bulyan,
    aggregate_krum,
    aggregate_median,  # noqa: E402
    aggregate_trimmed_avg,
)

from fedac.config import AggregationConfig  # noqa: E402
from fedac.errors import ConfigError  # noqa: E402
from fedac.rules.aggregation import aggregate  # noqa: E402
from fedac.rules.robust import bulyan, coordinate_median, krum, multikrum, norm_bound, trimmed_mean  # noqa: E402


def scalars(values, sizes=None):
    """One upload per value: {'w': tensor([v])} with n_k from `sizes` (default 1 each)."""
    sizes = sizes or [1] * len(values)
    return [
        ({"w": torch.tensor([float(v)]), "count": torch.tensor(7)}, n)
        for v, n in zip(values, sizes)
    ]


def value(params):
    return float(params["w"][0])


def test_median_odd_and_even_counts():
    assert value(coordinate_median(scalars([1, 10, 2]))) == 2
    assert value(coordinate_median(scalars([1, 2, 3, 100]))) == 2.5
    assert int(coordinate_median(scalars([1, 2]))["count"]) == 7  # integer entries copied


def test_trimmed_mean_drops_each_end():
    assert value(trimmed_mean(scalars([1, 2, 3, 4, 100]), 0.2)) == pytest.approx(3.0)
    assert value(trimmed_mean(scalars([1, 2, 3, 4, 100]), 0.0)) == pytest.approx(22.0)
    with pytest.raises(ConfigError, match="aggregation.trim_fraction"):
        trimmed_mean(scalars([1, 2]), 0.5)


def test_krum_picks_the_upload_closest_to_its_neighbours():
    # f = 1, n = 5: scores sum the 2 nearest squared distances; 0.1 scores 0.01 + 0.04 = 0.05.
    assert value(krum(scalars([0, 0.1, 0.3, 5, 10]), 1)) == pytest.approx(0.1)


def test_multikrum_averages_the_best_scores_weighted_by_n_k():
    # scores: 0 -> 0.10, 0.1 -> 0.05, 0.3 -> 0.13: keep 0.1 (n=3) and 0 (n=1).
    out = multikrum(scalars([0, 0.1, 0.3, 5, 10], [1, 3, 1, 1, 1]), 1, keep=2)
    assert value(out) == pytest.approx(0.075)
    with pytest.raises(ConfigError, match="multikrum_keep"):
        multikrum(scalars([0, 1]), 0, keep=3)


def test_bulyan_selects_by_krum_then_averages_around_the_median():
    # n = 7, f = 1: Krum picks 2, 1, 3, 0, 4 (never +-100); beta = 3 values closest to the median 2:
    # 1, 2, 3.
    assert value(bulyan(scalars([0, 1, 2, 3, 4, 100, -100]), 1)) == pytest.approx(2.0)
    with pytest.raises(ConfigError, match="at least 4 \\* num_malicious \\+ 3 = 11 clients, got 7"):
        bulyan(scalars([0, 1, 2, 3, 4, 5, 6]), 2)


def test_norm_bound_clips_each_update_then_averages():
    reference = {"w": torch.zeros(2)}
    uploads = [({"w": torch.tensor([3.0, 4.0])}, 1), ({"w": torch.tensor([0.3, 0.4])}, 1)]
    out = norm_bound(uploads, reference, 1.0)
    assert torch.allclose(out["w"], torch.tensor([0.45, 0.6]))
    with pytest.raises(ConfigError, match="clip_norm"):
        norm_bound(uploads, reference, 0.0)
    # aggregate reports the update norms against clip_norm (norms 5, 0.5 and 2: median 2, two of
    # three clipped)
    uploads.append(({"w": torch.tensor([1.2, 1.6])}, 1))
    metrics = aggregate(
        uploads, AggregationConfig(method="norm_bound", clip_norm=1.0), reference=reference
    ).metrics
    assert metrics == {
        "update_norm_median": pytest.approx(2.0),
        "clipped_share": pytest.approx(2 / 3),
    }
    assert aggregate(uploads, AggregationConfig(method="median"), reference=reference).metrics == {}


def test_robust_method_replaces_lpa_and_mean_in_aggregate():
    uploads = scalars([1, 10, 2])
    for use_lpa in (None, True, False):  # FedMLAC forces LPA on/off; an explicit robust rule wins
        out = aggregate(uploads, AggregationConfig(method="median"), use_lpa)
        params, pruning = out.params, out.pruning
        assert value(params) == 2 and pruning is None
    with pytest.raises(
        ConfigError, match="unknown aggregation.method 'medain'.*median, trimmed_mean"
    ):
        aggregate(uploads, AggregationConfig(method="medain"))


# --- equality with Flower -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cohort():
    gen = torch.Generator().manual_seed(13)
    uploads = [
        (
            {
                "w": torch.randn(3, 4, generator=gen, dtype=torch.float64),
                "b": torch.randn(3, generator=gen, dtype=torch.float64) * (1 + 5 * (k == 0)),
            },
            10 + k,
        )
        for k in range(11)
    ]
    flower = [([p["w"].numpy(), p["b"].numpy()], n) for p, n in uploads]
    return uploads, flower


def same(ours, theirs):
    np.testing.assert_allclose(ours["w"].numpy(), theirs[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ours["b"].numpy(), theirs[1], rtol=1e-12, atol=1e-12)


def test_equal_to_flower_median_and_trimmed_mean(cohort):
    uploads, flower = cohort
    same(coordinate_median(uploads), aggregate_median(flower))
    same(coordinate_median(uploads[:10]), aggregate_median(flower[:10]))
    same(trimmed_mean(uploads, 0.2), aggregate_trimmed_avg(flower, 0.2))


def test_equal_to_flower_krum_multikrum_bulyan(cohort):
    uploads, flower = cohort
    same(krum(uploads, 2), aggregate_krum(flower, num_malicious=2, to_keep=0))
    same(multikrum(uploads, 2, keep=5), aggregate_krum(flower, num_malicious=2, to_keep=5))
    same(
        bulyan(uploads, 2),
        aggregate_bulyan(list(flower), num_malicious=2, aggregation_rule=aggregate_krum, to_keep=0),
    )


@pytest.mark.parametrize(
    "method, key, a, b",
    [
        ("trimmed_mean", "trim_fraction", 0.0, 0.2),
        ("krum", "num_malicious", 0, 3),
        ("multikrum", "multikrum_keep", 2, 3),
        ("bulyan", "num_malicious", 0, 1),
        ("norm_bound", "clip_norm", 0.5, 5.0),
    ],
)
def test_each_robust_setting_changes_the_aggregate(method, key, a, b):
    """Flipping one setting of `aggregation.*` changes the result of `aggregate` and nothing else
    does."""
    uploads = scalars([0.0, 0.1, 0.35, 0.45, 2.0, 9.0, 1.0])
    reference = {"w": torch.zeros(1), "count": torch.tensor(7)}
    first = aggregate(
        uploads, AggregationConfig(method=method, **{key: a}), reference=reference
    ).params
    second = aggregate(
        uploads, AggregationConfig(method=method, **{key: b}), reference=reference
    ).params
    assert value(first) != pytest.approx(value(second))
