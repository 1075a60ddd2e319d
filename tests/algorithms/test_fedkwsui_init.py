"""`fedkwsui.head_init` (algorithms/fedkwsui.py TwoHeadModel): the default heads shrink the gradient
that reaches the encoder several times against the network's own head; Kaiming heads do not. Also:
the setting reaches the algorithm's seeded model, and the encoder's weights do not depend on it."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from fedac.algorithms import build_algorithm
from fedac.algorithms.base import Task
from fedac.algorithms.fedkwsui import TwoHeadModel
from fedac.config import load_config
from fedac.errors import ConfigError
from fedac.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")
CLASSES = 12


def encoder_gradient_ratio(name: str, head_init: str, seed: int = 0) -> float:
    """||d CE / d encoder|| of the two-head model over that of the single-head network, on one fixed
    batch, the encoder's weights copied from the network (both in training mode, as in a local
    step)."""
    torch.manual_seed(seed)
    network = build_model(name, 10, CLASSES)
    two_head = TwoHeadModel(copy.deepcopy(network), CLASSES, head_init=head_init)
    x, y = torch.randn(8, 10, 30), torch.randint(0, CLASSES, (8,))
    F.cross_entropy(network(x), y).backward()
    F.cross_entropy(two_head(x), y).backward()

    def norm(params):
        return float(torch.sqrt(sum((p.grad**2).sum() for p in params if p.grad is not None)))

    single = norm(p for n, p in network.named_parameters() if not n.startswith("head."))
    return norm(two_head.encoder.parameters()) / single


@pytest.mark.parametrize("name", ["dscnn", "mhattrnn"])
def test_kaiming_heads_pass_the_encoder_the_single_head_gradient(name):
    default, kaiming = (
        encoder_gradient_ratio(name, "default"),
        encoder_gradient_ratio(name, "kaiming"),
    )
    print(f"{name}: encoder gradient ratio default {default:.3f}, kaiming {kaiming:.3f}")
    assert default < 0.5  # measured 0.13-0.23 (a 4.3-7.7x shrink) over seeds 0-4
    assert 0.5 <= kaiming <= 2.0  # measured 0.86-1.29


def algorithm(**settings):
    overrides = [
        f"{k}={v}"
        for k, v in {"algorithm": "fedkwsui", "model.name": "crnn_tiny", **settings}.items()
    ]
    return build_algorithm(
        load_config(overrides=overrides), Task(8, CLASSES, ["c0", "c1"], [[3] * CLASSES] * 2)
    )


def test_head_init_is_seeded_and_leaves_the_encoder_alone():
    default = algorithm().init_server()["params"]
    kaiming = algorithm(**{"fedkwsui.head_init": "kaiming"}).init_server()["params"]
    again = algorithm(**{"fedkwsui.head_init": "kaiming"}).init_server()["params"]
    assert all(torch.equal(kaiming[k], again[k]) for k in kaiming)  # same seed, same weights
    heads = [k for k in kaiming if not k.startswith("encoder.")]
    assert all(torch.equal(kaiming[k], default[k]) for k in kaiming if k not in heads)
    assert not torch.equal(kaiming["global_proj.weight"], default["global_proj.weight"])
    assert torch.count_nonzero(kaiming["global_head.bias"]) == 0
    other = algorithm(**{"fedkwsui.head_init": "kaiming", "seed": 1}).init_server()["params"]
    assert not torch.equal(other["global_head.weight"], kaiming["global_head.weight"])
    # Kaiming-normal with ReLU's gain: std sqrt(2 / fan_in), against PyTorch's 1 / sqrt(3 fan_in)
    weight = kaiming["global_proj.weight"]
    assert float(weight.std()) == pytest.approx((2 / weight.shape[1]) ** 0.5, rel=0.15)
    assert float(default["global_proj.weight"].std()) == pytest.approx(
        (1 / (3 * weight.shape[1])) ** 0.5, rel=0.15
    )


def test_unknown_head_init_is_named():
    with pytest.raises(ConfigError, match="fedkwsui.head_init must be one of default, kaiming"):
        TwoHeadModel(build_model("crnn_tiny", 8, CLASSES, 0.0), CLASSES, head_init="xavier")
