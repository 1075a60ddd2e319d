"""FedProx (Li et al. 2020): FedAvg whose local loss adds mu/2 * ||w - w_global||^2 (squared L2)."""

from __future__ import annotations

import torch
from torch import nn

from fedac.algorithms.base import Params
from fedac.algorithms.fedavg import FedAvg


def proximal_term(model: nn.Module, anchor: Params, mu: float) -> torch.Tensor:
    """mu/2 * sum over parameters of ||w - w_global||^2; the anchor is a constant (no gradient)."""
    squared = sum((p - anchor[name].detach()).pow(2).sum() for name, p in model.named_parameters())
    return 0.5 * mu * squared


class FedProx(FedAvg):
    name = "fedprox"

    def regularizer(self, global_params: Params):
        mu = self.cfg.fedprox.mu
        return lambda model: proximal_term(model, global_params, mu)
