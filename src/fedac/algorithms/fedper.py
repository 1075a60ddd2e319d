"""FedPer (Arivazhagan et al. 2019, "Federated Learning with Personalization Layers", Section 3 and
Algorithm 1): the base layers are shared by FedAvg, the personalization layers stay on the client;
each client trains both together on its data every round (the client update of Algorithm 1),
uploads the base layers, and the server averages them weighted by n_k.

The personalization layers are the network's head (models/parts.py: the final classifier of every
zoo family), the base layers its body.
"""

from __future__ import annotations

from torch import nn

from fedac.algorithms.partial import PartlyShared
from fedac.models.parts import head_entries


class FedPer(PartlyShared):
    name = "fedper"

    def private_entries(self, model: nn.Module) -> set[str]:
        return head_entries(model, self.cfg.model.name)
