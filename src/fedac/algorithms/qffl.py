"""q-FFL by q-FedAvg (Li, Sanjabi, Beirami and Smith, "Fair Resource Allocation in Federated
Learning", ICLR 2020, Algorithm 2).

min_w f_q(w) = sum_k p_k / (q + 1) F_k^{q+1}(w): a larger q weighs the clients of larger loss more
(q = 0 is FedAvg's objective). Each selected client runs FedAvg's local SGD from w^t to w_k and
reports F_k = F_k(w^t) (algorithms/fairness.py); with L the Lipschitz estimate (`qffl.lipschitz`,
0: the paper's 1 / train.lr) the server computes

    Dw_k = L (w^t - w_k)
    D_k  = F_k^q Dw_k
    h_k  = q F_k^(q-1) ||Dw_k||^2 + L F_k^q
    w^{t+1} = w^t - sum_k m_k D_k / sum_k m_k h_k

with ||.|| over every floating entry of the model. The paper samples clients with probability
p_k and sums with m_k = 1 (`aggregation.weighting=uniform`); fedac samples uniformly, so its
default m_k = n_k keeps the n_k weighting of FedAvg's mean: with q = 0, w^{t+1} = sum m_k w_k /
sum m_k, FedAvg's update under either weighting (to float rounding: the sums are in float64).
"""

from __future__ import annotations

from typing import Any

from fedac.algorithms.fairness import LossReportingFedAvg


class QFFL(LossReportingFedAvg):
    name = "qffl"

    def server_update(self, server, uploads, round_idx) -> tuple[dict[str, Any], dict[str, float]]:
        q = self.cfg.qffl.q
        lip = self.cfg.qffl.lipschitz or 1.0 / self.cfg.train.lr
        old = server["params"]
        floating = [n for n, v in old.items() if v.is_floating_point()]
        num: dict[str, Any] = {n: 0.0 for n in floating}
        den = 0.0
        for (upload, _), m in zip(uploads, self.weights(uploads)):
            loss = float(upload["loss"])
            step = {n: lip * (old[n].double() - upload["params"][n].double()) for n in floating}
            norm2 = sum(float(s.pow(2).sum()) for s in step.values())
            scale = loss**q
            for n in floating:
                num[n] = num[n] + m * scale * step[n]
            den += m * ((q * loss ** (q - 1) * norm2 if q else 0.0) + lip * scale)
        params = {
            n: (v.double() - num[n] / den).to(v.dtype) if n in num else uploads[0][0]["params"][n]
            for n, v in old.items()
        }
        losses = [float(u["loss"]) for u, _ in uploads]
        return {**server, "params": params}, {"max_client_loss": max(losses)}
