"""Each algorithm's local optimiser and aggregation weights as its paper states them, applied under
a run's own settings when `train.paper_optimizer=true` (config.load_config); docs/algorithms.md
lists them with each method's remaining deviations.

The shared defaults (local SGD with momentum 0.9, n_k-weighted means) are what every committed
table ran: they stay the defaults, so no number changes unless a run asks for its paper's. Where a
paper's algorithm box names plain SGD (no momentum, no weight decay) that is declared; where its
experiments' setup says more (MOON: momentum 0.9, weight decay 1e-5) that is. The methods of the
papers fedac reproduces (FedMLAC, FedKAD, FedKWS-UI, FedMMD, zero-shot, early-exit, central) carry
their protocols in their run defaults and configs/*.yaml already, and declare nothing here.

Torch-free (core layer): read before torch loads.
"""

from __future__ import annotations

from typing import Any

_PLAIN = {"train.optimizer": "sgd", "train.momentum": 0.0, "train.weight_decay": 0.0}


def _sgd(weighting: str, **more: Any) -> dict[str, Any]:
    return {**_PLAIN, "aggregation.weighting": weighting, **more}


#: algorithm -> (its paper's settings, where they come from)
PAPER: dict[str, tuple[dict[str, Any], str]] = {
    "fedavg": (_sgd("n_k"), "McMahan et al. 2017, Alg. 1: local SGD, w = sum_k n_k / n w_k"),
    "fedprox": (
        _sgd("n_k"),
        "Li et al. 2020, Alg. 2: local (inexact) SGD on the proximal objective; devices sampled "
        "with probability p_k = n_k / n and averaged, which n_k weights over a uniform sample "
        "match in expectation",
    ),
    "fedadam": (
        _sgd("uniform"),
        "Reddi et al. 2021, Alg. 2: client SGD, Delta = 1/|S| sum Delta_i",
    ),
    "fedyogi": (
        _sgd("uniform"),
        "Reddi et al. 2021, Alg. 2: client SGD, Delta = 1/|S| sum Delta_i",
    ),
    "fedadagrad": (
        _sgd("uniform"),
        "Reddi et al. 2021, Alg. 2: client SGD, Delta = 1/|S| sum Delta_i",
    ),
    "fedavgm": (
        _sgd("n_k"),
        "Hsu et al. 2019: client SGD, the n_k-weighted update, server momentum",
    ),
    "fedbn": (_sgd("uniform"), "Li et al. 2021, Alg. 1: local SGD; the official code averages 1/N"),
    "fedper": (_sgd("n_k"), "Arivazhagan et al. 2019, Alg. 1: local SGD, n_k-weighted base layers"),
    "fedrep": (_sgd("uniform"), "Collins et al. 2021, Alg. 1: local SGD, body = 1/(rN) sum"),
    "lgfedavg": (
        _sgd("uniform"),
        "Liang et al. 2020, Alg. 1: local SGD; the official code averages the global layers 1/N",
    ),
    "local": (_sgd("n_k"), "local SGD alone (nothing is averaged)"),
    "ditto": (_sgd("n_k"), "Li et al. 2021, Alg. 1: SGD for both updates; FedAvg's aggregation"),
    "apfl": (_sgd("uniform"), "Deng et al. 2020, Alg. 1: SGD steps, w = 1/K sum w_j"),
    "scaffold": (_sgd("uniform"), "Karimireddy et al. 2020, Alg. 1: SGD steps, 1/|S| sums"),
    "feddyn": (_sgd("uniform"), "Acar et al. 2021, Alg. 1: SGD, 1/|P_t| sum theta_k"),
    "moon": (
        _sgd("n_k", **{"train.momentum": 0.9, "train.weight_decay": 1e-5}),
        "Li, He and Song 2021, Alg. 1 (w = sum |D_i| / |D| w_i) and Sec. 4.1: SGD, momentum 0.9, "
        "weight decay 1e-5",
    ),
}


def paper_settings(algorithm: str) -> dict[str, Any]:
    """The settings `train.paper_optimizer=true` puts under a run of `algorithm` ({} for a method
    that declares none)."""
    return dict(PAPER.get(algorithm, ({}, ""))[0])
