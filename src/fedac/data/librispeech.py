"""LibriSpeech (Panayotov et al. 2015) in its official layout -> a CTC speech-recognition Manifest.

Layout: `<root>/<subset>/<speaker>/<chapter>/<speaker>-<chapter>-<utt>.flac` with one
`<speaker>-<chapter>.trans.txt` per chapter folder, each line `<speaker>-<chapter>-<utt> TRANSCRIPT`
(upper case). `root` may also be the folder holding `LibriSpeech/`.

Splits: train = every `train-*` subset present (train-clean-100, -360, train-other-500), val =
dev-clean, test = test-clean, and test_other = test-other (an extra test split, reported as
`test_other_wer`). Client = speaker (the early-exit paper's partition). Transcripts are normalised
to lower case; a character outside `data.text.VOCAB`, a line without an utterance id or text, an id
of another chapter, or a listed utterance without its audio file is a DatasetError naming the file
and line. Audio files not listed in their chapter's transcript are ignored (as LibriSpeech's own
tools do).
"""

from __future__ import annotations

import re
from pathlib import Path

from fedac.config import DataConfig
from fedac.data.layout import require_dir
from fedac.data.manifest import Clip, Manifest
from fedac.data.text import VOCAB, normalize_transcript, unknown_characters
from fedac.errors import DatasetError

SOURCE = (
    "LibriSpeech comes from https://www.openslr.org/12 (or write a stand-in: `fedac data "
    "synth-librispeech --out DIR`)."
)
SUBSETS = {"dev-clean": "val", "test-clean": "test", "test-other": "test_other"}
_UTTERANCE = re.compile(r"^(\d+)-(\d+)-(\d+)$")


def read_transcripts(path: Path) -> dict[str, str]:
    """One chapter's `.trans.txt`: utterance id -> normalised transcript."""
    speaker, chapter = path.name[: -len(".trans.txt")].split("-", 1)
    out: dict[str, str] = {}
    for number, line in enumerate(
        path.read_text(encoding="utf-8", errors="replace").splitlines(), 1
    ):
        if not line.strip():
            continue
        parts = line.strip().split(" ", 1)
        where = f"{path}, line {number}"
        match = _UTTERANCE.match(parts[0])
        if len(parts) < 2 or not parts[1].strip() or match is None:
            raise DatasetError(
                f"{where}: expected '<speaker>-<chapter>-<utt> TRANSCRIPT', got {line!r}. {SOURCE}"
            )
        if match.group(1) != speaker or match.group(2) != chapter:
            raise DatasetError(
                f"{where}: utterance {parts[0]} does not belong to chapter {speaker}-{chapter}"
            )
        bad = unknown_characters(parts[1])
        if bad:
            raise DatasetError(
                f"{where}: characters {''.join(sorted(bad))!r} are outside the CTC vocabulary "
                f"(letters, apostrophe, space). Fix or remove the line."
            )
        out[parts[0]] = normalize_transcript(parts[1])
    return out


def _subset_clips(folder: Path, split: str) -> list[Clip]:
    clips = []
    for trans in sorted(folder.glob("*/*/*.trans.txt")):
        for utt, text in read_transcripts(trans).items():
            audio = trans.parent / f"{utt}.flac"
            if not audio.is_file():
                raise DatasetError(f"{trans} lists {utt} but {audio} does not exist. {SOURCE}")
            clips.append(Clip(str(audio), 0, utt.split("-")[0], split, group=trans.name, text=text))
    return clips


def load_manifest(root: str | Path, cfg: DataConfig | None = None) -> Manifest:
    root = require_dir(Path(root), "LibriSpeech root", SOURCE)
    if (root / "LibriSpeech").is_dir():
        root = root / "LibriSpeech"
    train = sorted(p for p in root.glob("train-*") if p.is_dir())
    if not train:
        raise DatasetError(
            f"LibriSpeech root {root} holds no train-* subset (e.g. train-clean-100). {SOURCE}"
        )
    clips: list[Clip] = []
    for folder in train:
        clips += _subset_clips(folder, "train")
    for subset, split in SUBSETS.items():
        folder = root / subset
        if split != "test_other":
            require_dir(folder, f"LibriSpeech {subset}", SOURCE)
        if folder.is_dir():
            clips += _subset_clips(folder, split)
    return Manifest("librispeech", str(root), list(VOCAB), clips, kind="ctc")
