"""Issue 43, item 3: a cut-short audio file never trains silently.

libsndfile decodes whatever frames a truncated WAV file still holds; load_audio compares them with
what the header promised. A run stops on such a file (data.on_bad_file=error, the default) or, with
data.on_bad_file=skip, leaves it out, lists it in bad_files.txt and goes on.
"""

from __future__ import annotations

import logging
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from fedac.cli import main
from fedac.config import load_config
from fedac.data.audio import load_audio
from fedac.data.features import undecodable
from fedac.data.registry import load_manifest
from fedac.engine.data import BAD_FILES, build_federated_data
from fedac.errors import AudioError, ConfigError
from gsc_fixture import make_gsc_tree

pytestmark = pytest.mark.usefixtures("one_thread")
RATE = 16000
BAD = "no/00000001_nohash_0.wav"  # a training speaker's clip


def tone(seconds: float = 1.0) -> np.ndarray:
    return (0.3 * np.sin(2 * np.pi * 440 * np.arange(int(seconds * RATE)) / RATE)).astype(
        np.float32
    )


def cut(path: Path, size: int) -> Path:
    path.write_bytes(path.read_bytes()[:size])
    return path


def half_data(path: Path) -> int:
    """The size of `path` cut to half of its data chunk (16-bit mono, 44-byte header)."""
    return 44 + (path.stat().st_size - 44) // 2


# --- decoding -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "subtype,fmt",
    [
        ("PCM_16", "WAV"),
        ("PCM_24", "WAV"),
        ("PCM_32", "WAV"),
        ("FLOAT", "WAV"),
        ("PCM_16", "WAVEX"),
        ("PCM_16", "RF64"),
    ],
)
def test_a_truncated_wav_is_an_error_naming_the_file(tmp_path, subtype, fmt):
    full = tmp_path / "full.wav"
    sf.write(full, tone(), RATE, subtype=subtype, format=fmt)
    assert load_audio(full).shape == (RATE,)
    data = full.read_bytes()
    start = data.index(b"data") + 8  # where the samples begin (44 for plain PCM)
    # no sample left, 56 bytes of them (a 100-byte PCM file), half of them, all but one byte
    for size in (start, start + 56, start + (len(data) - start) // 2, len(data) - 1):
        path = tmp_path / f"cut{size}.wav"
        path.write_bytes(data[:size])
        with pytest.raises(AudioError, match="truncated: its header promises 16000 frames") as err:
            load_audio(path)
        assert str(path) in str(err.value) and "re-download" in str(err.value)


def test_what_is_not_truncated_still_loads(tmp_path):
    full = tmp_path / "full.wav"
    sf.write(full, tone(), RATE, subtype="PCM_16")
    data = full.read_bytes()
    # a chunk after the data chunk, cut short itself: the audio is whole
    tail = data + b"LIST" + struct.pack("<I", 100) + b"x" * 100
    tail = tail[:4] + struct.pack("<I", len(tail) - 8) + tail[8:]
    (tmp_path / "tail.wav").write_bytes(tail[:-40])
    assert np.array_equal(load_audio(tmp_path / "tail.wav"), load_audio(full))
    # a streaming writer's "size unknown" data chunk reads to the end of the file
    (tmp_path / "stream.wav").write_bytes(data[:40] + struct.pack("<I", 0xFFFFFFFF) + data[44:])
    assert load_audio(tmp_path / "stream.wav").shape == (RATE,)
    # other formats are left to libsndfile: whole FLAC / OGG load, cut ones are decode errors
    for fmt, subtype in (("FLAC", "PCM_16"), ("OGG", "VORBIS")):
        path = tmp_path / f"a.{fmt.lower()}"
        sf.write(path, tone(), RATE, format=fmt, subtype=subtype)
        assert load_audio(path).shape == (RATE,)
        with pytest.raises(AudioError, match=f"cannot decode audio file {cut(path, 100)}"):
            load_audio(path)
    # a header with no samples at all (0 frames) stays an error
    sf.write(tmp_path / "empty.wav", np.zeros(0, np.float32), RATE)
    with pytest.raises(AudioError, match="holds no samples"):
        load_audio(tmp_path / "empty.wav")


def test_the_decode_error_reads_as_one_sentence(tmp_path):
    path = tmp_path / "text.wav"
    path.write_bytes(b"this is not audio at all\n" * 40)
    with pytest.raises(AudioError) as err:
        load_audio(path)
    message = str(err.value)
    assert (
        message.startswith(f"cannot decode audio file {path}: ")
        and "; replace it with a good copy" in message
    )
    assert ".." not in message and ".;" not in message and ". Replace" not in message


def test_verdicts_are_cached_by_file_and_rechecked_when_it_changes(tmp_path, monkeypatch):
    from fedac.data import features

    good, bad = tmp_path / "good.wav", tmp_path / "bad.wav"
    sf.write(good, tone(), RATE, subtype="PCM_16")
    sf.write(bad, tone(), RATE, subtype="PCM_16")
    cut(bad, 100)
    verdicts = undecodable([good, bad], tmp_path / "cache")
    assert list(verdicts) == [str(bad)] and "truncated" in verdicts[str(bad)]

    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded again instead of reading the cached verdict")

    with monkeypatch.context() as patch:
        patch.setattr(features, "load_audio", no_decoding)
        assert undecodable([bad, good], tmp_path / "cache") == verdicts
    sf.write(bad, tone(), RATE, subtype="PCM_16")  # a good copy restored: checked again
    assert undecodable([good, bad], tmp_path / "cache") == {}


# --- a run ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return make_gsc_tree(tmp_path_factory.mktemp("integrity_gsc"), speakers=4)


@pytest.fixture(params=["100 bytes", "half its data"])
def spoilt(request, tree, tmp_path):
    """A copy of the tree with one clip cut short, and that clip's path."""
    root = Path(shutil.copytree(tree, tmp_path / "tree"))
    bad = root / BAD
    cut(bad, 100 if request.param == "100 bytes" else half_data(bad))
    return root, bad


def run(root: Path, cache: Path, out: Path, *settings: str) -> int:
    return main(
        [
            "run",
            "--rounds",
            "1",
            "--quiet",
            f"--set=data.root={root}",
            "--set=model.name=crnn_tiny",
            f"--set=data.cache_dir={cache}",
            *(f"--set={s}" for s in settings),
            "--out",
            str(out),
        ]
    )


def clip_count(data) -> int:
    """Clips the run trains and evaluates on (1 s clips: one window each)."""
    return (
        sum(len(c.y) + len(c.holdout_y) for c in data.clients)
        + data.val.num_clips
        + data.test.num_clips
    )


def test_a_run_stops_on_the_truncated_file_by_default(spoilt, tmp_path, capsys):
    root, bad = spoilt
    with pytest.raises(AudioError, match=f"audio file {bad} is truncated"):
        load_audio(bad)
    assert run(root, tmp_path / "cache", tmp_path / "run") == 2
    err = capsys.readouterr().err
    assert f"audio file {bad} is truncated" in err and "Traceback" not in err


def test_skip_leaves_the_file_out_lists_it_and_runs(spoilt, tree, tmp_path, caplog):
    root, bad = spoilt
    cache, out = tmp_path / "cache", tmp_path / "run"
    with caplog.at_level(logging.WARNING):
        assert run(root, cache, out, "data.on_bad_file=skip") == 0
    lines = (out / BAD_FILES).read_text().splitlines()
    assert [line.split("\t")[0] for line in lines] == [str(bad)] and "truncated" in lines[0]
    assert (
        "1 audio file(s) cannot be decoded and are left out of the run; the list is in "
        f"{out / BAD_FILES}" in caplog.text
    )
    assert (out / "results.json").is_file()
    cfg = load_config(
        None, [f"data.root={root}", f"data.cache_dir={cache}", "data.on_bad_file=skip"]
    )
    everything = load_manifest(cfg, progress=False).clips
    data = build_federated_data(cfg, progress=False)
    assert data.bad_files.keys() == {str(bad)} and len(data.manifest.clips) == len(everything) - 1
    assert clip_count(data) == len(everything) - 1 and str(bad) not in {
        c.path for c in data.manifest.clips
    }
    # The skip run's feature cache does not make an error-mode run over the same files succeed.
    assert run(root, cache, tmp_path / "run2") == 2
    # Once a good copy is back, nothing is left out and no stale list remains.
    shutil.copyfile(tree / BAD, bad)
    assert run(root, cache, out, "data.on_bad_file=skip") == 0
    assert not (out / BAD_FILES).exists()
    assert clip_count(build_federated_data(cfg, progress=False)) == len(everything)


def test_on_bad_file_takes_error_or_skip(tree, tmp_path):
    cfg = load_config(
        None, [f"data.root={tree}", f"data.cache_dir={tmp_path}", "data.on_bad_file=ignore"]
    )
    with pytest.raises(
        ConfigError, match="data.on_bad_file must be one of error, skip, got 'ignore'"
    ):
        build_federated_data(cfg, progress=False)
