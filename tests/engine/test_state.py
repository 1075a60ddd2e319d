"""The run state's checkpoint form: a plain dict that round-trips, reads what earlier fedac wrote,
and refuses what it does not know instead of dropping it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from fedac.engine.checkpoint import load_checkpoint, save_checkpoint
from fedac.engine.clients import ByteLedger
from fedac.engine.state import BestModel, ByteBook, RunState
from fedac.errors import CheckpointError


def a_state() -> RunState:
    state = RunState("fedavg", {"params": {"w": torch.arange(3.0)}}, round=4)
    state.history.append({"round": 4.0, "val_accuracy": 0.5})
    state.clients["c1"] = {"w": torch.ones(2)}
    state.visits["c1"] = 2
    state.best = BestModel(2, 0.5, 0.5, {"params": {"w": torch.zeros(3)}})
    state.bytes = ByteBook(10, 4, {"c1": [10, 4]})
    return state


def test_a_checkpoint_is_a_plain_dict_that_round_trips(tmp_path):
    state = a_state()
    save_checkpoint(tmp_path, state)
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    # (no fedac class in the file: it does not depend on where the classes live)
    assert type(saved) is dict and type(saved["best"]) is dict and type(saved["bytes"]) is dict
    back = load_checkpoint(tmp_path)
    assert (back.round, back.visits, back.history) == (4, {"c1": 2}, state.history)
    assert torch.equal(back.server["params"]["w"], state.server["params"]["w"])
    assert back.best is not None and back.best.round == 2 and back.best.val_score == 0.5
    assert back.bytes == ByteBook(10, 4, {"c1": [10, 4]})


def test_an_earlier_fedacs_checkpoint_loads():
    """Written before best held val_score and before the byte book existed."""
    old = {
        "round": 3,
        "server": {"params": {}},
        "clients": {},
        "visits": {},
        "history": [],
        "best": {"round": 2, "val_accuracy": 0.7, "server": {"params": {}}},
        "wall_seconds": 1.5,
        "algorithm": "fedavg",
    }
    state = RunState.from_checkpoint(old)
    assert state.best == BestModel(2, 0.7, 0.7, {"params": {}}) and state.bytes is None
    # its earlier rounds' bytes are unknown: NaN totals, not zero
    row = ByteLedger(state).round({"w": torch.zeros(2)}, {"c": {"w": torch.zeros(2)}})
    assert math.isnan(row["upload_bytes_total"]) and row["upload_bytes"] == 8.0


def test_an_unknown_entry_is_refused_naming_it():
    saved = {**a_state().to_checkpoint(), "momentum": {}}
    with pytest.raises(CheckpointError, match=r"unknown entries \['momentum'\]"):
        RunState.from_checkpoint(saved, "run/checkpoint.pt")
    with pytest.raises(CheckpointError, match="no global state"):
        RunState.from_checkpoint({"round": 1, "algorithm": "fedavg"})


def test_a_typed_global_state_is_written_as_a_dict_of_its_fields():
    """A typed global state (zero-shot's is a dataclass) goes to the file as a plain dict, in the
    state and in the best model; the algorithm's restore_server rebuilds it on resume."""

    @dataclass
    class Typed:
        scores: torch.Tensor
        names: dict

    state = RunState("zeroshot", Typed(torch.ones(2), {"a": 1}))
    state.best = BestModel(1, 0.5, 0.5, Typed(torch.zeros(2), {}))
    saved = state.to_checkpoint()
    assert type(saved["server"]) is dict and saved["server"]["names"] == {"a": 1}
    assert type(saved["best"]["server"]) is dict and saved["best"]["server"].keys() == {
        "scores",
        "names",
    }
    assert isinstance(state.server, Typed)  # (the run's own state is left as it is)
