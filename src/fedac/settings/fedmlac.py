"""FedMLAC's settings (algorithms/fedmlac.py, fedmlac.md Section 3.2).

Settings are read and checked before torch loads: this module imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

from fedac.fields import number
from fedac.registry import choice


@dataclass
class FedMLACConfig:
    alpha: float = number(0.5, "[0, 1]")
    """Eq. 8 weight of CE vs KL for the personalized model."""
    temperature: float = number(1.0, "> 0")
    """Distillation temperature (1 = Eq. 7/9 as written)."""
    plugin_ce_weight: float = number(0.0, ">= 0")
    """Extra CE weight on the Plug-in loss (0 = Eq. 9 as written)."""
    plugin_model: str = "crnn_lite"
    teacher: str = choice("pre_update", ("pre_update", "post_update"))
    """Plug-in teacher logits: pre_update (Alg. 1 line 13 as written) or post_update (after omega's
    step)."""
    ml: bool = True
    """Mutual learning on; false = `w/o ML` ablation (both models trained on CE alone)."""
    lpa: bool = True
    """Layer-wise Pruning Aggregation on; false = `w/o LPA` ablation (n_k-weighted mean)."""
    warmup_rounds: int = number(0, ">= 0")
    """Beyond the paper: rounds 1..warmup_rounds train both models on CE alone (as `w/o ML`) before
    mutual learning starts, so the teachers are not pulled toward a near-uniform Plug-in early
    on."""
    min_visits: float = number(10.0, ">= 0")
    """Warn when a client is expected to train in fewer rounds than this (rounds x fraction)."""


#: FedMLAC's run defaults (under a config file, flags and --set; `fedac compare` and `fedac
#: reproduce` skip them, so every method of a comparison runs under one schedule). Its Plug-in
#: learns the labels only from the clients' own models (Eq. 9), which must first become confident
#: teachers: with the shared schedule (each of the 240 clients trains about 5 times) it stays at
#: chance, so FedMLAC trains 24 of the clients (a seeded choice) in every one of its 40 rounds
#: (docs/fedmlac.md, for the measurements).
RUN_DEFAULTS = {"data.max_clients": 24, "train.fraction": 1.0, "train.rounds": 40}
