# fedac_example/algorithm.py
"""FedAvg whose server takes a step of `fedavg_lr.server_lr` towards the clients' mean."""

from fedac.algorithms.fedavg import FedAvg


class FedAvgLR(FedAvg):
    dp_compatible = False  # the server transforms the (noised) aggregate further

    def server_update(self, server, uploads, round_idx):
        mean, metrics = self.combine(server, uploads)
        lr, old = self.cfg.fedavg_lr.server_lr, server["params"]
        params = {
            name: old[name] + lr * (value - old[name]) if value.is_floating_point() else value
            for name, value in mean.items()
        }
        return {**server, "params": params}, metrics
