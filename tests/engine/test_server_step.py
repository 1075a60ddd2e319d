"""The one server step (engine/server_step.py) that the simulator, torchrun and the Flower strategy
share: what it accepts, counts and aggregates, checked on hand-made arrivals."""

from __future__ import annotations

import math

import pytest
import torch

from fedac.algorithms.base import Algorithm
from fedac.engine.server_step import Arrival, ServerStep
from fedac.engine.state import RunState


class MeanOfX(Algorithm):
    """A server that takes the weighted mean of the uploads' one tensor (and records its calls)."""

    def __init__(self):  # no config, no task: only the server side is exercised
        self.calls: list[list[tuple[dict, int]]] = []

    def init_server(self):
        return {"params": {"x": torch.zeros(2)}}

    def client_update(self, payload, state, data, round_idx, generator):
        raise AssertionError("not called")

    def server_update(self, server, uploads, round_idx):
        self.calls.append(uploads)
        total = sum(n for _, n in uploads)
        x = sum(u["x"] * n for u, n in uploads) / total
        return {"params": {"x": x}}, {"server_metric": 1.0}


def upload(*values: float) -> dict[str, torch.Tensor]:
    return {"x": torch.tensor(values)}


def test_non_finite_uploads_and_states_are_rejected_but_their_bytes_counted(caplog):
    algo = MeanOfX()
    state = RunState("mean", algo.init_server())
    arrivals = [
        Arrival("a", upload(1.0, 1.0), 1, loss=0.5),
        Arrival("b", upload(math.nan, 0.0), 5, loss=9.0),
        Arrival("c", upload(4.0, 4.0), 3, loss=1.5, state={"w": torch.ones(1)}),
        Arrival("d", upload(0.0, 0.0), 7, loss=2.0, state={"w": torch.tensor([math.inf])}),
    ]
    step = ServerStep(algo)(state, upload(0.0, 0.0), arrivals, 3, rejected_elsewhere=2)
    assert step.accepted == ["a", "c"]
    assert [n for _, n in algo.calls[0]] == [1, 3]  # the accepted ones, in arrival order
    assert torch.allclose(step.server["params"]["x"], torch.tensor([13 / 4, 13 / 4]))
    assert step.metrics["clients"] == 2 and step.metrics["rejected"] == 2 + 2
    assert step.metrics["train_loss"] == pytest.approx((0.5 + 1.5) / 2)
    assert step.metrics["server_metric"] == 1.0
    # every arrival sent its upload (8 bytes of float32 x 2) and received the payload
    assert step.metrics["upload_bytes"] == 4 * 8 and step.metrics["download_bytes"] == 4 * 8
    assert state.bytes is not None and set(state.bytes.clients) == {"a", "b", "c", "d"}
    assert sum("client b returned NaN/Inf" in r.message for r in caplog.records) == 1
    assert sum("client d returned NaN/Inf" in r.message for r in caplog.records) == 1


def test_a_round_with_nothing_usable_keeps_the_global_state():
    algo = MeanOfX()
    state = RunState("mean", algo.init_server())
    step = ServerStep(algo)(state, upload(0.0, 0.0), [Arrival("a", upload(math.nan, 1.0), 2)], 1)
    assert step.server is state.server and not algo.calls and step.accepted == []
    assert math.isnan(step.metrics["train_loss"]) and step.metrics["rejected"] == 1


def test_an_all_reduced_mean_stands_for_the_accepted_uploads():
    """Over several processes the uploads travel as their weighted mean (`summed`): the algorithm
    sees that one upload, with the summed weight, in place of the cohort's."""
    algo = MeanOfX()
    state = RunState("mean", algo.init_server())
    arrivals = [Arrival("a", upload(1.0, 1.0), 1), Arrival("b", upload(3.0, 3.0), 1)]
    ServerStep(algo)(state, upload(0.0, 0.0), arrivals, 1, summed=(upload(2.0, 2.0), 2))
    ((only, weight),) = algo.calls[0]
    assert weight == 2 and torch.equal(only["x"], torch.tensor([2.0, 2.0]))


def test_the_simulator_and_the_flower_strategy_both_step_through_it():
    """One step, not two: neither runtime aggregates on its own any more."""
    import inspect

    from fedac.engine.simulator import Simulator
    from fedac.flower.strategy import FedacStrategy

    for source in (inspect.getsource(Simulator.run_round), inspect.getsource(FedacStrategy)):
        assert "server_step(" in source
        assert ".server_update(" not in source and "add_noise(" not in source
