"""training/types.py `all_finite`, the check that rejects NaN/Inf uploads (one foreach call per
upload)."""

from __future__ import annotations

import pytest
import torch

from fedac.training.types import all_finite


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_values_anywhere_are_found(bad):
    clean = {"w": torch.randn(4, 3), "parts": [torch.zeros(0), torch.arange(3)], "lr": 0.1}
    assert all_finite(clean) and all_finite(None) and all_finite({"big": torch.full((3,), 3e38)})
    for where in ("w", "nested", "float", "double"):
        upload = {k: v for k, v in clean.items()}
        if where == "w":
            upload["w"] = upload["w"].clone()
            upload["w"][2, 1] = bad
        elif where == "nested":
            upload["parts"] = [torch.zeros(0), (torch.ones(2), torch.tensor([1.0, bad]))]
        elif where == "float":
            upload["lr"] = bad
        else:
            upload["d"] = torch.tensor([bad], dtype=torch.float64)
        assert not all_finite(upload), where
