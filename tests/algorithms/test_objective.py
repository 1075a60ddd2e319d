"""The LocalObjective plug-in API (algorithms/objective.py): its old import path, and which stacked
forward a method stated as an objective trains through."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from algorithm_harness import build, clients
from fedac.algorithms.objective import LocalObjective
from fedac.engine.execution import ExecutionPlan


class Proximal(LocalObjective):
    """FedProx (Li et al. 2020, Eq. 2) as an objective: CE plus mu/2 ||w - w_global||^2."""

    name = "fedprox"  # (its settings section: the test harness names the algorithm)
    mu = 0.1

    def init_server(self):
        return {"params": self.initial_params(self.cfg.model.name, "global-init")}

    def local_loss(self, forward, params, x, y, weight, state, payload):
        ce = (F.cross_entropy(forward(x), y, reduction="none") * weight).sum()
        return ce + self.mu / 2 * sum(((params[n] - payload[n]) ** 2).sum() for n in params)

    def server_update(self, server, uploads, round_idx):
        params, metrics = self.combine(server, uploads)
        return {"params": params}, metrics


class Undeclared(Proximal):
    reads_model_once = False


def test_the_old_import_path_of_local_objective_still_works():
    from fedac.algorithms.cohort import LocalObjective as Old

    assert Old is LocalObjective


def test_an_objective_on_a_zoo_crnn_trains_through_its_hand_written_forward_unprobed():
    """A zoo CRNN's hand-written stacked forward is always the faster stacked form: an objective
    takes it by default (`reads_model_once`), and auto stacks without a probe; one that declares
    otherwise goes through the vmapped module."""
    algo = build(Proximal, "crnn_tiny", "auto")
    assert algo.stacked_kind("crnn_tiny") == "crnn"
    plan = ExecutionPlan(algo)
    assert plan.path == "stacked" and not plan.needs_probe
    assert build(Undeclared, "crnn_tiny", "auto").stacked_kind("crnn_tiny") == "vmap"


@pytest.mark.parametrize("dropout", ["0", "0.3"])
def test_the_hand_written_path_gives_the_sequential_numbers(dropout):
    def one_round(execution):
        algo = build(Proximal, "crnn_tiny", execution, f"model.dropout={dropout}")
        payload = algo.broadcast(algo.init_server())
        return ExecutionPlan(algo).run(payload, [None] * 3, clients(), 1, 0)

    for stacked, alone in zip(one_round("cohort"), one_round("sequential")):
        assert stacked.metrics["steps"] == alone.metrics["steps"]
        for name, value in alone.upload.items():
            assert torch.allclose(stacked.upload[name], value, atol=1e-5), name
