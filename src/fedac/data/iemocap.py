"""IEMOCAP (audio only) in its official layout.

Layout (release 1.0):
``<root>/Session1..5/sentences/wav/<dialog>/<utterance>.wav`` and one annotation file per dialog,
``<root>/Session<n>/dialog/EmoEvaluation/<dialog>.txt``, whose summary lines read
``[6.2901 - 8.2357]<TAB>Ses01F_impro01_F000<TAB>neu<TAB>[2.5000, 2.5000, 2.5000]`` (start - end,
utterance, consensus label, valence/activation/dominance). Annotator lines (``C-E2: ...``,
``A-E3: ...``), comments (``%``) and blank lines are skipped; a line that starts with ``[`` or names
an utterance id but does not parse is an error naming the file and line. Hidden files (``.*``,
e.g. macOS ``._`` forks) are ignored.

Task: improvised dialogs only (name contains ``impro``); classes neu, hap, sad, ang with ``exc``
(excited) merged into hap, the common 4-class setup; fru, sur, fea, dis, oth and xxx (no
agreement) are left out. Client = speaker: session + the gender letter that starts the utterance
id's last part (``Ses01F_impro01_M003`` is spoken by Ses01M), so 10 clients.

Splits: leave-one-session-out. Test = session `data.test_fold` ("1".."5", default "5"). Validation
= one improvised dialog of each remaining session (the one with the smallest SHA-1 of its name, a
fixed choice independent of the run seed), so all 8 training speakers stay clients and validation
never shares a recording with training; it is used for model selection only.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from fedac.config import DataConfig
from fedac.data.layout import choose_fold, require_dir
from fedac.data.manifest import Clip, Manifest
from fedac.errors import DatasetError

CLASSES = ["neu", "hap", "sad", "ang"]
LABEL_MAP = {"neu": 0, "hap": 1, "exc": 1, "sad": 2, "ang": 3}
OTHER_LABELS = frozenset({"fru", "sur", "fea", "dis", "oth", "xxx"})
SESSIONS = [str(k) for k in range(1, 6)]
SUMMARY = re.compile(
    r"^\[\s*(?P<start>\d+(?:\.\d+)?)\s*-\s*(?P<end>\d+(?:\.\d+)?)\s*\]\s+(?P<utt>\S+)\s+(?P<label>[a-z]{3})\s+\[[^\]]*\]\s*$"
)
UTTERANCE_ID = re.compile(r"Ses\d\d[FM]_")
SOURCE = (
    "IEMOCAP is released on request by USC SAIL: https://sail.usc.edu/iemocap/; "
    "`fedac data synth-iemocap --out DIR` writes a synthetic stand-in in this layout."
)


def speaker_of(utterance: str) -> str:
    """'Ses01F_impro01_M003' -> 'Ses01M': the session plus the gender letter of the utterance's
    speaker."""
    return utterance[:5] + utterance.rsplit("_", 1)[-1][0]


def parse_evaluation(path: Path) -> list[tuple[str, str, int]]:
    """(utterance id, label, line number) for every summary line of one EmoEvaluation file."""
    dialog = path.stem
    entries = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        text = line.strip()
        if not (text.startswith("[") or UTTERANCE_ID.search(text)):
            continue
        match = SUMMARY.match(text)
        where = f"{path} line {number}"
        if match is None:
            raise DatasetError(
                f"{where}: {text[:80]!r} is not an utterance line '[start - "
                "end]<TAB>utterance<TAB>label<TAB>[v, a, d]'"
            )
        utt, label = match["utt"], match["label"]
        if not utt.startswith(dialog + "_") or utt.rsplit("_", 1)[-1][:1] not in ("F", "M"):
            raise DatasetError(
                f"{where}: utterance {utt} does not belong to dialog {dialog} (expected "
                f"{dialog}_F000 style ids)"
            )
        if label not in LABEL_MAP and label not in OTHER_LABELS:
            raise DatasetError(f"{where}: unknown emotion label {label!r} for {utt}")
        entries.append((utt, label, number))
    return entries


def _validation_dialog(dialogs: list[str]) -> str:
    return min(dialogs, key=lambda name: hashlib.sha1(name.encode()).hexdigest())


def load_manifest(root: str | Path, cfg: DataConfig) -> Manifest:
    root = Path(root)
    require_dir(root, "IEMOCAP root", SOURCE)
    missing = [f"Session{s}" for s in SESSIONS if not (root / f"Session{s}").is_dir()]
    if missing:
        raise DatasetError(
            f"IEMOCAP root {root} lacks {', '.join(missing)} (expected Session1..Session5). "
            f"{SOURCE}"
        )
    test = choose_fold(cfg.test_fold, "5", SESSIONS, "IEMOCAP (sessions)")
    clips = []
    for session in SESSIONS:
        base = root / f"Session{session}"
        evaluations = require_dir(
            base / "dialog" / "EmoEvaluation", f"IEMOCAP Session{session} annotations", SOURCE
        )
        files = sorted(
            p for p in evaluations.glob("*.txt") if "impro" in p.stem and not p.name.startswith(".")
        )
        if not files:
            raise DatasetError(
                f"{evaluations} holds no improvised-dialog annotation (*impro*.txt). {SOURCE}"
            )
        val_dialog = None if session == test else _validation_dialog([p.stem for p in files])
        seen: dict[str, str] = {}
        for path in files:
            split = "test" if session == test else ("val" if path.stem == val_dialog else "train")
            for utt, label, number in parse_evaluation(path):
                if utt in seen:
                    raise DatasetError(
                        f"{path} line {number}: {utt} is already labelled in {seen[utt]}"
                    )
                seen[utt] = f"{path} line {number}"
                if label not in LABEL_MAP:
                    continue
                wav = base / "sentences" / "wav" / path.stem / f"{utt}.wav"
                if not wav.is_file():
                    raise DatasetError(
                        f"{path} line {number} labels {utt}, but {wav} does not exist"
                    )
                clips.append(
                    Clip(str(wav), LABEL_MAP[label], speaker_of(utt), split, group=path.stem)
                )
    return Manifest("iemocap", str(root), list(CLASSES), clips)
