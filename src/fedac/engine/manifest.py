"""The run's manifest, screened for undecodable clips: shared by the MFCC (engine/data.py) and the
waveform (engine/waveform.py) builders, so that neither imports the other's module for it."""

from __future__ import annotations

from fedac.config import Config
from fedac.data.features import screen_manifest
from fedac.data.manifest import Manifest
from fedac.data.registry import load_manifest


def usable_manifest(cfg: Config, progress: bool = True) -> tuple[Manifest, dict[str, str]]:
    """The dataset's manifest and, with data.on_bad_file=skip, without its undecodable clips (see
    features.screen_manifest): path -> reason of the files left out."""
    return screen_manifest(
        load_manifest(cfg, progress), cfg.data.on_bad_file, cfg.data.cache_dir, progress
    )
