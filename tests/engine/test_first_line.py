"""The run's first line names the compression of uploads when it is on, and says nothing of it
when off."""

from __future__ import annotations

import pytest

from fedac.config import load_config
from fedac.engine.data import build_federated_data
from fedac.engine.simulator import Simulator
from helpers import tiny_run


@pytest.mark.parametrize(
    "settings, said",
    [
        ({}, None),
        (
            {"compression.method": "topk", "compression.ratio": 0.05},
            "; uploads compressed: topk (ratio 0.05), error feedback",
        ),
        (
            {
                "compression.method": "qsgd",
                "compression.error_feedback": False,
                "compression.download": True,
            },
            "; uploads compressed: qsgd (levels 16), the broadcast too",
        ),
    ],
    ids=["off", "topk", "qsgd"],
)
def test_the_first_line_names_the_compression(gsc_root, tmp_path, settings, said):
    overrides = {**tiny_run(gsc_root, tmp_path / "cache"), **settings}
    cfg = load_config(overrides=[f"{k}={v}" for k, v in overrides.items()])
    data = build_federated_data(cfg, progress=False)
    line = Simulator(cfg, tmp_path / "run", data, progress=False).first_line()
    if said is None:
        assert "compress" not in line
    else:
        assert line.endswith(said)
