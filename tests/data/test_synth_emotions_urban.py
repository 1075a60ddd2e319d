"""Synthetic CREMA-D (emotions.py) and UrbanSound8K (urban.py): layouts, determinism, caching,
learnability."""

from __future__ import annotations

import csv
import hashlib
import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from fedac.config import DataConfig
from fedac.data import cremad, urbansound8k
from fedac.data.layout import IN_PROGRESS, MARKER
from fedac.data.synth import emotions, urban
from helpers import no_generation

ACTORS = 3
RECORDINGS = 20
CREMA_NAME = re.compile(r"^(\d{4})_([A-Z]{3})_([A-Z]{3})_(LO|MD|HI|XX)\.wav$")
US8K_NAME = re.compile(r"^(\d+)-(\d)-(\d+)-(\d+)\.wav$")


def digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha1(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*.wav"))
    }


@pytest.fixture(scope="module")
def crema(tmp_path_factory):
    root = tmp_path_factory.mktemp("crema") / "seed0"
    return root, emotions.generate(root, actors=ACTORS, seed=0, progress=False, workers=2)


@pytest.fixture(scope="module")
def us8k(tmp_path_factory):
    root = tmp_path_factory.mktemp("us8k") / "seed0"
    return root, urban.generate(root, recordings=RECORDINGS, seed=0, progress=False, workers=2)


# --------------------------------------------------------------------------- CREMA-D stand-in


@pytest.mark.slow
def test_crema_layout(crema):
    root, stats = crema
    files = sorted(p.name for p in (root / "AudioWAV").iterdir())
    assert all(CREMA_NAME.match(f) for f in files)
    per_actor = defaultdict(list)
    for f in files:
        actor, sentence, emotion, level = CREMA_NAME.match(f).groups()
        assert sentence in emotions.SENTENCES
        per_actor[actor].append((sentence, emotion, level))
    assert sorted(per_actor) == ["1001", "1002", "1003"]
    for entries in per_actor.values():
        assert len(entries) == 56
        assert sum(e in emotions.EMOTIONS for _, e, _ in entries) == 54
        assert {e for _, e, _ in entries} == {"ANG", "HAP", "SAD", "NEU", "DIS", "FEA"}
        ieo = {(e, lv) for s, e, lv in entries if s == "IEO"}
        assert ieo >= {
            ("NEU", "XX"),
            ("ANG", "LO"),
            ("ANG", "MD"),
            ("ANG", "HI"),
            ("SAD", "HI"),
            ("HAP", "LO"),
        }
    assert stats["files"] == 3 * 56 and stats["kept_files"] == 3 * 54 and stats["cached"] is False
    for f in files[::17]:
        info = sf.info(str(root / "AudioWAV" / f))
        assert (info.samplerate, info.channels, info.subtype) == (16000, 1, "PCM_16")
        assert 1.0 <= info.duration <= 3.8
    marker = json.loads((root / MARKER).read_text())
    assert marker["seed"] == 0 and marker["actors"] == ACTORS and not (root / IN_PROGRESS).exists()
    assert "SYNTHETIC" in (root / "SYNTHETIC.txt").read_text()


def test_crema_loader_reads_stand_in(crema):
    root, _ = crema
    m = cremad.load_manifest(root, DataConfig())
    assert len(m.clips) == 3 * 54
    assert {c.client: c.split for c in m.clips} == {"1001": "test", "1002": "val", "1003": "train"}


@pytest.mark.slow
def test_crema_deterministic_across_workers_and_seeds(crema, tmp_path):
    root, _ = crema
    again = emotions.generate(tmp_path / "w1", actors=ACTORS, seed=0, progress=False, workers=1)
    assert again["files"] == 3 * 56
    assert digests(tmp_path / "w1") == digests(root)
    emotions.generate(tmp_path / "s1", actors=1, seed=1, progress=False, workers=1)
    # Another seed: other actors, so no file content repeats.
    assert set(digests(tmp_path / "s1").values()).isdisjoint(digests(root).values())


def test_crema_marker_reuse_and_foreign_folder(crema, tmp_path):
    root, _ = crema
    before = {p: p.stat().st_mtime_ns for p in (root / "AudioWAV").iterdir()}
    with no_generation():
        stats = emotions.generate(root, actors=ACTORS, seed=0, progress=False)
    assert stats["cached"] is True
    assert {p: p.stat().st_mtime_ns for p in (root / "AudioWAV").iterdir()} == before
    foreign = tmp_path / "real"
    (foreign / "AudioWAV").mkdir(parents=True)
    (foreign / "AudioWAV" / "1001_DFA_ANG_XX.wav").write_bytes(b"mine")
    with pytest.raises(FileExistsError, match="AudioWAV that fedac did not generate"):
        emotions.generate(foreign, actors=1, progress=False)
    assert (foreign / "AudioWAV" / "1001_DFA_ANG_XX.wav").read_bytes() == b"mine"
    with pytest.raises(ValueError, match="at least one actor"):
        emotions.generate(tmp_path / "none", actors=0, progress=False)


def _f0(x: np.ndarray, rate: int = 16000) -> float:
    """Median autocorrelation pitch (66-500 Hz) over the loud 40 ms frames."""
    n = 640
    frames = x[: len(x) // n * n].reshape(-1, n)
    energy = (frames**2).mean(axis=1)
    pitches = []
    for frame in frames[energy > 0.3 * energy.max()]:
        frame = frame - frame.mean()
        ac = np.correlate(frame, frame, "full")[n - 1 :]
        pitches.append(rate / (32 + np.argmax(ac[32:242])))
    return float(np.median(pitches))


def test_crema_emotions_differ_in_pitch_and_energy_but_overlap(crema):
    root, _ = crema
    level, pitch = defaultdict(list), defaultdict(list)
    for path in (root / "AudioWAV").glob("*.wav"):
        emotion = path.stem.split("_")[2]
        if emotion in emotions.EMOTIONS:
            x, _ = sf.read(path)
            level[emotion].append(10 * np.log10(np.mean(x**2)))
            pitch[emotion].append(_f0(x))
    mean = {e: (np.mean(level[e]), np.mean(pitch[e])) for e in emotions.EMOTIONS}
    assert mean["ANG"][0] > mean["NEU"][0] + 2 > mean["SAD"][0] + 4  # loudness, dB
    assert mean["HAP"][1] > mean["NEU"][1] * 1.1 > mean["SAD"][1] * 1.2  # pitch, Hz
    # Not trivial: no single cue separates the classes.
    assert min(level["ANG"]) < max(level["SAD"])
    assert min(pitch["HAP"]) < max(pitch["NEU"])


# --------------------------------------------------------------------------- UrbanSound8K stand-in


def read_rows(root: Path) -> tuple[list[str], list[dict]]:
    with (root / "metadata" / "UrbanSound8K.csv").open(newline="") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames), list(reader)


def test_urban_layout(us8k):
    root, stats = us8k
    header, rows = read_rows(root)
    assert tuple(header) == urbansound8k.COLUMNS
    assert len(rows) == stats["slices"] and stats["recordings"] == RECORDINGS
    listed = set()
    fold_of, durations = {}, []
    for row in rows:
        fs_id, class_id, _, _ = US8K_NAME.match(row["slice_file_name"]).groups()
        assert (fs_id, class_id) == (row["fsID"], row["classID"])
        assert row["class"] == urbansound8k.CLASSES[int(class_id)]
        assert row["salience"] in ("1", "2") and 1 <= int(row["fold"]) <= 10
        assert fold_of.setdefault(fs_id, row["fold"]) == row["fold"]  # one recording, one fold
        path = root / "audio" / f"fold{row['fold']}" / row["slice_file_name"]
        info = sf.info(str(path))
        assert (info.samplerate, info.channels, info.subtype) == (16000, 1, "PCM_16")
        span = float(row["end"]) - float(row["start"])
        assert 0.3 - 1e-6 <= span <= 4.0 + 1e-6 and abs(info.duration - span) < 1e-3
        durations.append(info.duration)
        listed.add(path)
    assert set((root / "audio").rglob("*.wav")) == listed
    assert {r["class"] for r in rows} == set(urbansound8k.CLASSES)
    assert len(fold_of) == RECORDINGS
    assert sorted(int(f) for f in set(fold_of.values())) == list(range(1, 11))  # every fold used
    assert min(durations) < 4.0 and max(durations) == pytest.approx(4.0)


def test_urban_loader_reads_stand_in(us8k):
    root, stats = us8k
    m = urbansound8k.load_manifest(root, DataConfig())
    assert len(m.clips) == stats["slices"]
    assert all(c.client == c.group and c.client.startswith("fs") for c in m.clips)
    assert {c.split for c in m.clips} == {"train", "val", "test"}


def test_urban_default_size_plan():
    # The default stand-in (not rendered here) has UrbanSound8K's 10 folds and 1000-1500 slices.
    plan = urban._plan(urban.DEFAULT_RECORDINGS, 0)
    slices = [s for rec in plan for s in rec.slices()]
    assert 1000 <= len(slices) <= 1500
    assert len({rec.fs_id for rec in plan}) == urban.DEFAULT_RECORDINGS
    assert {rec.fold for rec in plan} == set(range(1, 11))


@pytest.mark.slow
def test_urban_deterministic_and_marker(us8k, tmp_path):
    root, stats = us8k
    urban.generate(tmp_path / "w1", recordings=RECORDINGS, seed=0, progress=False, workers=1)
    assert digests(tmp_path / "w1") == digests(root)
    assert (tmp_path / "w1" / "metadata" / "UrbanSound8K.csv").read_bytes() == (
        root / "metadata" / "UrbanSound8K.csv"
    ).read_bytes()
    with no_generation():
        assert urban.generate(root, recordings=RECORDINGS, seed=0, progress=False)["cached"] is True
    # Other parameters replace the previous generation; an interrupted one is redone.
    small = urban.generate(tmp_path / "w1", recordings=10, seed=1, progress=False, workers=1)
    assert small["cached"] is False and small["recordings"] == 10
    assert len(read_rows(tmp_path / "w1")[1]) == small["slices"]
    assert len(list((tmp_path / "w1" / "audio").rglob("*.wav"))) == small["slices"]
    (tmp_path / "w1" / MARKER).unlink()
    (tmp_path / "w1" / IN_PROGRESS).write_text("{}")
    assert (
        urban.generate(tmp_path / "w1", recordings=10, seed=1, progress=False, workers=1)["cached"]
        is False
    )
    with pytest.raises(ValueError, match="at least 10 recordings"):
        urban.generate(tmp_path / "tiny", recordings=5, progress=False)
