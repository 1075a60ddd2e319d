"""The server optimisers' settings (algorithms/fedopt.py: FedAdam, FedYogi, FedAdagrad, FedAvgM
share them).

Settings are read and checked before torch loads: this module imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

from fedac.fields import number


@dataclass
class FedOptConfig:
    server_lr: float = number(0.01, "> 0")
    beta1: float = number(0.9, "[0, 1)")
    beta2: float = number(0.99, "[0, 1)")
    tau: float = number(1e-3, "> 0")
    """Adaptivity (epsilon) of FedAdam/FedYogi/FedAdagrad, Reddi et al. 2021."""
    momentum: float = number(0.9, "[0, 1)")
    """FedAvgM server momentum."""
    avgm_server_lr: float = number(1.0, "> 0")
    form: str = "reddi"
    """reddi (Alg. 2 as written: no bias correction, every floating entry stepped) or torch
    (torch.optim.Adam / SGD-momentum on the parameters, buffers averaged: FedKWS-UI's code)."""
