"""n_k-weighted mean (fedmlac.md Eq. 3) and Layer-wise Pruning Aggregation (Eq. 10-14), checked by
hand."""

from __future__ import annotations

import logging

import pytest
import torch

from fedac.config import AggregationConfig
from fedac.errors import ConfigError
from fedac.rules.aggregation import (
    aggregate,
    finite,
    layer_groups,
    lpa,
    trusted_clients,
    weighted_mean,
)


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


# --- weighted mean ------------------------------------------------------------------------------


def test_weighted_mean_uses_unequal_sample_counts():
    uploads = [
        ({"w": t(1.0, 2.0), "b": t(0.0), "steps": torch.tensor(7)}, 3),
        ({"w": t(3.0, 6.0), "b": t(4.0), "steps": torch.tensor(9)}, 1),
    ]
    out = weighted_mean(uploads)
    # (3 * [1, 2] + 1 * [3, 6]) / 4 = [1.5, 3.0]; (3 * 0 + 1 * 4) / 4 = 1.0
    assert torch.allclose(out["w"], t(1.5, 3.0))
    assert torch.allclose(out["b"], t(1.0))
    assert out["w"].dtype == torch.float32
    # integer entries (counters) are copied from the first upload, not averaged
    assert out["steps"].item() == 7
    assert list(out) == ["w", "b", "steps"]


def test_weighted_mean_three_clients_not_plain_mean():
    uploads = [({"w": t(0.0)}, 1), ({"w": t(10.0)}, 2), ({"w": t(-5.0)}, 7)]
    # (1*0 + 2*10 + 7*(-5)) / 10 = -1.5 (the unweighted mean would be 1.667)
    assert weighted_mean(uploads)["w"].item() == pytest.approx(-1.5)


def test_weighted_mean_rejects_empty_cohort():
    with pytest.raises(ValueError, match="empty"):
        weighted_mean([])


# --- LPA ----------------------------------------------------------------------------------------

# Five clients, three layers, unequal n_k. Values chosen so each layer prunes different clients.
N_K = [1, 2, 3, 4, 5]
L1 = [0.0, 1.0, 2.0, 3.0, 10.0]  # mean 3.2 -> deviations 3.2, 2.2, 1.2, 0.2, 6.8
# mean (0, 0) -> dev^2 16, 2, 1, 8, 5
L2 = [(4.0, 0.0), (-1.0, -1.0), (0.0, 1.0), (-2.0, 2.0), (-1.0, -2.0)]
L3 = [7.0, -6.0, 0.0, 1.0, 2.0]  # mean 0.8 -> deviations 6.2, 6.8, 0.8, 0.2, 1.2


def five_clients() -> list[tuple[dict[str, torch.Tensor], int]]:
    return [
        ({"l1.weight": t(L1[k]), "l2.weight": t(*L2[k]), "l3.bias": t(L3[k])}, N_K[k])
        for k in range(5)
    ]


def test_lpa_hand_computed_symmetric_pruning():
    # v_l = v_h = 0.2 on 5 clients: floor(1) lowest and floor(1) highest deviation pruned per layer.
    out, trusted = lpa(five_clients(), v_l=0.2, v_h=0.2, unit="tensor")
    # l1 ascending deviation: c3 (0.2), c2, c1, c0, c4 (6.8) -> drop c3 and c4
    # l2 ascending dev^2:     c2 (1), c1 (2), c4 (5), c3 (8), c0 (16) -> drop c2 and c0
    # l3 ascending deviation: c3 (0.2), c2 (0.8), c4 (1.2), c0 (6.2), c1 (6.8) -> drop c3 and c1
    assert sorted(trusted["l1.weight"]) == [0, 1, 2]
    assert sorted(trusted["l2.weight"]) == [1, 3, 4]
    assert sorted(trusted["l3.bias"]) == [0, 2, 4]
    # Eq. 14: n_k-weighted mean over the trusted set of each layer.
    assert out["l1.weight"].item() == pytest.approx((1 * 0 + 2 * 1 + 3 * 2) / (1 + 2 + 3))
    assert out["l2.weight"].tolist() == pytest.approx(
        [(2 * -1 + 4 * -2 + 5 * -1) / (2 + 4 + 5), (2 * -1 + 4 * 2 + 5 * -2) / (2 + 4 + 5)]
    )
    assert out["l3.bias"].item() == pytest.approx((1 * 7 + 3 * 0 + 5 * 2) / (1 + 3 + 5))


def test_lpa_hand_computed_asymmetric_pruning():
    # v_l = 0.2 -> 1 lowest pruned, v_h = 0.4 -> floor(2.0) = 2 highest pruned: 2 trusted per layer.
    out, trusted = lpa(five_clients(), v_l=0.2, v_h=0.4, unit="tensor")
    assert sorted(trusted["l1.weight"]) == [1, 2]
    assert sorted(trusted["l2.weight"]) == [1, 4]
    assert sorted(trusted["l3.bias"]) == [2, 4]
    assert out["l1.weight"].item() == pytest.approx((2 * 1 + 3 * 2) / 5)
    assert out["l2.weight"].tolist() == pytest.approx(
        [(2 * -1 + 5 * -1) / 7, (2 * -1 + 5 * -2) / 7]
    )
    assert out["l3.bias"].item() == pytest.approx((3 * 0 + 5 * 2) / 8)


def test_lpa_without_pruning_equals_weighted_mean():
    uploads = five_clients()
    out, trusted = lpa(uploads, 0.0, 0.0)
    expected = weighted_mean(uploads)
    assert all(sorted(k) == [0, 1, 2, 3, 4] for k in trusted.values())
    for name in expected:
        assert torch.allclose(out[name], expected[name])
    # by hand for one layer: sum(n_k * x_k) / 15
    assert out["l1.weight"].item() == pytest.approx((0 + 2 + 6 + 12 + 50) / 15)


def test_lpa_empty_trusted_set_keeps_median_client_and_warns(caplog):
    # v_l=0.6 -> 3 lowest, v_h=0.4 -> 2 highest: all 5 pruned. The median-deviation client stays:
    # l1 ascending deviation c3, c2, c1, c0, c4 -> median c1 (value 1.0).
    with caplog.at_level(logging.WARNING, logger="fedac.rules.aggregation"):
        out, trusted = lpa(five_clients(), v_l=0.6, v_h=0.4, unit="tensor")
    assert trusted["l1.weight"] == [1]
    assert out["l1.weight"].item() == pytest.approx(1.0)
    # l3 ascending c3, c2, c4, c0, c1 -> median c4 (value 2.0)
    assert trusted["l3.bias"] == [4]
    assert out["l3.bias"].item() == pytest.approx(2.0)
    assert any("LPA" in r.getMessage() and "median" in r.getMessage() for r in caplog.records)
    assert all(r.levelno == logging.WARNING for r in caplog.records if "LPA" in r.getMessage())


def test_trusted_clients_sizes_follow_eq13():
    deviations = torch.tensor([5.0, 1.0, 4.0, 2.0, 3.0, 9.0, 0.5, 7.0, 6.0, 8.0])
    # |T| = 10 - floor(0.25 * 10) - floor(0.15 * 10) = 10 - 2 - 1 = 7
    kept = trusted_clients(deviations, v_l=0.15, v_h=0.25)
    assert len(kept) == 7
    # dropped: lowest one (0.5 at index 6) and the two highest (9 at 5, 8 at 9)
    assert sorted(kept) == [0, 1, 2, 3, 4, 7, 8]


def test_lpa_module_unit_groups_weight_and_bias():
    uploads = [
        (
            {"conv.weight": t(0.0), "conv.bias": t(0.0), "bn.num_batches_tracked": torch.tensor(3)},
            1,
        ),
        (
            {
                "conv.weight": t(1.0),
                "conv.bias": t(10.0),
                "bn.num_batches_tracked": torch.tensor(4),
            },
            1,
        ),
        (
            {"conv.weight": t(5.0), "conv.bias": t(1.0), "bn.num_batches_tracked": torch.tensor(5)},
            2,
        ),
    ]
    # v_h = 0.34 -> floor(1.02) = 1 highest deviation dropped per layer.
    # tensor unit: weight mean 2 -> devs 2, 1, 3 -> drop c2; bias mean 11/3 -> devs 3.67, 6.33, 2.67
    # -> drop c1
    out_t, trusted_t = lpa(uploads, 0.0, 0.34, unit="tensor")
    assert set(trusted_t) == {"conv.weight", "conv.bias"}
    assert sorted(trusted_t["conv.weight"]) == [0, 1]
    assert sorted(trusted_t["conv.bias"]) == [0, 2]
    assert out_t["conv.weight"].item() == pytest.approx((0 + 1) / 2)
    assert out_t["conv.bias"].item() == pytest.approx((0 * 1 + 1 * 2) / 3)
    # module unit: one deviation over weight and bias together:
    # c0: 2^2 + (11/3)^2 = 17.4, c1: 1 + (19/3)^2 = 41.1, c2: 3^2 + (8/3)^2 = 16.1 -> drop c1 for
    # both
    out_m, trusted_m = lpa(uploads, 0.0, 0.34, unit="module")
    assert set(trusted_m) == {"conv"}
    assert sorted(trusted_m["conv"]) == [0, 2]
    assert out_m["conv.weight"].item() == pytest.approx((0 * 1 + 5 * 2) / 3)
    assert out_m["conv.bias"].item() == pytest.approx((0 * 1 + 1 * 2) / 3)
    # integer entries are copied from the first upload, the key order is kept
    assert out_m["bn.num_batches_tracked"].item() == 3
    assert list(out_m) == ["conv.weight", "conv.bias", "bn.num_batches_tracked"]


def test_layer_groups_and_bad_unit():
    names = ["conv.0.weight", "conv.0.bias", "head.weight"]
    assert layer_groups(names, "module") == {
        "conv.0": ["conv.0.weight", "conv.0.bias"],
        "head": ["head.weight"],
    }
    assert layer_groups(names, "tensor") == {n: [n] for n in names}
    with pytest.raises(ConfigError, match="layer_unit"):
        layer_groups(names, "block")


def test_lpa_rejects_bad_fractions_and_empty_cohort():
    with pytest.raises(ConfigError, match="v_l"):
        lpa(five_clients(), 1.0, 0.1)
    with pytest.raises(ConfigError, match="v_h"):
        lpa(five_clients(), 0.1, -0.1)
    with pytest.raises(ValueError, match="empty"):
        lpa([], 0.1, 0.1)


# --- aggregate(cfg) -----------------------------------------------------------------------------


def test_aggregate_mean_and_lpa_by_config():
    uploads = five_clients()
    out = aggregate(uploads, AggregationConfig(method="mean"))
    mean, metrics, pruning = out.params, out.metrics, out.pruning
    assert metrics == {} and pruning is None
    assert mean["l1.weight"].item() == pytest.approx((0 + 2 + 6 + 12 + 50) / 15)

    cfg = AggregationConfig(method="lpa", v_l=0.2, v_h=0.2, layer_unit="tensor")
    out = aggregate(uploads, cfg)
    pruned, metrics, pruning = out.params, out.metrics, out.pruning
    assert sorted(pruning["l1.weight"].trusted) == [0, 1, 2]
    assert pruned["l1.weight"].item() == pytest.approx(8 / 6)
    # 3 trusted of 5 clients in each of 3 layers
    assert metrics["lpa_trusted_fraction"] == pytest.approx(9 / 15)

    # use_lpa overrides the configured method either way
    forced = aggregate(
        uploads, AggregationConfig(method="mean", v_l=0.2, v_h=0.2), use_lpa=True
    ).params
    assert forced["l3.bias"].item() == pytest.approx(17 / 9)
    plain = aggregate(uploads, cfg, use_lpa=False).params
    assert plain["l3.bias"].item() == pytest.approx((7 - 12 + 0 + 4 + 10) / 15)


def test_uniform_weighting_gives_every_upload_the_same_weight():
    uploads = [({"w": t(0.0)}, 1), ({"w": t(10.0)}, 2), ({"w": t(-5.0)}, 7)]
    weighted = aggregate(uploads, AggregationConfig()).params  # n_k, the default: -1.5 (above)
    uniform = aggregate(uploads, AggregationConfig(weighting="uniform")).params
    assert weighted["w"].item() == pytest.approx(-1.5) and uniform["w"].item() == pytest.approx(
        5 / 3
    )
    assert aggregate(uploads, AggregationConfig(), weighting="uniform").params[
        "w"
    ].item() == pytest.approx(5 / 3)
    # LPA's Eq. 14 mean over the trusted clients too; its pruning bias still reads the uploads' n_k
    cfg = AggregationConfig(
        method="lpa", v_l=0.2, v_h=0.2, layer_unit="tensor", weighting="uniform"
    )
    out = aggregate(five_clients(), cfg)
    pruned, metrics, pruning = out.params, out.metrics, out.pruning
    trusted = sorted(pruning["l1.weight"].trusted)
    values = [five_clients()[k][0]["l1.weight"].item() for k in trusted]
    assert pruned["l1.weight"].item() == pytest.approx(sum(values) / len(values))
    assert (
        metrics
        == aggregate(
            five_clients(), AggregationConfig(method="lpa", v_l=0.2, v_h=0.2, layer_unit="tensor")
        ).metrics
    )
    with pytest.raises(ConfigError, match="aggregation.weighting must be one of n_k, uniform"):
        aggregate(uploads, AggregationConfig(weighting="equal"))


def test_aggregate_unknown_method_names_setting():
    with pytest.raises(ConfigError, match="aggregation.method 'geomed'"):
        aggregate(five_clients(), AggregationConfig(method="geomed"))


def test_finite():
    assert finite({"w": t(1.0, 2.0), "n": torch.tensor(3)})
    assert not finite({"w": t(1.0, float("nan"))})
    assert not finite({"w": t(float("inf"))})
