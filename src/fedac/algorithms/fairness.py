"""What the fairness objectives (q-FFL, AFL, TERM: qffl.py, afl.py, term.py) share: FedAvg's local
update (local SGD from the global model w^t, stacked or sequential), after which each client also
reports F_k(w^t), the loss of the model it received on its own training clips (one forward pass
over them in eval mode, its batches of `train.eval_batch_size`: part of the client's update, so the
virtual clock's FLOP count, taken on one real update, charges it). The upload is
{"params": the local model, "loss": F_k(w^t), "client": k's index among the task's clients}; each
method's `server_update` turns the losses into its own combination of the local models.

The upload carries more than a model, so DP-FedAvg, model-poisoning attacks, upload compression,
the async modes and the robust rules (which would drop or reweight uploads behind the objective's
back) are refused, as for SCAFFOLD.
"""

from __future__ import annotations

from typing import Any, cast

import torch

from fedac.algorithms.base import ClientData, ClientResult, Params, reproduces
from fedac.algorithms.fedavg import FedAvg
from fedac.errors import ConfigError
from fedac.settings.attacks import ATTACKS


class LossReportingFedAvg(FedAvg):
    """FedAvg whose clients also report F_k(w^t) (module docstring)."""

    dp_compatible = False
    sums_uploads = False
    augmentable = False  # (F_k is read on the client's fixed windows)

    def __init__(self, cfg, task, runtime=None):
        super().__init__(cfg, task, runtime)
        refused = {
            "dp.mode": (cfg.dp.mode, "none"),
            "aggregation.method": (cfg.aggregation.method, "mean"),
        }
        for key, (value, default) in refused.items():
            if value != default:
                raise ConfigError(
                    f"{key}={value}: {self.name} combines the local models by its own objective "
                    f"from the losses its clients report; set {key}={default}"
                )
        if ATTACKS.load(cfg.attack.kind).poisons == "upload":
            raise ConfigError(
                f"attack.kind={cfg.attack.kind} poisons model uploads, and {self.name} uploads "
                "its loss beside the model: use a data attack (label_flip, label_permute, backdoor)"
            )
        self.index = {name: k for k, name in enumerate(task.clients)}

    def start_loss(self, payload: Params, data: ClientData) -> float:
        """F_k(w^t): the mean cross-entropy of the received model over the client's clips."""
        model = self.scratch_model(self.cfg.model.name, payload).eval()
        batch, total = self.cfg.train.eval_batch_size, 0.0
        # (fixed windows and plain labels: features.augment is refused, `augmentable`)
        x, labels = cast(torch.Tensor, data.x), cast(torch.Tensor, data.y)
        with torch.no_grad():
            for i in range(0, data.num_samples, batch):
                logits = model(x[i : i + batch]).float()
                y = labels[i : i + batch]
                total += float(torch.nn.functional.cross_entropy(logits, y, reduction="sum"))
        return total / max(1, data.num_samples)

    def _reporting(self, result: ClientResult, payload: Params, data: ClientData) -> ClientResult:
        upload = {
            "params": result.upload,
            "loss": torch.tensor(self.start_loss(payload, data), dtype=torch.float64),
            "client": torch.tensor(self.index[data.name]),
        }
        return ClientResult(upload, result.state, result.metrics)

    def client_update(self, payload, state, data, round_idx, generator) -> ClientResult:
        result = super().client_update(payload, state, data, round_idx, generator)
        return self._reporting(result, payload, data)

    @reproduces(client_update)
    def cohort_update(self, payload, states, datas, round_idx, seed) -> list[ClientResult]:
        results = super().cohort_update(payload, states, datas, round_idx, seed)
        return [self._reporting(r, payload, d) for r, d in zip(results, datas)]

    def weights(self, uploads: list[tuple[dict[str, Any], int]]) -> list[float]:
        """m_k: each upload's share by `aggregation.weighting` (n_k, or 1 each)."""
        uniform = self.server_weighting(self.cfg) == "uniform"
        return [1.0 if uniform else float(n) for _, n in uploads]


def weighted_mean(models: list[Params], weights: list[float]) -> Params:
    """sum_k w_k x_k / sum_k w_k over the floating entries (in float64, then the entry's dtype);
    other entries from the first model."""
    total = sum(weights)
    out = {}
    for name, first in models[0].items():
        if not first.is_floating_point():
            out[name] = first
            continue
        acc = torch.zeros_like(first, dtype=torch.float64)
        for w, m in zip(weights, models):
            acc = acc + w * m[name].double()
        out[name] = (acc / total).to(first.dtype)
    return out
