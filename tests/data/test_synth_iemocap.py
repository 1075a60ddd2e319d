"""Synthetic IEMOCAP (synth/iemocap.py): the official layout, read by the real loader; determinism;
caching."""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from pathlib import Path

import pytest

from fedac.config import DataConfig
from fedac.data import iemocap
from fedac.data.layout import MARKER
from fedac.data.synth import iemocap as synth

SCENARIOS, TURNS = 1, 6
UTTERANCE = re.compile(r"^Ses0(\d)([FM])_(impro\d\d|script\d\d_\d)_([FM])(\d{3})\.wav$")


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("iemocap") / "seed0"
    return root, synth.generate(
        root, scenarios=SCENARIOS, turns=TURNS, seed=0, progress=False, workers=2
    )


def test_layout_and_annotations(tree):
    root, stats = tree
    dialogs = synth.plan_dialogs(SCENARIOS, 0, TURNS)
    assert stats["dialogs"] == len(dialogs) == 5 * (2 * SCENARIOS + 1)
    wavs = sorted(root.glob("Session*/sentences/wav/*/*.wav"))
    assert len(wavs) == stats["files"] == sum(len(d.turns) for d in dialogs)
    for wav in wavs:
        session, lead, _, speaker, _ = UTTERANCE.match(wav.name).groups()
        assert wav.parent.name == wav.name.rsplit("_", 1)[0]  # the dialog folder
        assert wav.parts[-5] == f"Session{session}"
    for dialog in dialogs:
        # The loader's own parser reads every turn back, in order, with its label.
        text = root / f"Session{dialog.session}" / "dialog" / "EmoEvaluation" / f"{dialog.name}.txt"
        parsed = iemocap.parse_evaluation(text)
        assert [(u, lab) for u, lab, _ in parsed] == [(t.utterance, t.label) for t in dialog.turns]
        assert {t.speaker for t in dialog.turns} == {"F", "M"} or len(dialog.turns) < 3


def test_real_loader_reads_the_stand_in(tree):
    root, stats = tree
    manifest = iemocap.load_manifest(root, DataConfig())
    assert len(manifest.clips) == stats["kept_files"]
    # Scripted dialogs are left out; fru / sur / oth / xxx turns are dropped; exc counts as hap.
    assert not any("script" in c.path for c in manifest.clips)
    improvised = [
        t for d in synth.plan_dialogs(SCENARIOS, 0, TURNS) if "impro" in d.name for t in d.turns
    ]
    assert Counter(manifest.classes[c.label] for c in manifest.clips) == Counter(
        "hap" if t.label == "exc" else t.label for t in improvised if t.label in iemocap.LABEL_MAP
    )
    by_split = {
        split: {c.client for c in manifest.clips if c.split == split}
        for split in ("train", "val", "test")
    }
    assert by_split["test"] == {"Ses05F", "Ses05M"}  # leave-one-session-out, default session 5
    assert by_split["train"] == {f"Ses0{s}{g}" for s in range(1, 5) for g in "FM"}


def test_deterministic_and_cached(tree, tmp_path):
    root, stats = tree
    again = synth.generate(
        tmp_path / "again", scenarios=SCENARIOS, turns=TURNS, seed=0, progress=False, workers=1
    )

    def digest(base: Path) -> dict[str, str]:
        return {
            str(p.relative_to(base)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(base.rglob("*"))
            if p.is_file() and p.name != MARKER
        }

    assert digest(tmp_path / "again") == digest(root)  # workers do not change a byte
    assert again["files"] == stats["files"]
    assert (
        synth.generate(root, scenarios=SCENARIOS, turns=TURNS, seed=0, progress=False)["cached"]
        is True
    )
    other = synth.plan_dialogs(SCENARIOS, 1, TURNS)
    assert [t.label for d in other for t in d.turns] != [
        t.label for d in synth.plan_dialogs(SCENARIOS, 0, TURNS) for t in d.turns
    ]


def test_refuses_foreign_data_and_bad_sizes(tmp_path):
    (tmp_path / "Session1").mkdir()
    with pytest.raises(FileExistsError, match="Session1"):
        synth.generate(tmp_path, scenarios=1, turns=2, progress=False)
    with pytest.raises(ValueError, match="scenario"):
        synth.generate(tmp_path / "new", scenarios=0, progress=False)
