"""FedDyn (Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021),
Algorithm 1, as a local objective (it trains stacked).

Client k keeps grad L_k(theta_k^{t-1}), the gradient of its loss at its last local model (zero
before its first round: a tensor per trainable parameter). In round t it minimises, from
theta^{t-1} and with fedac's local optimiser and steps,

    L_k(theta) - <grad L_k(theta_k^{t-1}), theta> + alpha/2 ||theta - theta^{t-1}||^2

(the two regularisers enter as their gradient, -grad L_k(theta_k^{t-1}) + alpha (theta -
theta^{t-1}), added to the data gradient; the reported loss is L_k's), then keeps

    grad L_k(theta_k^t) = grad L_k(theta_k^{t-1}) - alpha (theta_k^t - theta^{t-1}).

The server, with P_t the round's clients and m the task's (`feddyn.m`: every client, or only those
that hold training windows, the paper's devices):

    h^t = h^{t-1} - alpha / m sum_{k in P_t} (theta_k^t - theta^{t-1})
    theta^t = 1/|P_t| sum_{k in P_t} theta_k^t - h^t / alpha

The mean is `aggregation.method`'s (its paper-faithful default here is the unweighted one,
`aggregation.weighting=uniform`), and h's sum is |P_t| times that mean's step. `feddyn.alpha=0`
switches the regulariser and the correction off (h stays 0): FedAvg with the same steps. The new
global model is the mean shifted by h / alpha, so DP (whose accounting needs the mean itself) is
refused.
"""

from __future__ import annotations

from typing import Any

from fedac.algorithms.base import Params
from fedac.algorithms.fedavg import FedAvg
from fedac.algorithms.objective import LocalObjective


class FedDyn(LocalObjective, FedAvg):
    name = "feddyn"
    reads_model_once = True
    dp_compatible = False
    trains_ssl_encoders = False  # (a local objective reads feature windows)
    # h needs |P_t|, which the all-reduced weighted sums do not carry
    sums_uploads = False

    def init_server(self) -> dict[str, Any]:
        return {**super().init_server(), "h": self.zeros_like_params()}

    def init_client_state(self, client: str) -> Params:
        return self.zeros_like_params()  # grad L_k(theta_k^0)

    def transform_grads(self, grads, params, state, payload) -> Params:
        alpha = self.cfg.feddyn.alpha
        return {
            n: g - state[n] + alpha * (params[n].detach() - payload[n]) for n, g in grads.items()
        }

    def finish_local(self, params, state, payload, steps) -> tuple[Params, Params]:
        alpha = self.cfg.feddyn.alpha
        return params, {n: g - alpha * (params[n] - payload[n]) for n, g in state.items()}

    def clients_m(self) -> int:
        """Algorithm 1's m: the task's clients, or (`feddyn.m=training`) those with training
        windows (a task that does not count its clients' windows: all of them)."""
        counts = self.task.class_counts
        if self.cfg.feddyn.m == "all" or counts is None:
            return len(self.task.clients)
        return max(1, sum(1 for c in counts if sum(c) > 0))

    def server_update(
        self, server: dict[str, Any], uploads: list[tuple[Params, int]], round_idx: int
    ) -> tuple[dict[str, Any], Any]:
        mean, metrics = self.combine(server, uploads)
        alpha, old = self.cfg.feddyn.alpha, server["params"]
        share = len(uploads) / self.clients_m()
        h = {n: v - alpha * share * (mean[n] - old[n]) for n, v in server["h"].items()}
        params = dict(mean)
        if alpha > 0:
            for n, v in h.items():
                params[n] = mean[n] - v / alpha
        return {**server, "params": params, "h": h}, metrics
