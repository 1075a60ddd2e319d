"""`EmbeddingModel`: what the zoo's feature networks (CRNN, the FedKWS-UI keyword spotters and the
zero-shot paper's CNNs) share and what methods that reach inside a model rely on: `embed()` (the
penultimate representation, (batch, embedding_dim)), `head` (the layer that turns it into logits)
and `embedding_dim`.

It adds no parameters or behaviour: it names the interface so that FedKAD, FedMMD and FedKWS-UI are
type-checked against it. A plug-in model (docs/extending.md) need not subclass it,
and then works with the methods that only call `forward`.
"""

from __future__ import annotations

import torch
from torch import nn


class EmbeddingModel(nn.Module):
    embedding_dim: int
    head: nn.Module  # set by each network

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, features, frames) -> (batch, embedding_dim): the penultimate representation."""
        raise NotImplementedError  # each network defines its own
