"""FedRep (Collins et al. 2021, "Exploiting Shared Representations for Personalized Federated
Learning", Algorithm 1): a shared representation (the body) and a private head per client. In a
round, client i first updates its head for tau_h local updates with the representation fixed
(`fedrep.head_epochs` epochs here), then the representation for tau_phi updates with its new head
fixed (`train.local_epochs` epochs), and uploads the representation; the server averages the
representations (weighted by n_k as `aggregation.weighting` says; the algorithm box takes the plain
mean, `aggregation.weighting=uniform`).

Body and head are models/parts.py's. Each phase has its own optimiser, as the reference code's
single optimiser skips the parameters that have no gradient in a phase; so the head's momentum does
not carry into the body phase. The phases are counted in epochs, so `train.local_steps` must be 0.
"""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from fedac.algorithms.partial import PartlyShared, Phase
from fedac.errors import ConfigError
from fedac.models.parts import head_entries


class FedRep(PartlyShared):
    name = "fedrep"
    #: The clock charges a client the steps of `train.*`'s schedule, and the two paths would cut a
    #: late client's two phases differently (the sequential one per phase, the stacked one over the
    #: head-then-body schedule), so neither would train what the clock charged.
    partial_work = (
        "fedrep trains two phases (its head for fedrep.head_epochs, then its body), which "
        "partial work cannot cut into the steps the clock charged"
    )

    def __init__(self, cfg, task, runtime=None):
        if cfg.train.local_steps:
            raise ConfigError(
                "fedrep counts its phases in epochs (fedrep.head_epochs, then train.local_epochs): "
                f"set train.local_steps=0 (got {cfg.train.local_steps})"
            )
        super().__init__(cfg, task, runtime)

    def private_entries(self, model: nn.Module) -> set[str]:
        return head_entries(model, self.cfg.model.name)

    def phases(self) -> list[Phase]:
        train = self.cfg.train
        return [
            (self.private, replace(train, local_epochs=self.cfg.fedrep.head_epochs)),
            (set(self.shared), train),
        ]
