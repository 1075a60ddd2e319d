"""The CRNN model zoo of fedmlac.md Table 3.

Every variant is Conv1D -> ReLU -> max-pool(2) -> dropout per conv layer (convolving over time with
the feature coefficients as channels), a GRU or Bi-GRU over the pooled frames, mean over time, and a
fully connected head. Kernel 5 with padding 2 keeps the frame count before pooling; pooling uses
ceil mode so any input length >= 1 frame works.

Table 3 leaves "3 x Conv1D (64->128 filters)" of CRNN-Deep open; we read it as 64, 128, 128.
"""

from __future__ import annotations

import torch
from torch import nn

from fedac.models.base import EmbeddingModel

# (the specs are torch-free: `fedac list` describes the zoo without torch)
from fedac.models.specs import CRNN_SPECS as CRNN_SPECS
from fedac.models.specs import CRNNSpec


class CRNN(EmbeddingModel):
    def __init__(
        self,
        spec: CRNNSpec,
        num_features: int,
        num_classes: int,
        dropout: float = 0.1,
        kernel: int = 5,
    ):
        super().__init__()
        layers: list[nn.Module] = []
        channels = num_features
        for width in spec.conv_channels:
            layers += [
                nn.Conv1d(channels, width, kernel, padding=kernel // 2),
                nn.ReLU(),
                nn.MaxPool1d(2, ceil_mode=True),
                nn.Dropout(dropout),
            ]
            channels = width
        self.conv = nn.Sequential(*layers)
        self.rnn = nn.GRU(channels, spec.hidden, batch_first=True, bidirectional=spec.bidirectional)
        self.embedding_dim = spec.hidden * (2 if spec.bidirectional else 1)
        self.head = nn.Linear(self.embedding_dim, num_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, features, frames) -> (batch, embedding_dim): the penultimate representation."""
        frames = self.conv(x).transpose(1, 2)
        out, _ = self.rnn(frames)
        return out.mean(dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x))
