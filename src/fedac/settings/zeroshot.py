"""Zero-shot FL's settings (algorithms/zeroshot.py, data/streams.py).

Settings are read and checked before torch loads: this module imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

from fedac.errors import ConfigError
from fedac.fields import number


@dataclass
class ZeroShotConfig:
    """Zero-shot FL with new classes (algorithms/zeroshot.py, data/streams.py)."""

    scenario: str = "homogeneous"
    """homogeneous (3 users x 10 rounds, Table 1 models) or heterogeneous (10 users x 30 rounds,
    Table 2)."""
    rounds: int = number(0, ">= 0")
    """Rounds to run; 0: the scenario's own (10 or 30). For --algorithm zeroshot this and
    train.rounds are one setting: load_config takes whichever a config file, flag or --set gives
    last (else the scenario's) and saves the count that runs in both, so a saved config.yaml runs it
    again (an older config.yaml holding train.rounds 50 beside zeroshot.rounds 0 still runs the
    scenario's rounds)."""
    scale: float = number(0.0, ">= 0")
    """Multiplies every clip count of the scenario (D0 per class, per-round draws, injections); 0:
    the largest scale <= 1 the dataset's training clips allow (the stand-ins hold fewer clips than
    the paper)."""
    score_rule: str = "normalized"
    """Score tables: normalized (alpha-update and beta-aggregation divide by their weights) or
    literal (Alg. 1's unnormalised sums)."""
    choice2: bool = True
    """Handle reported new classes (Choice 2); false drops unregistered new-class samples on the
    client."""
    num_new: str = "oracle"
    """Clusters of new labels per round: oracle (the number of truly new classes reported, the
    paper's "number of clusters = number of new labels") or auto (best medoid silhouette over
    1..reports)."""
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
    """Users' local optimizer at train.lr: adam (the paper used TensorFlow without naming one; with
    SGD the softmax-activation CNNs stayed at chance on the Speech Commands stand-in) or sgd
    (train.momentum)."""
    identity: str = "anonymous"
    """Who knows which reports share a class: anonymous (the server learns it only by clustering the
    impressions) or reported (a report names its new classes: one label per name, the clustering is
    kept as a diagnostic)."""


#: The zero-shot paper's features (10 MFCC, 50 ms windows and hop: 10 x 21 per 1 s) and local
#: schedule (10 epochs, batch 32; zeroshot.optimizer=adam at lr 0.01), evaluated every round: its
#: run defaults.
RUN_DEFAULTS = {
    "features.n_mfcc": 10,
    "features.win_ms": 50.0,
    "features.hop_ms": 50.0,
    "train.local_epochs": 10,
    "train.batch_size": 32,
    "train.lr": 0.01,
    "train.eval_every": 1,
    "train.checkpoint_every": 1,
    "train.select": "last",
}

#: The paper's round count of each scenario (Tables 3 and 4): what a zero-shot run trains unless
#: train.rounds or zeroshot.rounds is given (`finish` resolves it into train.rounds).
SCENARIO_ROUNDS = {"homogeneous": 10, "heterogeneous": 30}


def scenario_rounds(name: str) -> int:
    if name not in SCENARIO_ROUNDS:
        raise ConfigError(f"zeroshot.scenario must be {' or '.join(SCENARIO_ROUNDS)}, got {name!r}")
    return SCENARIO_ROUNDS[name]


def finish(cfg, given: dict[str, int]) -> None:
    """Zero-shot runs as many rounds as train.rounds or zeroshot.rounds (not 0) says, whichever the
    later layer gives, else the scenario's; the count is written back to both so the saved
    config.yaml repeats it. A config.yaml saved before zero-shot read train.rounds holds the unused
    global default there (50) beside zeroshot.rounds 0 ("the scenario's"), both from the file (layer
    0): it keeps meaning the scenario's rounds."""
    zs = cfg.zeroshot
    if given.get("train.rounds") == 0 and given.get("zeroshot.rounds") == 0 and zs.rounds == 0:
        given = {k: v for k, v in given.items() if k != "train.rounds"}
    asked = {
        key: value
        for key, value in (("train.rounds", cfg.train.rounds), ("zeroshot.rounds", zs.rounds))
        if key in given and value
    }
    if not asked:
        rounds = scenario_rounds(zs.scenario)
    else:
        last = max(given[key] for key in asked)
        counts = {value for key, value in asked.items() if given[key] == last}
        if len(counts) > 1:
            where = "one config file" if last == 0 else "the flags"
            raise ConfigError(
                f"train.rounds={cfg.train.rounds} and zeroshot.rounds={zs.rounds} disagree in "
                f"{where}; for --algorithm zeroshot they are one setting: keep one or make them "
                "equal"
            )
        rounds = counts.pop()
    cfg.train.rounds = zs.rounds = rounds
