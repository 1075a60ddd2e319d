"""UrbanSound8K in its official layout (the real corpus and our synthetic one alike).

Layout: ``<root>/audio/fold1..fold10/<fsID>-<classID>-<occurrence>-<slice>.wav`` and
``<root>/metadata/UrbanSound8K.csv`` with columns slice_file_name, fsID, start, end, salience, fold,
classID, class. Each slice (at most 4 s) is cut from a Freesound recording (fsID); all slices of
one recording lie in one fold, so folds are the official, leakage-free splits.

Splits: test = fold `data.test_fold` (default 10, as in the fold-10 convention); validation = the
fold before it (9 for the default; fold 10 when fold 1 is the test fold), used for model selection
only; the other eight folds train. Every clip's client and group is its source recording
(``fs<fsID>``), so the protocol's grouped Dirichlet partition keeps a recording on one client.
"""

from __future__ import annotations

from pathlib import Path

from fedac.config import DataConfig
from fedac.data.layout import choose_fold, csv_rows, require_dir, require_file
from fedac.data.manifest import Clip, Manifest
from fedac.errors import DatasetError

CLASSES = [
    "air_conditioner",
    "car_horn",
    "children_playing",
    "dog_bark",
    "drilling",
    "engine_idling",
    "gun_shot",
    "jackhammer",
    "siren",
    "street_music",
]  # index = classID
FOLDS = [str(k) for k in range(1, 11)]
COLUMNS = ("slice_file_name", "fsID", "start", "end", "salience", "fold", "classID", "class")
METADATA = Path("metadata") / "UrbanSound8K.csv"
SOURCE = (
    "UrbanSound8K comes from https://urbansounddataset.weebly.com/urbansound8k.html "
    "(archive also on Zenodo, record 1203745); `fedac data synth-urban --out DIR` writes a "
    "synthetic stand-in in the same layout."
)


def validation_fold(test_fold: str) -> str:
    """The fold before the test fold, wrapping 1 -> 10."""
    return FOLDS[FOLDS.index(test_fold) - 1]


def _int_field(row: dict, name: str, where: str) -> int:
    try:
        return int(row[name])
    except ValueError:
        raise DatasetError(
            f"{where}: column {name} must be an integer, got {row[name]!r}"
        ) from None


def read_metadata(root: Path) -> list[dict]:
    """Rows of UrbanSound8K.csv as dicts with int fsID/fold/classID, checked line by line."""
    path = require_file(root / METADATA, "UrbanSound8K metadata", SOURCE)
    _, lines = csv_rows(path, COLUMNS, f"expected {','.join(COLUMNS)}")
    rows: list[dict] = []
    seen: dict[str, int] = {}
    for where, line, row in lines:
        for name in ("fsID", "fold", "classID"):
            row[name] = _int_field(row, name, where)
        if str(row["fold"]) not in FOLDS:
            raise DatasetError(f"{where}: fold {row['fold']} is not one of 1..10")
        if not 0 <= row["classID"] < len(CLASSES):
            raise DatasetError(f"{where}: classID {row['classID']} is not one of 0..9")
        if row["class"] != CLASSES[row["classID"]]:
            raise DatasetError(
                f"{where}: classID {row['classID']} is '{CLASSES[row['classID']]}', but the class "
                f"column says '{row['class']}'"
            )
        name = row["slice_file_name"]
        if name in seen:
            raise DatasetError(f"{where}: {name} is already listed on line {seen[name]}")
        seen[name] = line
        audio = root / "audio" / f"fold{row['fold']}" / name
        if not audio.is_file():
            raise DatasetError(f"{where} lists {name}, but {audio} does not exist")
        row["path"], row["line"] = str(audio), line
        rows.append(row)
    if not rows:
        raise DatasetError(f"{path} lists no slices. {SOURCE}")
    return rows


def load_manifest(root: str | Path, cfg: DataConfig) -> Manifest:
    root = Path(root)
    require_dir(root, "UrbanSound8K root", SOURCE)
    require_dir(root / "audio", "UrbanSound8K audio folder (audio/fold1..fold10)", SOURCE)
    test = choose_fold(cfg.test_fold, "10", FOLDS, "UrbanSound8K")
    val = validation_fold(test)
    clips = []
    for row in read_metadata(root):
        fold = str(row["fold"])
        split = "test" if fold == test else ("val" if fold == val else "train")
        source = f"fs{row['fsID']}"
        clips.append(Clip(row["path"], row["classID"], source, split, group=source))
    return Manifest("urbansound8k", str(root), list(CLASSES), clips)
