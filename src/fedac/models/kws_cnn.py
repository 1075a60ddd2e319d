"""The small CNNs of the zero-shot FL paper (Gudur & Perepu, Tables 1-2), one family.

Every convolutional variant is, per layer, Conv2D 3x3 with same padding over the (coefficients x
frames) image -> activation -> max-pool 2x2 (ceil mode, so 10 x 21 MFCC inputs survive four layers),
then global average pooling and `head = Linear(C_last, K)`, the last layer whose weights give the
class-similarity matrix (Eq. 1). `embed()` returns the pooled vector.

Readings where the paper is silent:
- "Softmax activation" is Keras' Conv2D(activation="softmax"): a softmax over the channels at each
  position (`ChannelSoftmax`), not a softmax over the image.
- The depthwise-separable CNN starts with a regular 3x3 convolution (one input channel has nothing
  to separate), then depthwise 3x3 + pointwise 1x1 per layer, as in DS-CNN (Zhang et al. 2017).
- The 3-layer ANN (Dense 16, 16, 32 on the flattened input) first average-pools time to 21 frames
  (one 1 s window at a 50 ms hop, the paper's 20 windows + 1), so any clip length gives the same
  input size.
- No dropout or batch normalisation (none is listed).
"""

from __future__ import annotations

import torch
from torch import nn

from fedac.models.base import EmbeddingModel

# (the specs are torch-free: `fedac list` describes the models without torch)
from fedac.models.specs import KWS_CNN_SPECS as KWS_CNN_SPECS
from fedac.models.specs import KWSCNNSpec

ANN_FRAMES = 21


class ChannelSoftmax(nn.Module):
    """Keras' softmax activation on a conv layer: softmax over channels at every position."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


def _activation(name: str) -> nn.Module:
    return ChannelSoftmax() if name == "softmax" else nn.ReLU()


class KWSCNN(EmbeddingModel):
    def __init__(self, spec: KWSCNNSpec, num_features: int, num_classes: int):
        super().__init__()
        layers: list[nn.Module] = []
        if spec.kind == "ann":
            layers.append(nn.AdaptiveAvgPool1d(ANN_FRAMES))
            layers.append(nn.Flatten())
            width = num_features * ANN_FRAMES
            for out in spec.channels:
                layers += [nn.Linear(width, out), _activation(spec.activation)]
                width = out
        else:
            channels = 1
            for i, out in enumerate(spec.channels):
                if spec.kind == "dscnn" and i > 0:
                    layers += [
                        nn.Conv2d(channels, channels, 3, padding=1, groups=channels),
                        nn.Conv2d(channels, out, 1),
                    ]
                else:
                    layers.append(nn.Conv2d(channels, out, 3, padding=1))
                layers += [_activation(spec.activation), nn.MaxPool2d(2, ceil_mode=True)]
                channels = out
            layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
            width = channels
        self.spec = spec
        self.body = nn.Sequential(*layers)
        self.embedding_dim = width
        self.head = nn.Linear(width, num_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, features, frames) -> (batch, embedding_dim)."""
        return self.body(x if self.spec.kind == "ann" else x.unsqueeze(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x))
