"""Early-exit fine-tuning's settings (algorithms/earlyexit.py, models/early_exit.py).

Settings are read and checked before torch loads: this module imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

from fedac.fields import number


@dataclass
class EarlyExitConfig:
    """Early-exit federated fine-tuning of SSL encoders (algorithms/earlyexit.py,
    models/early_exit.py). Depths are given on the 12-layer scale of wav2vec 2.0 Base and scaled to
    the encoder's depth (round(d * layers / 12), at least 1), so exits 3,6,9,12 are layers 1,2,3,4
    of w2v2_tiny."""

    exits: list[int] = number([3, 6, 9, 12], "[1, 12]")
    """Layers that carry an independent head."""
    mode: str = "hetero"
    """hetero (a seeded split: `low_fraction` of the clients at `low_depth`, the rest at
    `high_depth`), homo (every client at `depth`) or budget (by memory, see `budgets_mb`)."""
    depth: int = number(12, "[1, 12]")
    """Every client's depth when mode=homo."""
    low_depth: int = number(3, "[1, 12]")
    high_depth: int = number(0, "[0, 12]")
    """Depth of the high-resource clients; 0: the deepest exit."""
    low_fraction: float = number(0.5, "[0, 1]")
    aggregation: str = "depth_weighted"
    """depth_weighted (the paper's Eq. 1: weights n_i * L_i over the clients that trained a layer),
    layerwise (weights n_i) or fedavg (full models, untouched layers returned: the paper's
    baseline)."""
    eval_exit: int = number(0, "[0, 12]")
    """The exit of the shared model that selection and the headline test metrics use; 0: the deepest
    client depth (high_depth when hetero, depth when homo). Every exit is evaluated too
    (val_exit<L>_*, test exit<L>_*)."""
    budgets_mb: list[float] = number([], "> 0")
    """mode=budget: each client draws its memory budget (MB) from this list (seeded, fixed for the
    run) and trains to the deepest exit whose measured training memory (`fedac memory`) fits it."""
    budget_seconds: float = number(1.0, "> 0")
    """mode=budget: clip length of the memory measurement (batch: train.batch_size)."""
    head_lr: float = number(0.0, ">= 0")
    """Learning rate of the exit heads (the paper is silent; a fresh head usually takes a larger
    rate than the pretrained encoder); 0: train.lr, like every other tensor."""
