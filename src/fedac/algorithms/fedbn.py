"""FedBN (Li et al. 2021, "FedBN: Federated Learning on Non-IID Features via Local Batch
Normalization", Algorithm 1): FedAvg in which every BatchNorm layer's parameters and running
statistics stay on the client. The server averages every weight except the BN layers'; each client
starts its next update from the aggregate with its own BN layers.

Which entries are BatchNorm is models/parts.py's `batchnorm_entries`: in the zoo `dscnn`,
`mhattrnn` and `resnet15` have BatchNorm; the CRNNs, `kwt`, the KWS CNNs and the SSL encoders have
none. There FedBN shares every entry, so it trains as FedAvg does: it says so with a warning (or,
with `fedbn.require_batchnorm=true`, refuses to start), and its own models are the clients' last
local models (partial.py).
"""

from __future__ import annotations

import logging

from torch import nn

from fedac.algorithms.partial import PartlyShared
from fedac.errors import ConfigError
from fedac.models.parts import batchnorm_entries

log = logging.getLogger(__name__)


class FedBN(PartlyShared):
    name = "fedbn"

    def private_entries(self, model: nn.Module) -> set[str]:
        private = batchnorm_entries(model)
        if not private:
            what = (
                f"model {self.cfg.model.name} has no BatchNorm layer (models/parts.py), so FedBN "
                "shares every entry: it is FedAvg"
            )
            if self.cfg.fedbn.require_batchnorm:
                raise ConfigError(
                    f"{what}. Choose a model with BatchNorm (dscnn, mhattrnn, resnet15) or set "
                    "fedbn.require_batchnorm=false"
                )
            log.warning("%s (fedbn.require_batchnorm=true refuses this)", what)
        return private
