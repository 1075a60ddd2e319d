"""LPA beyond Eq. 11 as written: layers as modules (recurrent layers included), the step-normalised
and cosine deviation scores, and the measurement of pruning bias against data-rich clients. Hand
cases."""

from __future__ import annotations

import math

import pytest
import torch

from fedac.config import AggregationConfig, TrainConfig
from fedac.errors import ConfigError
from fedac.rules.aggregation import (
    LayerPruning,
    aggregate,
    layer_deviation,
    layer_groups,
    lpa,
    pruning_bias,
    spearman,
)
from fedac.training.local import local_steps


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def test_module_unit_is_the_default_and_groups_recurrent_layers():
    names = [
        "conv.0.weight",
        "conv.0.bias",
        "rnn.weight_ih_l0",
        "rnn.weight_hh_l0",
        "rnn.bias_ih_l0",
        "rnn.weight_ih_l0_reverse",
        "rnn.weight_ih_l1",
        "rnn.bias_hh_l1",
        "head.weight",
        "head.bias",
    ]
    assert AggregationConfig().layer_unit == "module"
    assert layer_groups(names, "module") == {
        "conv.0": ["conv.0.weight", "conv.0.bias"],
        "rnn.l0": [
            "rnn.weight_ih_l0",
            "rnn.weight_hh_l0",
            "rnn.bias_ih_l0",
            "rnn.weight_ih_l0_reverse",
        ],
        "rnn.l1": ["rnn.weight_ih_l1", "rnn.bias_hh_l1"],
        "head": ["head.weight", "head.bias"],
    }


def test_default_unit_prunes_weight_and_bias_from_the_same_clients():
    # Tensor unit would drop c2 for the weight and c1 for the bias (see test_aggregation); the
    # default module unit drops one client for the whole layer.
    uploads = [
        ({"conv.weight": t(0.0), "conv.bias": t(0.0)}, 1),
        ({"conv.weight": t(1.0), "conv.bias": t(10.0)}, 1),
        ({"conv.weight": t(5.0), "conv.bias": t(1.0)}, 2),
    ]
    _, trusted = lpa(uploads, 0.0, 0.34)
    assert list(trusted) == ["conv"] and sorted(trusted["conv"]) == [0, 2]


# Three clients, one scalar layer; global model 1.0. Updates 1, -1, 8 after 1, 1 and 8 local steps:
# the data-rich client c2 moved furthest only because it took 8 steps (per step it moved like c0).
REFERENCE = {"w.weight": t(1.0)}
UPLOADS = [({"w.weight": t(2.0)}, 10), ({"w.weight": t(0.0)}, 10), ({"w.weight": t(9.0)}, 80)]
STEPS = [1, 1, 8]


def test_raw_deviation_prunes_the_client_that_took_most_steps():
    # Eq. 10-11: mean 11/3 -> deviations 5/3, 11/3, 16/3; v_h = 1/3 drops the largest, c2.
    scores = layer_deviation(
        {"w.weight": torch.stack([p["w.weight"].double() for p, _ in UPLOADS])}
    )
    assert scores.tolist() == pytest.approx([5 / 3, 11 / 3, 16 / 3])
    out, trusted = lpa(UPLOADS, 0.0, 0.34)
    assert sorted(trusted["w"]) == [0, 1]
    assert out["w.weight"].item() == pytest.approx((10 * 2 + 10 * 0) / 20)


def test_per_step_deviation_keeps_the_data_rich_client():
    # Per-step updates (2-1)/1 = 1, (0-1)/1 = -1, (9-1)/8 = 1: mean 1/3 -> deviations 2/3, 4/3, 2/3.
    stacked = {"w.weight": torch.stack([p["w.weight"].double() for p, _ in UPLOADS])}
    scores = layer_deviation(
        stacked, "per_step", REFERENCE, torch.tensor(STEPS, dtype=torch.float64)
    )
    assert scores.tolist() == pytest.approx([2 / 3, 4 / 3, 2 / 3])
    out, trusted = lpa(UPLOADS, 0.0, 0.34, deviation="per_step", reference=REFERENCE, steps=STEPS)
    assert sorted(trusted["w"]) == [0, 2]
    # Eq. 14 is unchanged: the trusted *models* are averaged with their n_k.
    assert out["w.weight"].item() == pytest.approx((10 * 2 + 80 * 9) / 90)


def test_cosine_deviation_ignores_the_update_length():
    # Updates (1, 0), (0, 1), (10, 10) from a zero global model; their mean points along (1, 1).
    # 1 - cos: 1 - 1/sqrt(2) for c0 and c1, 0 for c2. Raw deviations would call the long c2 the
    # outlier.
    ref = {"w.weight": torch.zeros(2)}
    uploads = [
        ({"w.weight": t(1.0, 0.0)}, 1),
        ({"w.weight": t(0.0, 1.0)}, 1),
        ({"w.weight": t(10.0, 10.0)}, 1),
    ]
    stacked = {"w.weight": torch.stack([p["w.weight"].double() for p, _ in uploads])}
    scores = layer_deviation(stacked, "cosine", ref)
    assert scores.tolist() == pytest.approx(
        [1 - 1 / math.sqrt(2), 1 - 1 / math.sqrt(2), 0.0], abs=1e-12
    )
    assert sorted(lpa(uploads, 0.0, 0.34)[1]["w"]) == [0, 1]
    # ties (c0, c1) broken by client order: the stable sort puts c1 last, so c1 is dropped
    assert lpa(uploads, 0.0, 0.34, deviation="cosine", reference=ref)[1] == {"w": [2, 0]}


def test_deviation_options_need_their_inputs_and_a_known_name():
    with pytest.raises(ConfigError, match="reference"):
        lpa(UPLOADS, 0.0, 0.34, deviation="per_step")
    with pytest.raises(ConfigError, match="step count"):
        lpa(UPLOADS, 0.0, 0.34, deviation="per_step", reference=REFERENCE)
    with pytest.raises(ConfigError, match="aggregation.deviation"):
        lpa(UPLOADS, 0.0, 0.34, deviation="angle", reference=REFERENCE)


def test_aggregate_passes_reference_and_steps_for_the_configured_deviation():
    cfg = AggregationConfig(method="lpa", v_l=0.0, v_h=0.34, deviation="per_step")
    out = aggregate(UPLOADS, cfg, reference=REFERENCE, steps=STEPS)
    metrics, layers = out.metrics, out.pruning
    assert sorted(layers["w"].trusted) == [0, 2]
    assert metrics["lpa_kept_data_share"] == pytest.approx(90 / 100)
    raw_metrics = aggregate(UPLOADS, AggregationConfig(method="lpa", v_l=0.0, v_h=0.34)).metrics
    assert raw_metrics["lpa_kept_data_share"] == pytest.approx(20 / 100)


def test_pruning_bias_by_hand():
    # Sizes 1, 2, 3, 10: the top quarter by n_k is c3. Layer a prunes c3, layer b prunes c0.
    layers = {
        "a": LayerPruning(torch.tensor([1.0, 2.0, 3.0, 4.0]), [0, 1, 2]),
        "b": LayerPruning(torch.tensor([4.0, 3.0, 2.0, 1.0]), [1, 2, 3]),
    }
    bias = pruning_bias(layers, [1, 2, 3, 10])
    assert bias["lpa_trusted_fraction"] == pytest.approx(0.75)
    assert bias["lpa_kept_data_share"] == pytest.approx((6 / 16 + 15 / 16) / 2)
    assert bias["lpa_rich_pruned"] == pytest.approx(0.5)  # pruned in a, kept in b
    assert bias["lpa_rest_pruned"] == pytest.approx((0 + 1 / 3) / 2)
    assert bias["lpa_size_deviation_rank_corr"] == pytest.approx(0.0)  # +1 in a, -1 in b


def test_spearman_and_local_steps():
    assert spearman(
        torch.tensor([1.0, 2.0, 3.0]), torch.tensor([10.0, 30.0, 20.0])
    ) == pytest.approx(0.5)
    assert math.isnan(spearman(torch.tensor([1.0, 1.0]), torch.tensor([1.0, 2.0])))
    cfg = TrainConfig(batch_size=16, local_epochs=3)
    assert [local_steps(n, cfg) for n in (1, 16, 17, 40)] == [3, 3, 6, 9]


@pytest.mark.parametrize("method", ["lpa", "mean"])
def test_server_update_returns_lpa_pruning_with_its_metrics(method):
    """LPA's decisions come back from the server step as a value (ServerMetrics.pruning, what the
    engine writes to lpa.jsonl), not through an attribute of the algorithm; None for the mean."""
    from fedac.algorithms import build_algorithm
    from fedac.algorithms.base import Task
    from fedac.config import load_config
    from fedac.rules.aggregation import ServerMetrics

    cfg = load_config(
        overrides=[
            "algorithm=fedavg",
            "model.name=dscnn",
            f"aggregation.method={method}",
            "aggregation.v_l=0.0",
            "aggregation.v_h=0.34",
        ]
    )
    algo = build_algorithm(cfg, Task(40, 12, ["a"]))
    server = algo.init_server()
    gen = torch.Generator().manual_seed(0)
    uploads = [
        (
            {
                k: v + scale * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v
                for k, v in server["params"].items()
            },
            5,
        )
        for scale in (0.01, 0.02, 1.0)
    ]
    _, metrics = algo.server_update(server, uploads, 1)
    assert isinstance(metrics, ServerMetrics) and not hasattr(algo, "last_pruning")
    if method == "mean":
        assert metrics.pruning is None and dict(metrics) == {}
        return
    assert set(metrics.pruning) == set(
        layer_groups([k for k, v in server["params"].items() if v.is_floating_point()], "module")
    )
    # the far client is pruned everywhere
    assert all(2 not in layer.trusted for layer in metrics.pruning.values())
    assert metrics["lpa_trusted_fraction"] == pytest.approx(2 / 3)
