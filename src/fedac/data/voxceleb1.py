"""VoxCeleb1 (Nagrani et al. 2017) in its official layout -> a speaker-identification Manifest with
the speaker-verification trials attached.

Layout: `<root>/wav/idNNNNN/<video>/NNNNN.wav`, the identification split file `iden_split.txt`
(lines `<1|2|3> idNNNNN/<video>/NNNNN.wav`: 1 train, 2 validation, 3 test) and the verification
trial list `veri_test2.txt` (the cleaned list; `veri_test.txt` is read when it is the only one),
lines `<1|0> <path a> <path b>` (1 = same speaker).

Classes = the speakers of the identification split. Client: `data.partition=iid` over
`data.num_clients` by default (the early-exit paper shuffles SID data IID), or `natural` (speaker).
The trials are scored after training with the SID model's pooled embeddings (cosine; the `asv` extra
test split of engine/waveform.py). On the real corpus the identification split also holds the trial
speakers (the paper's setting); the stand-in keeps them disjoint. A malformed line or a missing file
is a DatasetError naming the file and line.
"""

from __future__ import annotations

from pathlib import Path

from fedac.config import DataConfig
from fedac.data.layout import require_dir, require_file
from fedac.data.manifest import Clip, Manifest
from fedac.errors import DatasetError

SOURCE = (
    "VoxCeleb1 comes from https://www.robots.ox.ac.uk/~vgg/data/voxceleb/vox1.html "
    "(or write a stand-in: `fedac data synth-voxceleb1 --out DIR`)."
)
IDEN_SPLIT = "iden_split.txt"
TRIAL_LISTS = ("veri_test2.txt", "veri_test.txt")
SPLIT_CODES = {"1": "train", "2": "val", "3": "test"}


def _audio(wav: Path, relative: str, where: str) -> Path:
    parts = relative.split("/")
    if len(parts) != 3 or not parts[0].startswith("id") or not relative.endswith(".wav"):
        raise DatasetError(f"{where}: expected a path idNNNNN/<video>/NNNNN.wav, got {relative!r}")
    path = wav / relative
    if not path.is_file():
        raise DatasetError(f"{where}: audio file {path} does not exist. {SOURCE}")
    return path


def read_trials(path: Path, wav: Path) -> list[tuple[str, str, int]]:
    trials = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        where = f"{path}, line {number}"
        if len(parts) != 3 or parts[0] not in ("0", "1"):
            raise DatasetError(f"{where}: expected '<1|0> <path a> <path b>', got {line!r}")
        trials.append(
            (str(_audio(wav, parts[1], where)), str(_audio(wav, parts[2], where)), int(parts[0]))
        )
    return trials


def load_manifest(root: str | Path, cfg: DataConfig | None = None) -> Manifest:
    root = require_dir(Path(root), "VoxCeleb1 root", SOURCE)
    wav = require_dir(root / "wav", "VoxCeleb1 audio", SOURCE)
    split_file = require_file(root / IDEN_SPLIT, "VoxCeleb1 identification split", SOURCE)
    rows = []
    for number, line in enumerate(split_file.read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        where = f"{split_file}, line {number}"
        if len(parts) != 2 or parts[0] not in SPLIT_CODES:
            raise DatasetError(
                f"{where}: expected '<1|2|3> idNNNNN/<video>/NNNNN.wav', got {line!r}"
            )
        rows.append((SPLIT_CODES[parts[0]], parts[1], _audio(wav, parts[1], where)))
    speakers = sorted({relative.split("/")[0] for _, relative, _ in rows})
    label = {s: i for i, s in enumerate(speakers)}
    clips = [
        Clip(
            str(path),
            label[rel.split("/")[0]],
            rel.split("/")[0],
            split,
            group="/".join(rel.split("/")[:2]),
        )
        for split, rel, path in rows
    ]
    trial_file = next((root / name for name in TRIAL_LISTS if (root / name).is_file()), None)
    if trial_file is None:
        raise DatasetError(
            f"VoxCeleb1 root {root} holds no trial list ({' or '.join(TRIAL_LISTS)}). {SOURCE}"
        )
    return Manifest("voxceleb1", str(root), speakers, clips, trials=read_trials(trial_file, wav))
