"""`fedac models` shows the SSL encoders' sizes from ssl_sizes.COUNTS without building them: the
table is what a real build measures (parameters, the CNN's, the FLOPs of a 1 s clip, the adapters),
and the head's share follows the class count."""

from __future__ import annotations

import pytest

from fedac.models.ssl_sizes import COUNTS, SIZES, ssl_counts


@pytest.mark.parametrize(
    "name", [n if n == "w2v2_tiny" else pytest.param(n, marks=pytest.mark.slow) for n in SIZES]
)
def test_the_table_is_what_a_build_measures(name):
    pytest.importorskip("peft")
    from fedac.config import ModelConfig
    from fedac.models import build_model, count_parameters
    from fedac.models.ssl import measure_counts

    assert COUNTS[name] == measure_counts(name)
    for peft in ("none", "lora", "ia3", "head"):
        model = build_model(
            name, 1, 12, options=ModelConfig(name=name, encoder_path="random", peft=peft)
        )
        trainable = sum(p.numel() for n, p in model.named_parameters() if n not in model.frozen)
        assert ssl_counts(name, 12)[peft] == trainable
    assert ssl_counts(name, 12)["params"] == count_parameters(model)
