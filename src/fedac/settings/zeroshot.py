"""Zero-shot FL's settings (algorithms/zeroshot.py, data/streams.py).

Settings are read and checked before torch loads: this module imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

from fedac.fields import number


@dataclass
class ZeroShotConfig:
    """Zero-shot FL with new classes (algorithms/zeroshot.py, data/streams.py)."""

    scenario: str = "homogeneous"
    """homogeneous (3 users x 10 rounds, Table 1 models) or heterogeneous (10 users x 30 rounds, Table 2)."""
    rounds: int = number(0, ">= 0")
    """Rounds to run; 0: the scenario's own (10 or 30). For --algorithm zeroshot this and train.rounds are one
    setting: load_config takes whichever a config file, flag or --set gives last (else the scenario's) and
    saves the count that runs in both, so a saved config.yaml runs it again (an older config.yaml holding
    train.rounds 50 beside zeroshot.rounds 0 still runs the scenario's rounds)."""
    scale: float = number(0.0, ">= 0")
    """Multiplies every clip count of the scenario (D0 per class, per-round draws, injections); 0: the
    largest scale <= 1 the dataset's training clips allow (the stand-ins hold fewer clips than the paper)."""
    score_rule: str = "normalized"
    """Score tables: normalized (alpha-update and beta-aggregation divide by their weights) or literal
    (Alg. 1's unnormalised sums)."""
    choice2: bool = True
    """Handle reported new classes (Choice 2); false drops unregistered new-class samples on the client."""
    num_new: str = "oracle"
    """Clusters of new labels per round: oracle (the number of truly new classes reported, the paper's
    "number of clusters = number of new labels") or auto (best medoid silhouette over 1..reports)."""
    di_betas: list[float] = number([1.0, 0.1], "> 0")
    """Eq. 2 Dirichlet scales; the impressions of a class are split equally between them."""
    di_tau: float = number(20.0, "> 0")
    """Eq. 3 temperature."""
    di_lr: float = number(0.01, "> 0")
    di_steps: int = number(1500, ">= 1")
    di_batch: int = number(100, ">= 1")
    di_per_class: int = number(0, ">= 0")
    """Impressions per reported new class; 0: D0's clips per class."""
    di_merge: str = "mean"
    """mean (the paper's "Average DI": a group's impressions averaged index by index) or concat."""
    optimizer: str = "adam"
    """Users' local optimizer at train.lr: adam (the paper used TensorFlow without naming one; with SGD
    the softmax-activation CNNs stayed at chance on the Speech Commands stand-in) or sgd (train.momentum)."""
    identity: str = "anonymous"
    """Who knows which reports share a class: anonymous (the server learns it only by clustering the
    impressions) or reported (a report names its new classes: one label per name, the clustering is kept
    as a diagnostic)."""
