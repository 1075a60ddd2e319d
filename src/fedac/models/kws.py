"""The four keyword-spotting networks of the FedKWS-UI paper (Sec. 5, Table 2), as its official code
builds them: DSCNN, MHAttRNN, ResNet15 and the keyword Transformer (KWT), each about 0.2M
parameters.

Every network takes fedac's features (batch, coefficients, frames), views them as a one-channel
image (batch, 1, frames, coefficients) as the paper's code does (T = 101, F = 40), and exposes
`embed()` (the penultimate features) and `head` (one linear layer), so the FedKWS-UI two-head model
and FedMMD can reach the encoder output.

Choices:
- KWT's model dimension is 80, the official code's value, which gives Table 2's 232K / 234K
  parameters; the paper's text says 96 (327K / 330K). Its learned position embedding fixes the input
  size, so KWT takes the frame count at construction (101: 1 s at a 10 ms hop) and rejects other
  inputs with a ConfigError naming the setting.
- None of the four uses dropout (the code has none; KWT's encoder dropout is 0), so `model.dropout`
  does not apply to them.
- Initialisation as the code's `weights_init`: Kaiming-normal convolutions (fan_out, ReLU gain),
  Kaiming-normal linear layers, zero biases, BatchNorm weight 1 and bias 0. KWT's attention
  projections (`in_proj_weight`) are not a Linear module and keep PyTorch's default.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedac.errors import ConfigError
from fedac.models.base import EmbeddingModel


def kws_init(module: nn.Module) -> None:
    """The official code's `weights_init`, applied to every submodule."""
    if isinstance(module, (nn.Conv1d, nn.Conv2d)):
        nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.BatchNorm2d) and module.affine:
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Linear):
        nn.init.kaiming_normal_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


class KWSNet(EmbeddingModel):
    """Shared plumbing: (batch, F, T) -> (batch, 1, T, F) for `features`, then the linear head
    (`head` and `embedding_dim` set by each subclass)."""

    def features(self, image: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, features, frames) -> (batch, embedding_dim): the penultimate representation."""
        return self.features(x.transpose(1, 2).unsqueeze(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x))


class DSCNN(KWSNet):
    """Conv(10x4, stride 2) + BN + ReLU, five depthwise-separable blocks, global average pool."""

    def __init__(self, num_features: int, num_classes: int, channels: int = 172, blocks: int = 5):
        super().__init__()
        layers: list[nn.Module] = [
            nn.Conv2d(1, channels, (10, 4), stride=2),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
        ]
        for _ in range(blocks):
            # depthwise (with bias)
            layers += [
                nn.Conv2d(channels, channels, 3, padding=1, groups=channels),
                nn.Conv2d(channels, channels, 1),  # pointwise
                nn.BatchNorm2d(channels),
                nn.ReLU(),
            ]
        self.cnn = nn.Sequential(*layers)
        self.embedding_dim = channels
        self.head = nn.Linear(channels, num_classes)
        self.apply(kws_init)

    def features(self, image: torch.Tensor) -> torch.Tensor:
        return self.cnn(image).mean(dim=(2, 3))


class MHAttRNN(KWSNet):
    """Two (5x1) time convolutions, a 2-layer Bi-GRU, and 4-head attention queried by the middle
    frame."""

    def __init__(self, num_features: int, num_classes: int, hidden: int = 80, heads: int = 4):
        super().__init__()
        self.cnn = nn.Sequential(
            nn.Conv2d(1, 10, (5, 1)),
            nn.BatchNorm2d(10),
            nn.ReLU(),
            nn.Conv2d(10, 1, (5, 1)),
            nn.BatchNorm2d(1),
            nn.ReLU(),
        )
        self.rnn = nn.GRU(num_features, hidden, num_layers=2, bidirectional=True, batch_first=True)
        width = 2 * hidden
        self.keys = nn.ModuleList(
            nn.Linear(width, width // heads, bias=False) for _ in range(heads)
        )
        self.queries = nn.ModuleList(
            nn.Linear(width, width // heads, bias=False) for _ in range(heads)
        )
        self.embedding_dim = width // heads * heads
        self.head = nn.Linear(self.embedding_dim, num_classes)
        self.apply(kws_init)

    def features(self, image: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.cnn(image).squeeze(1))  # (batch, frames - 8, 2 * hidden)
        query = out[:, out.shape[1] // 2]
        heads = []
        for key, q in zip(self.keys, self.queries):
            k = key(out)  # (batch, time, d)
            attention = torch.einsum("btd,bd->bt", k, q(query)).softmax(dim=1)
            heads.append(torch.einsum("bt,btd->bd", attention, k))
        return torch.cat(heads, dim=1)


class ResBlock(nn.Module):
    """conv-BN-ReLU-conv-BN plus the input, then ReLU; 3x3 dilated convolutions, BN without
    affine."""

    def __init__(self, channels: int, dilations: tuple[int, int]):
        super().__init__()
        d0, d1 = dilations
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=d0, dilation=d0, bias=False)
        self.bn1 = nn.BatchNorm2d(channels, affine=False)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=d1, dilation=d1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels, affine=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))) + x)


class ResNet15(KWSNet):
    """Tang & Lin's res15: conv0, six dilated residual blocks, a last dilated conv, average pool."""

    def __init__(self, num_features: int, num_classes: int, channels: int = 45, layers: int = 15):
        super().__init__()
        blocks = (layers - 3) // 2
        self.conv0 = nn.Conv2d(1, channels, 3, padding=1, bias=False)
        self.bn0 = nn.BatchNorm2d(channels, affine=False)
        # Dilations 2^floor(2b/3), 2^floor((2b+1)/3): (1,1) (1,2) (2,2) (4,4) (4,8) (8,8), then 16.
        self.blocks = nn.Sequential(
            *(
                ResBlock(channels, (2 ** (2 * b // 3), 2 ** ((2 * b + 1) // 3)))
                for b in range(blocks)
            )
        )
        last = 2 ** (2 * blocks // 3)
        self.last_conv = nn.Conv2d(channels, channels, 3, padding=last, dilation=last, bias=False)
        self.embedding_dim = channels
        self.head = nn.Linear(channels, num_classes)
        self.apply(kws_init)

    def features(self, image: torch.Tensor) -> torch.Tensor:
        out = self.blocks(F.relu(self.bn0(self.conv0(image))))
        return self.last_conv(out).mean(dim=(2, 3))


class KWT(KWSNet):
    """Keyword Transformer: 8x8 patches at stride 4 (no bias), a class token, learned positions,
    four post-norm encoder layers (4 heads, feed-forward 2d, GELU, no dropout), the class token's
    output."""

    def __init__(
        self,
        num_features: int,
        num_classes: int,
        frames: int = 101,
        dim: int = 80,
        layers: int = 4,
        patch: int = 8,
        stride: int = 4,
    ):
        super().__init__()
        if frames < patch or num_features < patch:
            raise ConfigError(
                f"kwt needs at least {patch} frames and {patch} features, got {frames} x "
                f"{num_features}"
            )
        self.frames, self.num_features = frames, num_features
        patches = ((frames - patch) // stride + 1) * ((num_features - patch) // stride + 1)
        self.patch = nn.Conv2d(1, dim, patch, stride=stride, bias=False)
        self.pos_embedding = nn.Parameter(torch.randn(1, patches + 1, dim))
        self.cls_embedding = nn.Parameter(torch.randn(1, 1, dim))
        layer = nn.TransformerEncoderLayer(
            dim, 4, dim_feedforward=2 * dim, dropout=0.0, activation="gelu", batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.embedding_dim = dim
        self.head = nn.Linear(dim, num_classes)
        self.apply(kws_init)

    def features(self, image: torch.Tensor) -> torch.Tensor:
        if image.shape[2:] != (self.frames, self.num_features):
            raise ConfigError(
                f"kwt was built for {self.frames} frames x {self.num_features} features, got "
                f"{image.shape[2]} x {image.shape[3]}: 1 s clips at a 10 ms hop give 101 frames "
                f"(features.clip_seconds / features.hop_ms)"
            )
        tokens = self.patch(image).flatten(2).transpose(1, 2)
        # (tokens.shape[0], not len(tokens): an int, which an exported graph would fix the batch to)
        tokens = (
            torch.cat([self.cls_embedding.expand(tokens.shape[0], -1, -1), tokens], dim=1)
            + self.pos_embedding
        )
        return self.encoder(tokens)[:, 0]


#: Name -> constructor (num_features, num_classes), for `models.build_model`.
KWS_MODELS = {"dscnn": DSCNN, "mhattrnn": MHAttRNN, "resnet15": ResNet15, "kwt": KWT}
