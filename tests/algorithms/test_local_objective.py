"""The LocalObjective machinery the pFL methods rely on (algorithms/objective.py): an objective that
declares `reads_model_once` (the default) trains the zoo's CRNNs through their hand-written stacked
forward, which refuses any other use of the model by name; without the declaration the CRNN goes
through the vmapped module."""

from __future__ import annotations

import pytest

from algorithm_harness import build, clients, federate
from fedac.algorithms.scaffold import Scaffold
from fedac.errors import ConfigError
from fedac.training.local import cross_entropy


class TwiceRead(Scaffold):
    """Reads its model twice a step (a second forward on the same batch)."""

    def local_loss(self, forward, params, x, y, weight, state, payload):
        return cross_entropy(forward(x), y, weight) + 0 * forward(x * 2).sum()


def test_the_hand_written_crnn_serves_an_objective_that_reads_its_model_once():
    assert build(Scaffold, "crnn_tiny", "cohort").stacked_kind("crnn_tiny") == "crnn"
    undeclared = type("Undeclared", (Scaffold,), {"reads_model_once": False})
    assert build(undeclared, "crnn_tiny", "cohort").stacked_kind("crnn_tiny") == "vmap"


def test_a_second_read_on_the_hand_written_path_is_refused_naming_the_declaration():
    with pytest.raises(ConfigError, match="reads_model_once = False"):
        federate(build(TwiceRead, "crnn_tiny", "cohort"), clients(), rounds=1)
    undeclared = type("Undeclared", (TwiceRead,), {"reads_model_once": False})
    federate(build(undeclared, "crnn_tiny", "cohort"), clients(), rounds=1)  # the vmapped module
