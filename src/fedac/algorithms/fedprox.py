"""FedProx (Li et al. 2020): FedAvg whose local loss adds mu/2 * ||w - w_global||^2 (squared L2), or
with `fedprox.form=smooth_l1` the smooth-L1 form FedKWS-UI's code uses for its FedProx baseline."""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from fedac.algorithms.base import Params
from fedac.algorithms.fedavg import FedAvg
from fedac.errors import ConfigError


def shared_parameters(model: nn.Module, anchor: Params):
    """(name, parameter) of the parameters the global model holds: all of them, but the encoder
    weights that model.peft keeps frozen and out of every payload (models/ssl.py)."""
    return ((name, p) for name, p in model.named_parameters() if name in anchor)


def proximal_term(model: nn.Module, anchor: Params, mu: float) -> torch.Tensor:
    """mu/2 * sum over parameters of ||w - w_global||^2; the anchor is a constant (no gradient)."""
    # (cast: a sum of tensors is a tensor, the start 0 aside)
    squared = cast(
        torch.Tensor,
        sum(
            (p - anchor[name].detach()).pow(2).sum() for name, p in shared_parameters(model, anchor)
        ),
    )
    return 0.5 * mu * squared


def smooth_l1_proximal_term(model: nn.Module, anchor: Params, mu: float) -> torch.Tensor:
    """FedKWS-UI's code form (fedreg.py): mu * the mean over parameter tensors of smooth_l1_loss(w,
    w_global) (each a mean over the tensor's entries; 0.5 d^2 for |d| < 1, |d| - 0.5 beyond)."""
    terms = [
        nn.functional.smooth_l1_loss(p, anchor[name].detach())
        for name, p in shared_parameters(model, anchor)
    ]
    return mu * torch.stack(terms).mean()


PROXIMAL_FORMS = {"l2": proximal_term, "smooth_l1": smooth_l1_proximal_term}


class FedProx(FedAvg):
    name = "fedprox"

    def regularizer(self, global_params: Params):
        mu, form = self.cfg.fedprox.mu, self.cfg.fedprox.form
        if form not in PROXIMAL_FORMS:
            raise ConfigError(
                f"fedprox.form must be one of {', '.join(PROXIMAL_FORMS)}, got {form!r}"
            )
        return lambda model: PROXIMAL_FORMS[form](model, global_params, mu)
