"""Agnostic federated learning (Mohri, Sivek and Suresh, "Agnostic Federated Learning", ICML 2019;
Stochastic-AFL, Algorithm 1).

min_w max_{lambda in the simplex} sum_k lambda_k F_k(w): the model is trained for the worst mixture
of the clients' distributions. The server keeps lambda over every client of the task (uniform at
first). Each round the selected clients run FedAvg's local SGD from w^t and report F_k(w^t)
(algorithms/fairness.py); the server

    w^{t+1} = sum_{k in S} lambda_k w_k / sum_{k in S} lambda_k          (the descent step on w)
    lambda  <- Proj_simplex(lambda + gamma_lambda g),  g_k = F_k(w^t) for k in S, 0 elsewhere

(the projected gradient ascent step on lambda, `afl.lambda_lr`; the Euclidean projection of Duchi
et al. 2008). Local SGD stands in for the paper's single stochastic gradient step on w (its descent
direction is the lambda-weighted one, as in FedJAX's agnostic FedAvg). With gamma_lambda = 0 and
every client of one size, lambda stays uniform and this is FedAvg with uniform weights.
"""

from __future__ import annotations

from typing import Any

import torch

from fedac.algorithms.fairness import LossReportingFedAvg, weighted_mean


def project_simplex(v: torch.Tensor) -> torch.Tensor:
    """The Euclidean projection of v onto {x >= 0, sum x = 1} (Duchi et al. 2008, Fig. 1)."""
    u, _ = torch.sort(v, descending=True)
    cumulative = torch.cumsum(u, 0) - 1
    ks = torch.arange(1, len(v) + 1, dtype=v.dtype)
    rho = int(torch.nonzero(u - cumulative / ks > 0).max())
    theta = cumulative[rho] / (rho + 1)
    return torch.clamp(v - theta, min=0)


class AFL(LossReportingFedAvg):
    name = "afl"

    def init_server(self) -> dict[str, Any]:
        n = len(self.task.clients)
        return {**super().init_server(), "lambda": torch.full((n,), 1.0 / n, dtype=torch.float64)}

    def server_update(self, server, uploads, round_idx) -> tuple[dict[str, Any], dict[str, float]]:
        lam = server["lambda"]
        index = [int(u["client"]) for u, _ in uploads]
        params = weighted_mean([u["params"] for u, _ in uploads], [float(lam[k]) for k in index])
        grad = torch.zeros_like(lam)
        for (upload, _), k in zip(uploads, index):
            grad[k] = float(upload["loss"])
        lam = project_simplex(lam + self.cfg.afl.lambda_lr * grad)
        return {**server, "params": params, "lambda": lam}, {"max_lambda": float(lam.max())}
