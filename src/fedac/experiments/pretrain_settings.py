"""The settings and command line of `fedac pretrain` (the training itself is
experiments/pretrain.py).

Kept apart from experiments/pretrain.py, which loads torch, transformers and the feature pipeline:
building the `fedac` parser must not load them (`fedac --help` starts in well under a second).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass

from fedac.errors import ConfigError
from fedac.models.ssl_sizes import SIZES

OBJECTIVES = ("hubert", "contrastive")


@dataclass
class PretrainSettings:
    model: str = "w2v2_s"
    objective: str = "hubert"
    steps: int = 20000
    batch_size: int = 8
    crop_seconds: float = 2.0
    lr: float = 5e-4
    seed: int = 0
    speakers: int = 60
    """Speakers of the synthetic pretraining corpus."""
    utterances: int = 30
    """Sentences per speaker."""
    clusters: int = 100
    """k-means targets (hubert)."""
    mask_prob: float = 0.65
    mask_length: int = 10
    checkpoint_every: int = 200

    def check(self) -> None:
        if self.model not in SIZES:
            raise ConfigError(
                f"--model {self.model!r} is not an SSL size; choose one of {', '.join(SIZES)}"
            )
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"--objective {self.objective!r}: choose {' or '.join(OBJECTIVES)}")
        if (
            min(
                self.steps,
                self.batch_size,
                self.speakers,
                self.utterances,
                self.clusters,
                self.checkpoint_every,
            )
            < 1
        ):
            raise ConfigError(
                "--steps, --batch-size, --speakers, --utterances, --clusters and "
                "--checkpoint-every must be >= 1"
            )


def settings_from_args(args: argparse.Namespace) -> PretrainSettings:
    """The settings a parsed `fedac pretrain` command line asks for (defaults where it is
    silent)."""
    return PretrainSettings(
        **{
            k: getattr(args, k)
            for k in asdict(PretrainSettings())
            if getattr(args, k, None) is not None
        }
    )


def add_pretrain_parser(sub, func) -> None:
    """`fedac pretrain`; `func` (cli.cmd_pretrain) runs it, so this module never imports the heavy
    trainer."""
    p = sub.add_parser(
        "pretrain",
        help="pretrain a small wav2vec 2.0-style encoder on synthetic speech (HF format)",
    )
    defaults = PretrainSettings()
    for name, value in asdict(defaults).items():
        p.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            type=type(value),
            default=None,
            help=f"default {value}",
        )
    p.add_argument(
        "--out",
        help="output folder (default $FEDAC_HOME/encoders/<model>-<objective>-s<seed>-<steps>)",
    )
    p.add_argument(
        "--stop-after",
        type=int,
        metavar="N",
        help="stop after step N as if killed (testing resume)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: small models run fastest)",
    )
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=func)
