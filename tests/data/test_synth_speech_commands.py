"""Tests of the espeak-ng driven synthetic Google Speech Commands v0.02 generator."""

from __future__ import annotations

import collections
import json
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from fedac.data.synth import espeak
from fedac.data.synth.speech_commands import SAMPLE_RATE, WORDS, generate
from helpers import no_generation

N_SPEAKERS = 12
CLIP_NAME = re.compile(r"^[0-9a-f]{8}_nohash_\d+\.wav$")
GSC_WORDS = set(
    "backward bed bird cat dog down eight five follow forward four go happy house learn left "
    "marvin nine no off on one right seven sheila six stop three tree two up visual wow yes "
    "zero".split()
)


@pytest.fixture(scope="module")
def gsc(tmp_path_factory):
    root = tmp_path_factory.mktemp("gsc") / "seed0"
    stats = generate(root, speakers=N_SPEAKERS, seed=0, workers=2, progress=False)
    return root, stats


def clips(root: Path) -> list[str]:
    """Relative paths of every word clip, sorted."""
    return sorted(str(p.relative_to(root)) for w in WORDS for p in (root / w).glob("*.wav"))


def speaker(rel: str) -> str:
    return rel.split("/")[1].split("_")[0]


def read_list(root: Path, name: str) -> list[str]:
    return (root / name).read_text().splitlines()


def active_spectrum(x: np.ndarray) -> np.ndarray:
    """Log power in 24 bands, averaged over the loud 20 ms frames of a clip."""
    frames = x[: x.size // 320 * 320].reshape(-1, 320)
    energy = (frames**2).mean(axis=1)
    loud = frames[energy > energy.max() * 0.1]
    power = (np.abs(np.fft.rfft(loud * np.hanning(320), axis=1)) ** 2).mean(axis=0)
    bands = np.array_split(power[1:], 24)
    return np.log10(np.array([b.mean() for b in bands]) + 1e-12)


@pytest.mark.slow
def test_layout_and_lists(gsc):
    root, stats = gsc
    word_dirs = {p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("_")}
    assert word_dirs == GSC_WORDS and set(WORDS) == GSC_WORDS
    all_clips = clips(root)
    assert all(CLIP_NAME.match(Path(c).name) for c in all_clips)
    assert stats["total_clips"] == len(all_clips) == sum(stats["clips_per_split"].values())

    val, test = read_list(root, "validation_list.txt"), read_list(root, "testing_list.txt")
    assert val and test and not set(val) & set(test)
    for rel in val + test:
        assert "\\" not in rel and (root / rel).is_file(), rel
    assert stats["clips_per_split"]["validation"] == len(val)
    assert stats["clips_per_split"]["testing"] == len(test)
    assert stats["clips_per_split"]["train"] == len(all_clips) - len(val) - len(test)
    assert "seed: 0" in (root / "SYNTHETIC.txt").read_text()


def test_splits_are_speaker_disjoint(gsc):
    root, stats = gsc
    val = set(read_list(root, "validation_list.txt"))
    test = set(read_list(root, "testing_list.txt"))
    train = set(clips(root)) - val - test
    by_split = {
        name: {speaker(c) for c in s}
        for name, s in (("train", train), ("validation", val), ("testing", test))
    }
    assert not by_split["train"] & by_split["validation"]
    assert not by_split["train"] & by_split["testing"]
    assert not by_split["validation"] & by_split["testing"]
    assert {k: len(v) for k, v in by_split.items()} == stats["speakers_per_split"]
    assert sum(stats["speakers_per_split"].values()) == N_SPEAKERS
    assert min(stats["speakers_per_split"].values()) >= 1


def test_clip_format_and_content(gsc):
    root, _ = gsc
    for rel in clips(root):
        info = sf.info(root / rel)
        assert (info.samplerate, info.channels, info.frames) == (SAMPLE_RATE, 1, SAMPLE_RATE)
        assert info.format == "WAV" and info.subtype == "PCM_16"
        x, _ = sf.read(root / rel, dtype="float32")
        window_rms = np.sqrt((x[:16000].reshape(20, 800) ** 2).mean(axis=1))
        # A spoken word stands well above the clip's noise floor, which itself is not digital zero.
        assert 20 * np.log10(window_rms.max() / window_rms.min()) > 15, rel
        assert window_rms.min() > 0 and np.abs(x).max() > 0.02, rel


def test_background_noise(gsc):
    root, _ = gsc
    files = sorted((root / "_background_noise_").glob("*.wav"))
    assert len(files) >= 5
    rms = []
    for f in files:
        info = sf.info(f)
        assert info.samplerate == SAMPLE_RATE and info.channels == 1 and info.duration >= 10
        x, _ = sf.read(f)
        rms.append(np.sqrt(np.mean(x**2)))
    assert min(rms) > 0.01


def test_non_iid_word_counts(gsc):
    root, _ = gsc
    per_speaker = collections.defaultdict(collections.Counter)
    for rel in clips(root):
        per_speaker[speaker(rel)][rel.split("/")[0]] += 1
    assert len(per_speaker) == N_SPEAKERS
    totals = [sum(c.values()) for c in per_speaker.values()]
    assert min(totals) >= 5 and max(totals) >= 2 * min(totals)
    vocabularies = {frozenset(c) for c in per_speaker.values()}
    assert len(vocabularies) == N_SPEAKERS  # everybody records a different subset of words
    assert any(len(c) < len(WORDS) for c in per_speaker.values())
    uneven = [max(c.values()) > min(c.values()) for c in per_speaker.values()]
    assert sum(uneven) >= N_SPEAKERS // 3
    # Repeats of a word by one speaker are numbered 0..n-1.
    for rel in clips(root):
        word, name = rel.split("/")
        n = int(name.split("_")[2].split(".")[0])
        assert n < per_speaker[name[:8]][word]


def test_speakers_sound_different(gsc):
    root, _ = gsc
    by_word = collections.defaultdict(list)
    for rel in clips(root):
        by_word[rel.split("/")[0]].append(rel)
    word, files = max(by_word.items(), key=lambda kv: len({speaker(f) for f in kv[1]}))
    a = next(f for f in files)
    b = next(f for f in files if speaker(f) != speaker(a))
    xa, _ = sf.read(root / a)
    xb, _ = sf.read(root / b)
    assert not np.allclose(xa, xb)

    # Speaker identity: clips of one speaker are spectrally closer to each other than to
    # clips of other speakers (averaged over all speakers with enough clips).
    spectra = collections.defaultdict(list)
    for rel in clips(root):
        x, _ = sf.read(root / rel)
        spectra[speaker(rel)].append(active_spectrum(x))
    spk = [s for s, v in spectra.items() if len(v) >= 4]
    assert len(spk) >= 4
    within = np.mean(
        [np.linalg.norm(np.mean(spectra[s][0::2], 0) - np.mean(spectra[s][1::2], 0)) for s in spk]
    )
    centres = [np.mean(spectra[s], 0) for s in spk]
    between = np.mean(
        [
            np.linalg.norm(centres[i] - centres[j])
            for i in range(len(spk))
            for j in range(i + 1, len(spk))
        ]
    )
    assert between > 1.5 * within, (between, within)


@pytest.mark.slow
def test_deterministic_by_seed(gsc, tmp_path):
    root, stats = gsc
    # Same seed, other worker count -> byte-identical tree.
    again = generate(tmp_path / "again", speakers=N_SPEAKERS, seed=0, workers=1, progress=False)
    assert again["clips_per_split"] == stats["clips_per_split"]
    names = clips(root) + [
        "validation_list.txt",
        "testing_list.txt",
        "SYNTHETIC.txt",
        ".fedac_complete",
        *(str(p.relative_to(root)) for p in (root / "_background_noise_").glob("*.wav")),
    ]
    assert clips(tmp_path / "again") == clips(root)
    for rel in names:
        assert (root / rel).read_bytes() == (tmp_path / "again" / rel).read_bytes(), rel

    other = tmp_path / "seed1"
    generate(other, speakers=N_SPEAKERS, seed=1, workers=1, progress=False)
    assert not set(clips(other)) & set(clips(root))  # new speaker ids
    noise = "_background_noise_/white_noise.wav"
    assert (other / noise).read_bytes() != (root / noise).read_bytes()
    x1, _ = sf.read(other / clips(other)[0])
    x0, _ = sf.read(root / clips(root)[0])
    assert not np.allclose(x0, x1)


def test_cached_second_call(gsc):
    root, stats = gsc
    marker = root / ".fedac_complete"
    watched = [marker, root / clips(root)[0], root / "validation_list.txt"]
    before = [p.stat().st_mtime_ns for p in watched]
    with no_generation():
        again = generate(root, speakers=N_SPEAKERS, seed=0, workers=2, progress=False)
    assert again["cached"] is True and stats["cached"] is False
    assert again["clips_per_split"] == stats["clips_per_split"]
    assert again["speakers_per_split"] == stats["speakers_per_split"]
    assert [p.stat().st_mtime_ns for p in watched] == before
    assert json.loads(marker.read_text())["seed"] == 0


@pytest.mark.slow
def test_partial_generation_is_redone(tmp_path):
    root = tmp_path / "partial"
    first = generate(root, speakers=3, seed=5, workers=1, progress=False)
    reference = {rel: (root / rel).read_bytes() for rel in clips(root)}

    # Simulate an interrupted run: marker gone, in-progress flag left, a file lost, a stray file.
    (root / ".fedac_complete").unlink()
    (root / ".fedac_incomplete").write_text("{}")
    (root / clips(root)[0]).unlink()
    (root / "yes" / "deadbeef_nohash_0.wav").write_bytes(b"partial")
    (root / "unrelated.txt").write_text("keep me")

    redone = generate(root, speakers=3, seed=5, workers=1, progress=False)
    assert redone["cached"] is False and redone["total_clips"] == first["total_clips"]
    assert (root / ".fedac_complete").is_file() and not (root / ".fedac_incomplete").exists()
    assert {rel: (root / rel).read_bytes() for rel in clips(root)} == reference
    assert (root / "unrelated.txt").read_text() == "keep me"

    # Other parameters replace the old generation instead of returning it.
    changed = generate(root, speakers=4, seed=5, workers=1, progress=False)
    assert changed["cached"] is False and sum(changed["speakers_per_split"].values()) == 4
    assert json.loads((root / ".fedac_complete").read_text())["speakers"] == 4


def test_refuses_foreign_dataset_and_bad_arguments(tmp_path):
    foreign = tmp_path / "real_gsc"
    (foreign / "yes").mkdir(parents=True)
    (foreign / "yes" / "0a7c2a8d_nohash_0.wav").write_bytes(b"RIFF")
    with pytest.raises(FileExistsError):
        generate(foreign, speakers=3, progress=False)
    assert (foreign / "yes" / "0a7c2a8d_nohash_0.wav").exists()
    with pytest.raises(ValueError):
        generate(tmp_path / "tiny", speakers=2, progress=False)


def test_espeak_wrapper():
    eng = espeak.engine()
    assert eng is espeak.engine() and eng.sample_rate == 22050
    assert "en-us" in espeak.english_voices() and "en-gb-x-rp" in espeak.english_voices()
    assert {"Alex", "m3", "f2"} <= set(espeak.voice_variants())
    a = eng.synth("marvin", "en-us+Alex", rate=160, pitch=40, seed=3)
    eng.synth("something else entirely", "en-gb-scotland+f2", rate=300, pitch=90)
    b = eng.synth("marvin", "en-us+Alex", rate=160, pitch=40, seed=3)
    assert a.dtype == np.float32 and 0.2 * eng.sample_rate < a.size < 1.0 * eng.sample_rate
    assert np.array_equal(a, b)  # output does not depend on what was rendered before
    assert 0.05 < np.abs(a).max() <= 1.0
    c = eng.synth("marvin", "en-gb-x-rp+f2", rate=160, pitch=40, seed=3)
    assert a.size != c.size or not np.allclose(a, c)

    # Batch mode: one reset, then a sequence that is reproducible as a whole.
    def batch():
        eng.reset()
        return [eng.synth(w, "en+m3", seed=1, fresh=False) for w in ("yes", "no", "yes")]

    first, second = batch(), batch()
    assert all(np.array_equal(x, y) for x, y in zip(first, second))
    slow = eng.synth("marvin", "en-us+Alex", rate=100, seed=3)
    assert slow.size > a.size
    with pytest.raises(espeak.EspeakError):
        eng.synth("yes", "xx-no-such-voice")
