"""FederatedData.eval_split: a simulation reads val / test through it; a Flower device node
started without test-root holds neither, and reading one there names the setting instead of
failing later."""

import pytest
import torch

from fedac.data.manifest import Manifest
from fedac.errors import DatasetError
from fedac.training.types import EvalSplit, FederatedData, Task


def _data(val, test):
    manifest = Manifest(name="t", root="/nowhere", classes=["a", "b"], clips=[])
    return FederatedData(Task(4, 2, []), manifest, [], val, test)


def test_eval_split_returns_the_split_held_and_names_test_root_when_none():
    split = EvalSplit(torch.zeros(3, 4, 5), torch.arange(3), torch.zeros(3, dtype=torch.long))
    data = _data(split, None)
    assert data.eval_split("val") is split
    with pytest.raises(DatasetError, match="no test split.*test-root"):
        data.eval_split("test")
    assert _data(None, split).eval_split("test") is split
