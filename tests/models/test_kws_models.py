"""The four FedKWS-UI networks (models/kws.py): Table 2's parameter counts, shapes, errors, the CLI
list."""

from __future__ import annotations

import pytest
import torch

from fedac.cli import main
from fedac.errors import ConfigError
from fedac.models import build_model, count_parameters
from fedac.models.kws import KWT

# Counts of the official code's networks for C = 12 / 35 (Table 2: 169K/173K, 228K/232K, 238K/239K,
# 232K/234K).
COUNTS = {
    "dscnn": (168_572, 172_551),
    "mhattrnn": (227_985, 231_688),
    "resnet15": (237_882, 238_940),
    "kwt": (231_852, 233_715),
}


@pytest.mark.parametrize("name", COUNTS)
def test_parameter_counts_match_table_2(name):
    for classes, expected in zip((12, 35), COUNTS[name]):
        assert count_parameters(build_model(name, 40, classes)) == expected


@pytest.mark.parametrize("name,dim", [("dscnn", 172), ("mhattrnn", 160), ("resnet15", 45)])
def test_embed_and_head_shapes(name, dim):
    model = build_model(name, 40, 12)
    x = torch.randn(3, 40, 24)  # (batch, features, frames): short clips keep the test fast
    assert model.embed(x).shape == (3, dim)
    assert model(x).shape == (3, 12)
    assert torch.allclose(model(x), model.head(model.embed(x)))


def test_kwt_uses_its_class_token_and_rejects_other_sizes():
    model = KWT(40, 12, frames=16)
    x = torch.randn(2, 40, 16)
    assert model.embed(x).shape == (2, 80) and model(x).shape == (2, 12)
    with pytest.raises(ConfigError, match="101 frames"):
        model(torch.randn(2, 40, 20))


@pytest.mark.slow
def test_fedac_models_lists_the_kws_networks(capsys):
    assert main(["models", "--num-classes", "12"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    for name, (count, _) in COUNTS.items():
        assert rows[name][1] == f"{count:,}"  # (the parameters column)
