"""CREMA-D in its official layout (the real corpus and our synthetic one alike).

Layout: ``<root>/AudioWAV/<actor>_<sentence>_<emotion>_<level>.wav``, e.g. ``1001_DFA_ANG_XX.wav``:
actor 1001..1091, one of 12 sentence codes, emotion ANG DIS FEA HAP NEU SAD, level LO MD HI or XX
(unspecified). One official file, ``1040_ITH_SAD_X.wav``, spells XX as X; ``X`` is accepted as XX.
Any other .wav name that does not parse is an error (it would otherwise be dropped silently).

Task: ANG, HAP, SAD, NEU (labels 0..3 in that order); DIS and FEA clips are left out.
Client = actor. Every actor present is kept: FedAudio's loader loses actors 1001-1009 and 1091 to an
indexing bug; here the actor id is parsed from the file name, never from a position.

Splits are actor-disjoint: actors sorted by id are dealt round-robin into 5 folds (actor i of the
sorted list -> fold i mod 5). Test = fold `data.test_fold` ("0".."4", default "0"); validation = the
next fold (mod 5), used for model selection only; the remaining three folds train.
"""

from __future__ import annotations

import re
from pathlib import Path

from fedac.config import DataConfig
from fedac.data.layout import choose_fold, reject_broken_link, require_dir, shorten
from fedac.data.manifest import Clip, Manifest
from fedac.errors import DatasetError

CLASSES = ["ANG", "HAP", "SAD", "NEU"]
EMOTIONS = ("ANG", "DIS", "FEA", "HAP", "NEU", "SAD")
SENTENCES = ("IEO", "TIE", "IOM", "IWW", "TAI", "MTI", "IWL", "ITH", "DFA", "ITS", "TSI", "WSI")
LEVELS = ("LO", "MD", "HI", "XX", "X")
NUM_FOLDS = 5
FOLDS = [str(k) for k in range(NUM_FOLDS)]
FILENAME = re.compile(
    rf"^(?P<actor>\d{{4}})_(?P<sentence>{'|'.join(SENTENCES)})_(?P<emotion>{'|'.join(EMOTIONS)})"
    rf"_(?P<level>{'|'.join(LEVELS)})\.wav$"
)
SOURCE = (
    "CREMA-D comes from https://github.com/CheyneyComputerScience/CREMA-D (AudioWAV folder, Git "
    "LFS); `fedac data synth-emotions --out DIR` writes a synthetic stand-in in the same layout."
)


def actor_folds(actors: list[str]) -> dict[str, int]:
    """Actor id -> fold, round-robin over the ids in sorted order."""
    return {actor: i % NUM_FOLDS for i, actor in enumerate(sorted(actors))}


def load_manifest(root: str | Path, cfg: DataConfig) -> Manifest:
    root = Path(root)
    require_dir(root, "CREMA-D root", SOURCE)
    folder = require_dir(root / "AudioWAV", "CREMA-D audio folder", SOURCE)
    test = int(choose_fold(cfg.test_fold, "0", FOLDS, "CREMA-D (5 actor folds)"))
    val = (test + 1) % NUM_FOLDS
    files = sorted(
        reject_broken_link(p)
        for p in folder.iterdir()
        if p.suffix.lower() == ".wav" and not p.name.startswith(".")
    )
    if not files:
        raise DatasetError(f"CREMA-D audio folder {folder} holds no .wav files. {SOURCE}")
    parsed, bad = [], []
    for path in files:
        match = FILENAME.match(path.name)
        if match is None:
            bad.append(path.name)
        elif match["emotion"] in CLASSES:
            parsed.append((path, match["actor"], CLASSES.index(match["emotion"])))
    if bad:
        raise DatasetError(
            f"{folder}: file names {shorten(bad)} do not follow CREMA-D's "
            "<actor>_<sentence>_<emotion>_<level>.wav naming (e.g. 1001_DFA_ANG_XX.wav); rename or "
            "remove them"
        )
    if not parsed:
        raise DatasetError(f"{folder} holds no clip of the emotions {', '.join(CLASSES)}")
    fold_of = actor_folds(sorted({actor for _, actor, _ in parsed}))
    clips = []
    for path, actor, label in parsed:
        fold = fold_of[actor]
        split = "test" if fold == test else ("val" if fold == val else "train")
        clips.append(Clip(str(path), label, actor, split))
    return Manifest("cremad", str(root), list(CLASSES), clips)
