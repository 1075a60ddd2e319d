"""Your own labelled clips, no loader to write: ``--dataset audiofolder --set data.root=DIR``.

Layout: ``DIR/<label>/<name>.<ext>`` (label folders may nest sub-folders), any file soundfile reads
(WAV, FLAC, OGG, ...) at any sample rate, mono or stereo: decoding and resampling happen later
(audio.py), this module only lists files. Classes are the sorted label names.

Optional ``DIR/metadata.csv`` (UTF-8, header row) is then the only source of truth: columns ``file``
(path relative to DIR) and ``label`` are required, ``client`` and ``split`` (train, validation or
test) optional, other columns are ignored.

Clients: the ``client`` column is the natural client id. Without one, training clips are dealt at
random over ``data.num_clients`` clients, so the default (natural) partition is IID and
``data.partition=dirichlet`` / ``iid`` still work; left at their defaults, ``data.num_clients`` and
``train.fraction`` are fitted to a small dataset (registry.fit_dealt_clients: one client per 40
training clips, at least 5 clients a round). Splits: the ``split`` column, else a seeded
10% validation / 10% test split, client-disjoint when clients exist, else over clips, announced by a
warning. The corpus's seed is fixed (0): run seeds vary training, never which clips are tested.

Warnings, one each: media files soundfile cannot read (.m4a, .mp4, ...: `MEDIA`), which are left
out; labels that differ only in case (``Yes/`` and ``yes/`` are two classes). Clips longer than
``features.clip_seconds`` are cut into windows by the feature pipeline, which says so
(engine/data.py).
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from pathlib import Path

import soundfile

from fedac.config import DataConfig
from fedac.data.layout import (
    SPLIT_NAMES,
    case_twins,
    csv_rows,
    reject_broken_link,
    shorten,
    user_manifest,
)
from fedac.data.manifest import Manifest
from fedac.errors import DatasetError

log = logging.getLogger(__name__)

METADATA = "metadata.csv"
REQUIRED = ("file", "label")
LAYOUT = (
    f"expected DIR/<label>/<clip>.wav, or DIR/{METADATA} with columns file,label[,client][,split] "
    "(see docs/datasets.md, 'Your own audio')"
)
# File suffixes whose libsndfile format name differs from the suffix itself.
_SUFFIX_FORMAT = {"AIF": "AIFF", "OGA": "OGG", "OPUS": "OGG", "SND": "AU"}
#: Suffixes of audio (or video with sound) files: such a file soundfile cannot read is named in a
#: warning (other files, e.g. notes.txt or cover.jpg, are passed over in silence).
MEDIA = frozenset(
    "3g2 3gp aac ac3 aif aifc aiff alac amr ape asf au avi caf dts flac flv m4a m4b m4p m4v mka "
    "mkv mov mp2 mp3 mp4 mpeg mpg mpga oga ogg opus qt ra rm snd spx tta wav wave webm wma wmv "
    "wv".split()
)


@functools.cache
def _formats() -> frozenset[str]:
    # asks libsndfile each call: ~80 us, per file of a large corpus
    return frozenset(soundfile.available_formats())


def is_audio(path: Path) -> bool:
    suffix = path.suffix[1:].upper()
    return not path.name.startswith(".") and _SUFFIX_FORMAT.get(suffix, suffix) in _formats()


def _visible(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if not p.name.startswith("."))


def scan_folders(root: Path) -> list[tuple[Path, str]]:
    """(file, label) for every audio file under DIR/<label>/, in path order. Media files soundfile
    cannot read (`MEDIA`: .m4a, .mp4, ...) are left out and named in one warning."""
    folders = [p for p in _visible(root) if p.is_dir()]
    if not folders:
        raise DatasetError(f"audiofolder {root} holds no label folders and no {METADATA}; {LAYOUT}")
    rows: list[tuple] = []
    skipped: list = []
    for folder in folders:
        found = sorted(
            p
            for p in folder.rglob("*")
            if (p.is_file() or p.is_symlink())
            and not any(part.startswith(".") for part in p.relative_to(folder).parts)
        )
        files = [reject_broken_link(p) for p in found if is_audio(p)]
        if not files:
            others = [p.name for p in _visible(folder)]
            held = f" (it holds {shorten(others)})" if others else " (it is empty)"
            raise DatasetError(
                f"audiofolder label folder {folder} holds no audio file{held}: add .wav/.flac/.ogg "
                f"clips or remove the folder"
            )
        rows.extend((path, folder.name) for path in files)
        skipped += [p for p in found if not is_audio(p) and p.suffix[1:].lower() in MEDIA]
    if skipped:
        kinds = Counter(p.suffix.lower() for p in skipped)
        log.warning(
            "audiofolder %s: %d file(s) soundfile cannot read are left out (%s): %s; convert them "
            "to WAV or FLAC to use them (e.g. ffmpeg -i clip.m4a clip.wav)",
            root,
            len(skipped),
            ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())),
            shorten([str(p.relative_to(root)) for p in skipped], 3),
        )
    return rows


def read_metadata(root: Path) -> tuple[list[tuple[Path, str, str | None, str | None]], set[str]]:
    """(file, label, client, split) per row of DIR/metadata.csv, checked line by line, and its
    columns."""
    path = root / METADATA
    header, lines = csv_rows(path, REQUIRED, "the header must name file,label[,client][,split]")
    rows: list[tuple] = []
    seen: dict[str, int] = {}
    for where, line, row in lines:
        for column in ("file", "label", "client"):
            if column in row and not row[column]:
                raise DatasetError(
                    f"{where}: the {column} column is empty; fill it in or remove the line"
                )
        split = row["split"].lower() if "split" in row else None
        if split is not None and split not in SPLIT_NAMES:
            raise DatasetError(f"{where}: split {split!r} is not one of train, validation, test")
        if row["file"] in seen:
            raise DatasetError(
                f"{where}: {row['file']} is already listed on line {seen[row['file']]}"
            )
        seen[row["file"]] = line
        audio = root / row["file"]
        if not audio.is_file():
            raise DatasetError(
                f"{where} lists {row['file']}, but {audio} does not exist; "
                "fix the path (relative to the data root) or remove the line"
            )
        rows.append(
            (
                reject_broken_link(audio),
                row["label"],
                row.get("client"),
                None if split is None else SPLIT_NAMES[split],
            )
        )
    if not rows:
        raise DatasetError(f"{path} lists no clips; add one line per clip (file,label)")
    return rows, set(header)


def load_manifest(root: str | Path, cfg: DataConfig) -> Manifest:
    root = Path(root).expanduser().absolute()
    if not root.is_dir():
        raise DatasetError(f"audiofolder data.root {root} is not a folder; {LAYOUT}")
    if (root / METADATA).is_file():
        rows, columns = read_metadata(root)
    else:
        rows, columns = [(path, label, None, None) for path, label in scan_folders(root)], set()
    classes = sorted({label for _, label, _, _ in rows})
    if len(classes) < 2:
        raise DatasetError(
            f"audiofolder {root} has one label ({classes[0]}); classification needs at least two"
        )
    twins = case_twins(classes)
    if twins:
        log.warning(
            "audiofolder %s: labels %s differ only in case and are %s classes; if they are one "
            "word, give them one spelling (rename the label folders, or the labels in %s)",
            root,
            "; ".join(" / ".join(group) for group in twins),
            "separate" if len(twins) > 1 else f"{len(twins[0])}",
            METADATA,
        )
    if "split" in columns:
        absent = [
            s for s in ("train", "val", "test") if s not in {split for _, _, _, split in rows}
        ]
        if absent:
            names = ", ".join("validation" if s == "val" else s for s in absent)
            raise DatasetError(
                f"{root / METADATA}: no clip has split {names}; training needs train, "
                "validation and test clips"
            )
    manifest, notes = user_manifest(
        "audiofolder",
        f"audiofolder {root}",
        str(root),
        classes,
        [(str(path), label, client, split) for path, label, client, split in rows],
        "client" in columns,
        cfg,
        "no split column",
        f"add clips, or give every clip a split (train, validation, test) in {METADATA}",
    )
    if notes:
        log.warning(
            "audiofolder %s: %s; set them in %s (columns split, client)",
            root,
            "; ".join(notes),
            METADATA,
        )
    return manifest
