"""FedProx proximal term mu/2 * ||w - w_g||^2 and its gradient mu * (w - w_g); the anchor is
constant."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedac.algorithms.base import Task
from fedac.algorithms.fedprox import FedProx, proximal_term
from fedac.config import load_config


def small_model() -> nn.Linear:
    model = nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, -2.0]]))
        model.bias.copy_(torch.tensor([0.5]))
    return model


def test_proximal_term_value():
    model = small_model()
    anchor = {"weight": torch.tensor([[0.0, 1.0]]), "bias": torch.tensor([2.5])}
    # squared distance: 1^2 + (-3)^2 + (-2)^2 = 14; mu / 2 * 14 with mu = 0.3 -> 2.1
    term = proximal_term(model, anchor, mu=0.3)
    assert term.item() == pytest.approx(2.1)
    assert proximal_term(model, anchor, mu=0.0).item() == 0.0


def test_proximal_term_is_zero_at_the_anchor():
    model = small_model()
    anchor = {name: p.detach().clone() for name, p in model.named_parameters()}
    assert proximal_term(model, anchor, mu=5.0).item() == 0.0


def test_proximal_gradient_is_mu_times_difference_and_anchor_gets_none():
    model = small_model()
    anchor = {
        "weight": torch.tensor([[0.0, 1.0]], requires_grad=True),
        "bias": torch.tensor([2.5], requires_grad=True),
    }
    proximal_term(model, anchor, mu=0.3).backward()
    # d/dw [mu/2 ||w - a||^2] = mu * (w - a)
    assert model.weight.grad.flatten().tolist() == pytest.approx([0.3 * 1.0, 0.3 * -3.0])
    assert model.bias.grad.tolist() == pytest.approx([0.3 * -2.0])
    assert anchor["weight"].grad is None
    assert anchor["bias"].grad is None


def test_fedprox_regularizer_uses_configured_mu_and_round_anchor():
    algorithm = FedProx(
        load_config(None, ["algorithm=fedprox", "fedprox.mu=0.3"]), Task(2, 1, ["a"])
    )
    model = small_model()
    anchor = {"weight": torch.tensor([[0.0, 1.0]]), "bias": torch.tensor([2.5])}
    # same numbers as above: 0.3 / 2 * 14
    assert algorithm.regularizer(anchor)(model).item() == pytest.approx(2.1)
