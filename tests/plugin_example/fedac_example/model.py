# fedac_example/model.py
"""A model builder: fedac calls it with keywords whenever model.name (or another model setting)
names it."""

from torch import nn


class TinyMLP(nn.Module):
    """The same two-layer MLP on every frame, its hidden units averaged over the clip's frames."""

    def __init__(self, num_features: int, num_classes: int, dropout: float, hidden: int = 32):
        super().__init__()
        self.frame = nn.Sequential(nn.Conv1d(num_features, hidden, kernel_size=1), nn.ReLU())
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(hidden, num_classes))

    def forward(self, x):  # x: (batch, features, frames)
        return self.head(self.frame(x).mean(dim=2))


def build(name, num_features, num_classes, dropout, kind, options):
    return TinyMLP(num_features, num_classes, dropout)
