"""The CRNN zoo of fedmlac.md Table 3: structure, parameter counts, any input length."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedac.errors import ConfigError
from fedac.models import MODEL_NAMES, build_model, count_parameters

# Table 3: conv layers (filters), RNN type, hidden units. CRNN-Deep "64 -> 128" read as 64, 128,
# 128.
TABLE3 = {
    "crnn_tiny": ((16,), 32, False),
    "crnn_lite": ((32, 32), 64, False),
    "crnn_mid": ((32, 32, 32), 64, False),
    "crnn_base": ((64, 64), 128, True),
    "crnn_deep": ((64, 128, 128), 128, True),
}


def expected_count(name: str, features: int = 40, classes: int = 35, kernel: int = 5) -> int:
    """Conv1d: in*out*k + out; GRU per direction: 3 gates * (in*h + h*h + 2h); Linear: e*C + C."""
    widths, hidden, bidirectional = TABLE3[name]
    total, channels = 0, features
    for width in widths:
        total += channels * width * kernel + width
        channels = width
    directions = 2 if bidirectional else 1
    total += directions * 3 * (channels * hidden + hidden * hidden + 2 * hidden)
    embedding = hidden * directions
    return total + embedding * classes + classes


def test_zoo_names():
    assert list(MODEL_NAMES) == list(TABLE3)


def test_crnn_tiny_count_by_hand():
    # conv 40*16*5 + 16 = 3216; GRU 3 * (16*32 + 32*32 + 64) = 4800; head 32*35 + 35 = 1155
    assert count_parameters(build_model("crnn_tiny", 40, 35)) == 3216 + 4800 + 1155 == 9171


def test_crnn_base_count_by_hand():
    # convs 40*64*5+64 = 12864 and 64*64*5+64 = 20544; Bi-GRU 2 * 3 * (64*128 + 128*128 + 256) =
    # 148992; head 256*12 + 12 = 3084
    assert count_parameters(build_model("crnn_base", 40, 12)) == 12864 + 20544 + 148992 + 3084


@pytest.mark.parametrize("name", list(TABLE3))
def test_structure_matches_table3(name):
    widths, hidden, bidirectional = TABLE3[name]
    model = build_model(name, 40, 35)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv1d)]
    grus = [m for m in model.modules() if isinstance(m, nn.GRU)]
    assert [c.out_channels for c in convs] == list(widths)
    assert convs[0].in_channels == 40
    assert len(grus) == 1
    assert grus[0].hidden_size == hidden
    assert grus[0].bidirectional == bidirectional
    assert grus[0].num_layers == 1
    # each conv is followed by ReLU, max-pool and dropout (fedmlac.md Section 5.1)
    kinds = [type(m) for m in model.conv]
    assert kinds == [nn.Conv1d, nn.ReLU, nn.MaxPool1d, nn.Dropout] * len(widths)
    assert count_parameters(model) == expected_count(name)


def test_models_grow_roughly_with_table_order():
    counts = [count_parameters(build_model(n, 40, 35)) for n in TABLE3]
    assert counts[0] < counts[1] < counts[2] < counts[3] < counts[4]


@pytest.mark.parametrize("name", list(TABLE3))
@pytest.mark.parametrize("frames", [1, 7, 101, 300])
def test_any_input_length(name, frames):
    model = build_model(name, 40, 12).eval()
    with torch.no_grad():
        out = model(torch.randn(3, 40, frames))
    assert out.shape == (3, 12)
    assert torch.isfinite(out).all()
    emb = model.embed(torch.randn(2, 40, frames))
    assert emb.shape == (2, model.embedding_dim)


def test_embedding_dim_and_feature_count_follow_arguments():
    model = build_model("crnn_deep", 13, 4, dropout=0.3)
    assert model.embedding_dim == 256
    assert model(torch.randn(1, 13, 50)).shape == (1, 4)
    assert all(m.p == 0.3 for m in model.modules() if isinstance(m, nn.Dropout))


def test_unknown_model_names_the_zoo():
    with pytest.raises(ConfigError, match="unknown model 'crnn_huge'.*crnn_tiny"):
        build_model("crnn_huge", 40, 35)
