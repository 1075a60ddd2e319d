"""Differential privacy of the shared model: DP-FedAvg (McMahan et al. 2018, "Learning
differentially private recurrent language models", Alg. 1 with per-client weights w_k = 1 and a
fixed cohort size m).

Each round, with theta the broadcast model and Delta_k = theta_k - theta each client's update:

    clip:  Delta_k <- Delta_k * min(1, C / ||Delta_k||_2)    (C = dp.clip, all entries together)
    mean:  Delta   = (1 / m) * sum_k Delta_k                   (unweighted: sensitivity C / m)
    noise: theta'  = theta + Delta + N(0, (z * C / m)^2)       (z = dp.noise_multiplier)

`dp.mode=central` clips every upload at the server; `dp.mode=client` has each client clip its own
update before upload (the server never sees an unclipped one) and the server adds the same noise;
malicious clients (attacks.py) do not clip in that mode. The clipped uploads go to the algorithm
with n_k = 1, so its mean is the unweighted one above; the noise is added to the new global model,
which is therefore allowed only where that model is the mean itself (FedAvg, FedProx, FedMLAC's
Plug-in) and the aggregation is the mean: a server optimizer or a data-dependent selection (LPA,
robust rules) after the noise-free aggregate would void the accounting.

Epsilon at `dp.delta` comes from opacus' RDP accountant (Mironov et al.'s subsampled Gaussian
mechanism), composed over the rounds trained with sample rate q = m / N. fedac samples cohorts
without replacement at a fixed size, where the accountant assumes Poisson sampling with rate q; that
is the usual approximation of DP-FedAvg implementations (McMahan et al. account the same way).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Protocol

import torch

from fedac.config import Config
from fedac.errors import ConfigError
from fedac.rules.robust import clip_update
from fedac.seeding import torch_generator
from fedac.training.types import Params

MODES = ("none", "central", "client")


def epsilon(noise_multiplier: float, sample_rate: float, rounds: int, delta: float) -> float:
    """(epsilon, delta)-DP of `rounds` subsampled Gaussian mechanisms, from opacus' RDP
    accountant."""
    if rounds == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    from opacus.accountants import RDPAccountant  # slow to import; only DP runs need it

    accountant = RDPAccountant()
    accountant.history = [(noise_multiplier, sample_rate, rounds)]
    return float(accountant.get_epsilon(delta))


class GlobalModelOwner(Protocol):
    """How DP reaches the global model inside an algorithm's global state (algorithms/base.py
    `Algorithm`; a rule sits below the algorithms and names only what it calls)."""

    def global_params(self, server: Any) -> Params: ...

    def with_global_params(self, server: Any, params: Params) -> Any: ...


class Privacy:
    """The configured DP mechanism of one run (`dp.mode`); a no-op for none."""

    def __init__(
        self,
        cfg: Config,
        num_clients: int,
        cohort_size: int,
        dp_compatible: bool,
        lpa_setting: str | None = None,
    ):
        """`dp_compatible` and `lpa_setting`: the algorithm's capabilities (Algorithm.dp_compatible,
        the dotted setting that turns its LPA on, e.g. "fedmlac.lpa"), given by the engine above."""
        self.cfg, dp = cfg, cfg.dp
        if dp.mode not in MODES:
            raise ConfigError(f"unknown dp.mode {dp.mode!r}; use one of {', '.join(MODES)}")
        self.on = dp.mode != "none"
        if not self.on:
            return
        if not dp.clip > 0 or dp.noise_multiplier < 0 or not 0 < dp.delta < 1:
            raise ConfigError(
                f"dp needs clip > 0, noise_multiplier >= 0 and 0 < delta < 1; got clip={dp.clip}, "
                f"noise_multiplier={dp.noise_multiplier}, delta={dp.delta}"
            )
        if not dp_compatible:
            raise ConfigError(
                f"dp.mode={dp.mode} adds noise to the aggregated model, which algorithm "
                f"{cfg.algorithm} transforms further; use one whose class sets dp_compatible = "
                "True (fedavg, fedprox, fedmlac among the built-ins)"
            )
        # the setting's value, e.g. cfg.fedmlac.lpa for "fedmlac.lpa"
        lpa = lpa_setting is not None and bool(
            functools.reduce(getattr, lpa_setting.split("."), cfg)
        )
        if cfg.aggregation.method != "mean" or lpa:
            raise ConfigError(
                f"dp.mode={dp.mode} is accounted for the plain mean of clipped updates; set "
                "aggregation.method=mean" + (f" and {lpa_setting}=false" if lpa_setting else "")
            )
        if num_clients == 0:
            raise ConfigError(
                f"dp.mode={dp.mode} accounts epsilon from the sampling rate cohort / clients, and "
                "this server holds no clients (Flower data-mode=device); use the simulator or "
                "data-mode=full"
            )
        self.sample_rate, self.cohort = cohort_size / num_clients, cohort_size

    @property
    def on_client(self) -> bool:
        """Whether each client clips its own update before it is sent (dp.mode=client): before
        compression (rules/compression.py), where central clipping comes after decompression."""
        return self.on and self.cfg.dp.mode == "client"

    def clip(
        self,
        reference: Params,
        names: list[str],
        uploads: list[tuple[Params, int]],
        malicious: set[str] | frozenset[str] = frozenset(),
    ) -> list[tuple[Params, int]]:
        """Each update clipped to dp.clip (in client mode, not the malicious clients'), with n_k =
        1."""
        if not self.on:
            return uploads
        skip = malicious if self.cfg.dp.mode == "client" else set()
        return [
            (upload if name in skip else clip_update(upload, reference, self.cfg.dp.clip), 1)
            for name, (upload, _) in zip(names, uploads)
        ]

    def add_noise(
        self, algorithm: GlobalModelOwner, server: Any, round_idx: int, cohort: int
    ) -> tuple[Any, dict[str, float]]:
        """The new global state, its model (`algorithm.global_params`) plus N(0, (z C / m)^2) per
        coordinate drawn from (seed, round), and the epsilon spent after `round_idx` rounds."""
        if not self.on:
            return server, {}
        dp = self.cfg.dp
        std = dp.noise_multiplier * dp.clip / cohort
        gen = torch_generator(self.cfg.seed, "dp-noise", round_idx)
        # drawn on the CPU (the seeded stream is the same whatever the device), added where the
        # model is
        params = {
            name: (
                value
                + (
                    torch.randn(value.shape, generator=gen, dtype=torch.float64, device="cpu") * std
                ).to(value.device, value.dtype)
            )
            if value.is_floating_point()
            else value
            for name, value in algorithm.global_params(server).items()
        }
        return algorithm.with_global_params(server, params), {"dp_epsilon": self.epsilon(round_idx)}

    def epsilon(self, rounds: int) -> float:
        return epsilon(self.cfg.dp.noise_multiplier, self.sample_rate, rounds, self.cfg.dp.delta)

    def final_metrics(self, rounds: int) -> dict[str, float]:
        if not self.on:
            return {}
        return {"dp_epsilon": self.epsilon(rounds), "dp_delta": self.cfg.dp.delta}
