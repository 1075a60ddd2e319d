"""Speech Commands v0.02 loader: tasks, splits, clients, and every bad-input path."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from fedac.config import DataConfig, FeatureConfig
from fedac.data.audio import fit_length, load_audio
from fedac.data.features import compute_features
from fedac.data.gsc import WORDS_10, WORDS_35, load_manifest
from fedac.errors import AudioError, DatasetError
from gsc_fixture import make_gsc_tree

RATE = 16000


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """4 speakers (2 train, 1 val, 1 test), 1 clip each; 30 s of background noise for silence
    slices."""
    root = make_gsc_tree(tmp_path_factory.mktemp("gsc_small"), speakers=4, clips=1)
    rng = np.random.default_rng(1)
    sf.write(
        root / "_background_noise_" / "pink.wav",
        0.05 * rng.standard_normal(RATE * 30).astype(np.float32),
        RATE,
    )
    return root


@pytest.fixture
def own_tree(tmp_path):
    """A tree a test may damage."""
    return make_gsc_tree(tmp_path / "gsc", speakers=3, clips=1)


def test_35_word_task(tree):
    m = load_manifest(tree, DataConfig(task="35"))
    assert m.name == "speech_commands-35"
    assert m.classes == WORDS_35 and m.num_classes == 35
    assert len(m.clips) == 35 * 4
    # labels follow the word folder
    for clip in m.clips:
        assert m.classes[clip.label] == Path(clip.path).parent.name
    assert Counter(c.label for c in m.clips) == {i: 4 for i in range(35)}
    assert m.counts() == {"train": 70, "val": 35, "test": 35}


def test_splits_follow_list_files_and_client_is_speaker_prefix(tree):
    m = load_manifest(tree, DataConfig())
    for clip in m.clips:
        speaker = Path(clip.path).name.split("_nohash_")[0]
        assert clip.client == speaker
        expected = {"00000002": "val", "00000003": "test"}.get(speaker, "train")
        assert clip.split == expected
    assert sorted({c.client for c in m.clips if c.split == "train"}) == ["00000000", "00000001"]


def test_list_file_moves_a_clip(tmp_path):
    root = make_gsc_tree(tmp_path / "gsc", speakers=3, clips=1)
    with open(root / "testing_list.txt", "a") as handle:
        handle.write("bed/00000000_nohash_0.wav\n")
    m = load_manifest(root, DataConfig())
    split = {Path(c.path).relative_to(root).as_posix(): c.split for c in m.clips}
    assert split["bed/00000000_nohash_0.wav"] == "test"
    assert split["cat/00000000_nohash_0.wav"] == "train"


def test_12_class_task(tree):
    m = load_manifest(tree, DataConfig(task="12"))
    assert m.name == "speech_commands-12"
    assert m.classes == WORDS_10 + ["_silence_", "_unknown_"]
    unknown, silence = m.classes.index("_unknown_"), m.classes.index("_silence_")
    words = [c for c in m.clips if "_background_noise_" not in c.path]
    for clip in words:
        word = Path(clip.path).parent.name
        assert clip.label == (WORDS_10.index(word) if word in WORDS_10 else unknown)
    # every other word's clip is kept as _unknown_ (25 words x 4 speakers)
    assert sum(c.label == unknown for c in m.clips) == 25 * 4
    # _silence_: one-second slices of the background files (5 s white + 30 s pink)
    sil = [c for c in m.clips if c.label == silence]
    assert len(sil) == 35
    assert all("_background_noise_" in c.path and c.duration == 1.0 for c in sil)
    assert sorted((Path(c.path).name, c.offset) for c in sil) == sorted(
        [("white_noise.wav", float(s)) for s in range(5)]
        + [("pink.wav", float(s)) for s in range(30)]
    )
    splits = Counter(c.split for c in sil)
    assert splits["train"] > splits["val"] and splits["train"] > splits["test"]
    assert splits["val"] + splits["test"] > 0
    # training silence is spread over the training speakers, not one artificial client
    train_speakers = {c.client for c in words if c.split == "train"}
    owners = Counter(c.client for c in sil if c.split == "train")
    assert set(owners) == train_speakers
    # deterministic
    again = load_manifest(tree, DataConfig(task="12"))
    assert [(c.path, c.offset, c.split, c.client) for c in again.clips] == [
        (c.path, c.offset, c.split, c.client) for c in m.clips
    ]


def test_12_class_needs_background_noise(own_tree):
    for f in (own_tree / "_background_noise_").glob("*.wav"):
        f.unlink()
    with pytest.raises(DatasetError, match="_background_noise_"):
        load_manifest(own_tree, DataConfig(task="12"))
    # the 35-word task does not need it
    assert load_manifest(own_tree, DataConfig(task="35")).num_classes == 35


def test_unknown_task(tree):
    with pytest.raises(DatasetError, match="data.task"):
        load_manifest(tree, DataConfig(task="20"))


# --- bad trees ----------------------------------------------------------------------------------


def test_missing_root(tmp_path):
    with pytest.raises(DatasetError, match="does not exist") as info:
        load_manifest(tmp_path / "nowhere", DataConfig())
    assert "nowhere" in str(info.value)


def test_missing_validation_list(own_tree):
    (own_tree / "validation_list.txt").unlink()
    with pytest.raises(DatasetError, match="validation_list.txt") as info:
        load_manifest(own_tree, DataConfig())
    assert "missing" in str(info.value)


def test_missing_testing_list(own_tree):
    (own_tree / "testing_list.txt").unlink()
    with pytest.raises(DatasetError, match="testing_list.txt"):
        load_manifest(own_tree, DataConfig())


def test_list_entry_without_file(own_tree):
    with open(own_tree / "validation_list.txt", "a") as handle:
        handle.write("dog/deadbeef_nohash_0.wav\n")
    with pytest.raises(DatasetError, match="dog/deadbeef_nohash_0.wav"):
        load_manifest(own_tree, DataConfig())


def test_empty_word_folder(tmp_path):
    root = make_gsc_tree(
        tmp_path / "gsc", speakers=3, words=[w for w in WORDS_35 if w != "marvin"], clips=1
    )
    with pytest.raises(DatasetError, match="marvin") as info:
        load_manifest(root, DataConfig())
    assert "no .wav files" in str(info.value)


def test_missing_word_folder(own_tree):
    for f in (own_tree / "visual").glob("*.wav"):
        f.unlink()
    (own_tree / "visual").rmdir()
    with pytest.raises(DatasetError, match="visual"):
        load_manifest(own_tree, DataConfig())


def test_bad_filename(own_tree):
    sf.write(own_tree / "cat" / "recording 1.wav", np.zeros(RATE, np.float32), RATE)
    with pytest.raises(DatasetError, match="recording 1.wav") as info:
        load_manifest(own_tree, DataConfig())
    assert "_nohash_" in str(info.value)


@pytest.mark.parametrize(
    "damage, words",
    [
        ("garbage", "cannot decode"),
        ("empty", "no samples"),
    ],
)
def test_bad_wav_names_the_file_when_features_are_computed(own_tree, damage, words):
    bad = own_tree / "happy" / "00000000_nohash_0.wav"
    if damage == "garbage":
        bad.write_bytes(b"RIFF\x00\x00garbage, not audio at all" * 10)
    else:
        sf.write(bad, np.zeros(0, np.float32), RATE)
    m = load_manifest(own_tree, DataConfig())  # the loader only lists files
    assert any(c.path == str(bad) for c in m.clips)
    with pytest.raises(AudioError, match="happy/00000000_nohash_0.wav") as info:
        compute_features(m, FeatureConfig(), progress=False)
    assert words in str(info.value)


def test_corrupt_and_empty_audio_files(tmp_path):
    garbage = tmp_path / "garbage.wav"
    garbage.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(AudioError, match="garbage.wav"):
        load_audio(garbage)
    empty = tmp_path / "empty.wav"
    sf.write(empty, np.zeros(0, np.float32), RATE)
    with pytest.raises(AudioError, match="empty.wav.*no samples"):
        load_audio(empty)
    with pytest.raises(AudioError, match="missing.wav.*does not exist"):
        load_audio(tmp_path / "missing.wav")


def test_stereo_44k1_is_downmixed_and_resampled(tmp_path):
    t = np.arange(44100) / 44100
    left = 0.5 * np.sin(2 * np.pi * 440 * t)
    right = np.zeros_like(left)
    path = tmp_path / "stereo.wav"
    sf.write(path, np.stack([left, right], axis=1).astype(np.float32), 44100, subtype="FLOAT")
    audio = load_audio(path)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert len(audio) == 16000
    # mono = (L + R) / 2 = 0.25 sin(2 pi 440 t): RMS 0.25 / sqrt(2) away from the edges
    middle = audio[2000:-2000]
    assert np.sqrt(np.mean(middle.astype(np.float64) ** 2)) == pytest.approx(
        0.25 / np.sqrt(2), rel=0.01
    )
    spectrum = np.abs(np.fft.rfft(audio))
    assert np.argmax(spectrum) == 440  # 1 Hz bins at 16000 samples / 16 kHz


def test_8k_mono_is_upsampled(tmp_path):
    path = tmp_path / "low.wav"
    sf.write(
        path, (0.3 * np.sin(2 * np.pi * 1000 * np.arange(8000) / 8000)).astype(np.float32), 8000
    )
    audio = load_audio(path)
    assert len(audio) == 16000
    assert np.argmax(np.abs(np.fft.rfft(audio))) == 1000


def test_offset_and_duration(tmp_path):
    path = tmp_path / "ramp.wav"
    sf.write(path, np.linspace(-1, 1, 3 * RATE).astype(np.float32), RATE, subtype="FLOAT")
    piece = load_audio(path, offset=1.0, duration=1.0)
    assert len(piece) == RATE
    assert piece[0] == pytest.approx(np.linspace(-1, 1, 3 * RATE)[RATE])


def test_stereo_44k1_in_the_tree_gives_normal_features(own_tree):
    path = own_tree / "wow" / "00000000_nohash_0.wav"
    t = np.arange(44100) / 44100
    stereo = np.stack(
        [0.3 * np.sin(2 * np.pi * 700 * t), 0.3 * np.sin(2 * np.pi * 700 * t)], axis=1
    )
    sf.write(path, stereo.astype(np.float32), 44100)
    m = load_manifest(own_tree, DataConfig())
    feats = compute_features(m, FeatureConfig(), progress=False)
    # nothing dropped: one window per 1 s clip, the stereo clip included
    assert len(feats) == len(m.clips)
    assert feats.features.shape[1:] == (40, 101)


def test_fit_length():
    assert [len(w) for w in fit_length(np.ones(100, np.float32), 160)] == [160]
    assert fit_length(np.ones(100, np.float32), 160)[0][100:].sum() == 0
    windows = fit_length(np.arange(400, dtype=np.float32), 160)
    # ceil(400 / 160) = 3 windows starting at 0, 120, 240 (the last ends at the end)
    assert [w[0] for w in windows] == [0, 120, 240]
    assert windows[-1][-1] == 399
