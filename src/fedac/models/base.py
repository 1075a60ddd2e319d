"""`EmbeddingModel`: what the zoo's feature networks (CRNN, the FedKWS-UI keyword spotters and the
zero-shot paper's CNNs) share and what methods that reach inside a model rely on: `embed()` (the
penultimate representation, (batch, embedding_dim)), `head` (the layer that turns it into logits)
and `embedding_dim`. Methods take logits from embeddings through `classify` (the model's own
`classify` where something sits between the two, as the SSL models' head norm, else `head`).

It adds no parameters or behaviour: it names the interface so that FedKAD, FedMMD and FedKWS-UI are
type-checked against it. A plug-in model (docs/extending.md) need not subclass it,
and then works with the methods that only call `forward`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class EmbeddingModel(nn.Module):
    embedding_dim: int
    head: nn.Module  # set by each network

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, features, frames) -> (batch, embedding_dim): the penultimate representation."""
        raise NotImplementedError  # each network defines its own


def classify(model: Any, h: torch.Tensor) -> torch.Tensor:
    """The logits of embeddings `h` (what `model.embed` returned), so that `classify(model,
    model.embed(x))` is `model(x)`: the model's own `classify` where it has one (an SSL model with
    `model.head_norm` standardises the pooled vector before its head), else `model.head(h)`."""
    own = getattr(model, "classify", None)
    return own(h) if own is not None else model.head(h)
