# fedac_example/scaffold.py
"""SCAFFOLD (Karimireddy et al. 2020, option II) stated once as a local objective: fedac builds its
sequential and its stacked client update from these functions, the control variates stacked per
client."""

import torch
import torch.nn.functional as F

from fedac.algorithms.cohort import LocalObjective


class Scaffold(LocalObjective):
    def init_server(self):
        params = self.initial_params(self.cfg.model.name, "global-init")
        return {"params": params, "control": self.zero_control()}

    def zero_control(self):
        model = self.scratch_model(self.cfg.model.name)
        return {name: torch.zeros_like(p.detach()) for name, p in model.named_parameters()}

    def broadcast(self, server):
        return {"params": server["params"], "control": server["control"]}

    def start_params(self, payload):
        return payload["params"]

    def init_client_state(self, client):
        return self.zero_control()  # c_i = 0

    def local_loss(self, forward, params, x, y, weight, state, payload):
        return (F.cross_entropy(forward(x), y, reduction="none") * weight).sum()

    def transform_grads(self, grads, params, state, payload):
        # g - c_i + c
        return {name: g - state[name] + payload["control"][name] for name, g in grads.items()}

    def finish_local(self, params, state, payload, steps):
        x, c, lr = payload["params"], payload["control"], self.cfg.train.lr
        new = {
            name: ci - c[name] + (x[name] - params[name]) / (max(steps, 1) * lr)
            for name, ci in state.items()
        }
        return {"params": params, "control": {name: new[name] - state[name] for name in new}}, new

    def server_update(self, server, uploads, round_idx):
        def mean(key, name):
            return torch.stack([upload[key][name] for upload, _ in uploads]).mean(0)

        params = {
            name: mean("params", name) if value.is_floating_point() else value
            for name, value in server["params"].items()
        }  # x + 1 * mean(y_i - x)
        share = len(uploads) / len(self.task.clients)
        control = {
            name: value + share * mean("control", name) for name, value in server["control"].items()
        }
        return {"params": params, "control": control}, {}
