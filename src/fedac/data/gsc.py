"""Google Speech Commands v0.02 in its official layout (the real corpus and our synthetic one
alike).

Layout: ``<root>/<word>/<speaker>_nohash_<n>.wav``, ``validation_list.txt``, ``testing_list.txt``
(paths relative to root), ``_background_noise_/*.wav``. A clip is in val or test if listed there,
otherwise in train. Client = speaker id, the filename prefix before ``_nohash_``.

Tasks: "35" (all words) and "12" (yes no up down left right on off stop go, ``_silence_`` and
``_unknown_``). ``_silence_`` clips are 1 s slices of the background-noise files; each slice goes to
train/val/test by a stable hash (80/10/10), and a training slice is given to a training speaker by
the same hash, so silence is spread over clients instead of forming one artificial client.
``_unknown_`` keeps every clip of the other 25 words (no down-sampling; the class imbalance is
reported by `fedac data stats`). ``data.gsc12=fedkws`` builds FedKWS-UI's 12 classes instead
(`_fedkws_twelve`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import replace
from pathlib import Path

import soundfile as sf

from fedac.config import DataConfig
from fedac.data.layout import read_text, reject_broken_link
from fedac.data.manifest import Clip, Manifest
from fedac.errors import DatasetError

WORDS_35 = (
    "backward bed bird cat dog down eight five follow forward four go happy house learn left "
    "marvin nine no off on one right seven sheila six stop three tree two up visual wow yes zero"
).split()
WORDS_10 = "yes no up down left right on off stop go".split()
SILENCE, UNKNOWN = "_silence_", "_unknown_"
BACKGROUND_DIR = "_background_noise_"
FILENAME = re.compile(r"^(?P<speaker>[0-9a-zA-Z]+)_nohash_(?P<n>\d+)\.wav$")
SOURCE = (
    "Google Speech Commands v0.02: http://download.tensorflow.org/data/speech_commands_v0.02.tar.gz"
)


def _stable_fraction(text: str) -> float:
    return int.from_bytes(hashlib.sha1(text.encode()).digest()[:8], "big") / 2**64


def _read_list(root: Path, name: str) -> set[str]:
    path = root / name
    if not path.is_file():
        raise DatasetError(
            f"Speech Commands list file {path} is missing: the official archive ships it at the "
            f"dataset root ({SOURCE}). Point data.root at the folder that holds it."
        )
    entries = {line.strip() for line in read_text(path).splitlines() if line.strip()}
    for entry in sorted(entries):
        if not (root / entry).is_file():
            raise DatasetError(f"{path} lists '{entry}', but {root / entry} does not exist")
    return entries


def _silence_clips(root: Path, train_speakers: list[str], label: int) -> list[Clip]:
    folder = root / BACKGROUND_DIR
    files = sorted(folder.glob("*.wav")) if folder.is_dir() else []
    if not files:
        raise DatasetError(
            f"the 12-class task needs background noise in {folder}, found no .wav files"
        )
    clips = []
    for path in files:
        try:
            info = sf.info(str(path))
        except RuntimeError as exc:
            raise DatasetError(f"cannot read background noise file {path}: {exc}") from None
        for second in range(int(info.frames // info.samplerate)):
            key = f"{path.name}:{second}"
            u = _stable_fraction(key)
            split = "train" if u < 0.8 else ("val" if u < 0.9 else "test")
            client = (
                train_speakers[int(_stable_fraction("client:" + key) * len(train_speakers))]
                if split == "train"
                else "background"
            )
            clips.append(
                Clip(str(path), label, client, split, group=key, offset=float(second), duration=1.0)
            )
    return clips


def _fedkws_twelve(clips: list[Clip], index: dict[str, int]) -> list[Clip]:
    """FedKWS-UI's 12-class task (its speech_commands_data.py): per split, the ten words' clips,
    plus 10% of their count drawn from the other words' clips as _unknown_ and another 10% of them
    with a zeroed waveform (`duration=0`) as _silence_; both keep the source clip's speaker. The
    draw is a stable hash of the file path (no run seed), like the silence split of fedac's
    construction."""
    words = [c for c in clips if c.label != index[UNKNOWN]]
    chosen = list(words)
    for split in ("train", "val", "test"):
        k = round(0.1 * sum(c.split == split for c in words))
        others = sorted(
            (c for c in clips if c.label == index[UNKNOWN] and c.split == split),
            key=lambda c: _stable_fraction(
                "fedkws-negatives:" + Path(c.path).parent.name + "/" + Path(c.path).name
            ),
        )
        chosen += others[:k] + [
            replace(c, label=index[SILENCE], duration=0.0) for c in others[k : 2 * k]
        ]
    return chosen


def load_manifest(root: str | Path, cfg: DataConfig) -> Manifest:
    root = Path(root)
    if not root.is_dir():
        raise DatasetError(f"Speech Commands root {root} does not exist ({SOURCE})")
    if cfg.task not in ("35", "12"):
        raise DatasetError(f"data.task must be '35' or '12' for speech_commands, got {cfg.task!r}")
    missing = [w for w in WORDS_35 if not (root / w).is_dir()]
    if missing:
        raise DatasetError(
            f"{root} is not a Speech Commands v0.02 root: word folders {missing[:5]}"
            f"{' ...' if len(missing) > 5 else ''} are missing ({SOURCE})"
        )
    val, test = _read_list(root, "validation_list.txt"), _read_list(root, "testing_list.txt")
    classes = WORDS_35 if cfg.task == "35" else WORDS_10 + [SILENCE, UNKNOWN]
    index = {name: i for i, name in enumerate(classes)}
    clips = []
    for word in WORDS_35:
        files = sorted((root / word).glob("*.wav"))
        if not files:
            raise DatasetError(
                f"word folder {root / word} holds no .wav files; re-extract the dataset"
            )
        label = index[word] if word in index else index[UNKNOWN]
        for path in files:
            reject_broken_link(path)
            match = FILENAME.match(path.name)
            if match is None:
                raise DatasetError(
                    f"{path} does not follow the '<speaker>_nohash_<n>.wav' naming of Speech "
                    "Commands"
                )
            rel = f"{word}/{path.name}"
            split = "val" if rel in val else ("test" if rel in test else "train")
            clips.append(
                Clip(str(path), label, match["speaker"], split, group=f"{match['speaker']}:{word}")
            )
    if cfg.task == "12" and cfg.gsc12 == "fedkws":
        clips = _fedkws_twelve(clips, index)
    elif cfg.task == "12":
        if cfg.gsc12 != "fedac":
            raise DatasetError(f"data.gsc12 must be fedac or fedkws, got {cfg.gsc12!r}")
        speakers = sorted({c.client for c in clips if c.split == "train"})
        clips.extend(_silence_clips(root, speakers, index[SILENCE]))
    return Manifest(f"speech_commands-{cfg.task}", str(root), list(classes), clips)
