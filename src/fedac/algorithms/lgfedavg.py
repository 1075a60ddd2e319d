"""LG-FedAvg (Liang et al. 2020, "Think Locally, Act Globally: Federated Learning with Local and
Global Representations", Algorithm 1): each client keeps a local representation (the body) and the
global model is the top layers (the head), averaged by FedAvg. A client trains its local body and
the global head together on its data (the client update of Algorithm 1) and uploads the head.

Body and head are models/parts.py's. The paper also trains the local representations with auxiliary
objectives (e.g. adversarial fairness); those are not part of this baseline: the body learns the
supervised loss through the shared head only.
"""

from __future__ import annotations

from torch import nn

from fedac.algorithms.partial import PartlyShared
from fedac.models.parts import body_entries


class LGFedAvg(PartlyShared):
    name = "lgfedavg"

    def private_entries(self, model: nn.Module) -> set[str]:
        return body_entries(model, self.cfg.model.name)
