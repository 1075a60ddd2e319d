"""MOON (Li, He and Song, "Model-Contrastive Federated Learning", CVPR 2021) as a local objective
(it trains stacked): FedAvg whose local loss adds a contrastive term that pulls a sample's
representation z towards the global model's z_glob and away from the client's previous local
model's z_prev (Eq. 3),

    l_con = -log( e^{sim(z, z_glob) / tau} / (e^{sim(z, z_glob) / tau} + e^{sim(z, z_prev) / tau}) )
    loss  = l_sup + mu * l_con                                                       (Eq. 4)

with sim the cosine similarity, `moon.mu` and `moon.temperature` (tau), each term the batch mean.
The global model w^t and the previous local model w_i^{t-1} are frozen teachers
(`LocalObjective.teachers`) in eval mode: BatchNorm's running statistics, no dropout. A client's
first round has no previous model: l_con then has no negative pair and is 0, as the authors' code
computes it. The server is FedAvg's, so DP, the robust rules and model-poisoning attacks apply as to
FedAvg. Each client keeps its last local model (one model's parameters and buffers).

The representation. The paper adds a projection head to its CNNs and takes z after it; fedac adds
no layer and takes z where each model family exposes its penultimate representation:
- the CRNN zoo (crnn_*), the KWS networks (dscnn, mhattrnn, resnet15, kwt, ...) and the zero-shot
  CNNs: `embed(x)`, the vector their classification head reads (models/base.py EmbeddingModel);
- a model without `embed` (a plug-in's): its logits;
- the SSL encoders (w2v2_*): their `embed` would be the stats-pooled utterance vector, but a local
  objective reads feature windows, so MOON refuses them at start (`trains_ssl_encoders`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedac.algorithms.base import Params
from fedac.algorithms.fedavg import FedAvg
from fedac.algorithms.objective import LocalObjective
from fedac.training.local import cross_entropy

#: The state's flag of a client that has trained before (a name no module attribute can have).
VISITED = "#visited"


class Moon(LocalObjective, FedAvg):
    name = "moon"
    reads_model_once = True
    trains_ssl_encoders = False

    def _network(self):
        return self.scratch_model(self.cfg.model.name)

    def _methods(self) -> tuple[str, str] | None:
        """(representation, logits-from-representation) method names, or None: the logits are the
        representation."""
        model = self._network()
        if not hasattr(model, "embed"):
            return None
        return "embed", "classify" if hasattr(model, "classify") else "head"

    def teachers(self, payload: Params, state: Params) -> dict[str, Params]:
        if self.cfg.moon.mu == 0:
            return {}
        return {"global": payload, "previous": {n: v for n, v in state.items() if n != VISITED}}

    def init_client_state(self, client: str) -> Params:
        # (a placeholder model, never read before the client's first round)
        start = self.initial_params(self.cfg.model.name, "global-init")
        return {**start, VISITED: torch.zeros(())}

    def local_loss(self, forward, params, x, y, weight, state, payload) -> torch.Tensor:
        methods, mu = self._methods(), self.cfg.moon.mu
        if methods is None:
            z = logits = forward(x)
        else:
            z = forward(x, methods[0])
            logits = forward(z, methods[1])
        loss = cross_entropy(logits, y, weight)
        if mu == 0:
            return loss
        represent = methods[0] if methods else "forward"
        z_glob = forward(x, represent, teacher="global")
        z_prev = forward(x, represent, teacher="previous")
        tau = self.cfg.moon.temperature
        positive = F.cosine_similarity(z, z_glob, dim=-1) / tau
        negative = F.cosine_similarity(z, z_prev, dim=-1) / tau
        contrastive = torch.logaddexp(positive, negative) - positive
        return loss + mu * state[VISITED] * (contrastive * weight).sum(-1)

    def finish_local(self, params, state, payload, steps) -> tuple[Params, Params]:
        kept = {n: v.clone() for n, v in params.items()}
        return params, {**kept, VISITED: torch.ones((), device=state[VISITED].device)}
