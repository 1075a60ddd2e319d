"""TERM across clients (Li, Beirami, Sanjabi and Smith, "Tilted Empirical Risk Minimization",
ICLR 2021; its federated use, tilting the clients' losses for fairness).

The tilted objective (1/t) log sum_k p_k exp(t F_k(w)) has the gradient sum_k w_k(t) grad F_k(w)
with w_k(t) proportional to p_k exp(t F_k(w)) (Lemma 1): t > 0 weighs the clients of larger loss
more, t -> inf approaches the worst client's loss, t = 0 is the mean (FedAvg). fedac applies the
tilted weights to FedAvg's local updates: each client runs FedAvg's local SGD from w^t and reports
F_k(w^t) (algorithms/fairness.py), and

    w^{t+1} = sum_k m_k exp(t (F_k - max_j F_j)) w_k / sum_k m_k exp(t (F_k - max_j F_j))

(m_k by `aggregation.weighting`: n_k, or 1; the max is subtracted for numerical safety and cancels).
With t = 0 every tilt is exactly 1, so this is FedAvg's weighted mean (to float rounding: float64
sums). `term.t` < 0 tilts the other way (robustness to outlying clients).
"""

from __future__ import annotations

import math
from typing import Any

from fedac.algorithms.fairness import LossReportingFedAvg, weighted_mean


def tilted_weights(losses: list[float], base: list[float], t: float) -> list[float]:
    """m_k exp(t (F_k - max F))."""
    top = max(losses) if t >= 0 else min(losses)
    return [m * math.exp(t * (f - top)) for f, m in zip(losses, base)]


class TERM(LossReportingFedAvg):
    name = "term"

    def server_update(self, server, uploads, round_idx) -> tuple[dict[str, Any], dict[str, float]]:
        losses = [float(u["loss"]) for u, _ in uploads]
        weights = tilted_weights(losses, self.weights(uploads), self.cfg.term.t)
        params = weighted_mean([u["params"] for u, _ in uploads], weights)
        return {**server, "params": params}, {"max_client_loss": max(losses)}
