"""Hostile input never takes a run down silently (issue 13): every loader's audio and metadata
fuzzed.

Each hostile file either loads as the valid audio it is (other rates, stereo, long files: nothing
valid is lost) or raises a typed fedac error whose message names the file and says how to fix it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from fedac.cli import main
from fedac.config import DataConfig
from fedac.data import cremad, gsc, iemocap, urbansound8k
from fedac.data.audio import load_audio
from fedac.errors import AudioError, DatasetError
from gsc_fixture import make_gsc_tree
from iemocap_fixture import make_iemocap_tree

RATE = 16000
FIX = ("replace", "delete", "remove", "re-download", "rename", "save", "fix")


def tone(seconds=0.5, rate=RATE) -> np.ndarray:
    return (0.3 * np.sin(2 * np.pi * 440 * np.arange(int(seconds * rate)) / rate)).astype(
        np.float32
    )


def write_wav(path: Path, data=None, rate=RATE, subtype="PCM_16", fmt=None) -> Path:
    sf.write(path, tone() if data is None else data, rate, subtype=subtype, format=fmt)
    return path


def hostile_audio(folder: Path) -> dict[str, Path]:
    """Files that cannot be valid audio, by case."""
    cases = {}
    cases["zero-length wav"] = folder / "empty.wav"
    cases["zero-length wav"].write_bytes(b"")
    cases["zero-length flac"] = folder / "empty.flac"
    cases["zero-length flac"].write_bytes(b"")
    header_only = write_wav(folder / "header.wav", np.zeros(0, dtype=np.float32))
    cases["header without samples"] = header_only
    good = write_wav(folder / "good.wav").read_bytes()
    cases["truncated header"] = folder / "cut_header.wav"
    cases["truncated header"].write_bytes(good[:20])
    flac = write_wav(folder / "good.flac", fmt="FLAC").read_bytes()
    cases["truncated flac"] = folder / "cut.flac"
    cases["truncated flac"].write_bytes(flac[:30])
    cases["wrong header"] = folder / "text.wav"
    cases["wrong header"].write_bytes(b"this is not audio at all\n" * 40)
    cases["riff with garbage"] = folder / "riff.wav"
    cases["riff with garbage"].write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt " + os.urandom(200))
    nan = tone()
    nan[100] = np.nan
    cases["NaN samples"] = write_wav(folder / "nan.wav", nan, subtype="FLOAT")
    inf = tone()
    inf[7] = np.inf
    cases["Inf samples"] = write_wav(folder / "inf.wav", inf, subtype="FLOAT")
    loop = folder / "loop.wav"
    os.symlink(loop, loop)
    cases["symlink loop"] = loop
    return cases


def test_every_hostile_audio_file_gets_an_error_naming_it_and_the_fix(tmp_path):
    for case, path in hostile_audio(tmp_path).items():
        with pytest.raises(AudioError) as err:
            load_audio(path)
        message = str(err.value)
        assert str(path) in message, case
        assert any(word in message.lower() for word in FIX), f"{case}: no fix in {message!r}"


def test_valid_but_unusual_audio_is_kept(tmp_path):
    # other rates, stereo, 8-bit, FLAC, a long file (a truncated data chunk is an error:
    # test_audio_integrity.py)
    assert load_audio(write_wav(tmp_path / "a.wav", tone(1.0, 8000), 8000)).shape == (RATE,)
    assert load_audio(write_wav(tmp_path / "b.wav", tone(1.0, 44100), 44100)).shape == (RATE,)
    stereo = np.stack([tone(), -tone()], axis=1)
    assert np.allclose(load_audio(write_wav(tmp_path / "c.wav", stereo)), 0, atol=1e-4)
    assert load_audio(write_wav(tmp_path / "d.wav", subtype="PCM_U8")).shape == (8000,)
    assert load_audio(write_wav(tmp_path / "e.flac", fmt="FLAC")).shape == (8000,)
    assert load_audio(write_wav(tmp_path / "g.wav", tone(120.0))).shape == (120 * RATE,)


# --- metadata -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gsc_tree(tmp_path_factory):
    return make_gsc_tree(tmp_path_factory.mktemp("fuzz_gsc"), speakers=4, clips=1)


def copy(tree: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tree, tmp_path / "tree", symlinks=True))


def test_gsc_list_files_non_utf8_and_malformed(gsc_tree, tmp_path):
    root = copy(gsc_tree, tmp_path)
    (root / "testing_list.txt").write_bytes(b"yes/\xff\xfe_nohash_0.wav\n")
    with pytest.raises(
        DatasetError, match="testing_list.txt line 1 is not UTF-8 text.*fix or remove that line"
    ):
        gsc.load_manifest(root, DataConfig())
    (root / "testing_list.txt").write_text("yes/00000003_nohash_0.wav\n../../etc/passwd\n")
    with pytest.raises(DatasetError, match="testing_list.txt lists '../../etc/passwd'"):
        gsc.load_manifest(root, DataConfig())


def test_gsc_symlink_loop_and_bad_names(gsc_tree, tmp_path):
    root = copy(gsc_tree, tmp_path)
    # a directory-style loop, not a .wav: ignored
    os.symlink(root / "yes" / "loop", root / "yes" / "loop")
    loop = root / "yes" / "0000000a_nohash_0.wav"
    os.symlink(loop, loop)
    with pytest.raises(DatasetError, match=f"{loop}.*symlink loop.*remove"):
        gsc.load_manifest(root, DataConfig())


def test_urbansound8k_non_utf8_metadata(tmp_path):
    from test_urbansound8k import write_tree

    root = write_tree(tmp_path / "us8k")
    csv_path = root / "metadata" / "UrbanSound8K.csv"
    lines = csv_path.read_bytes().split(b"\n")
    lines[3] = b"\xff\xfe" + lines[3]
    csv_path.write_bytes(b"\n".join(lines))
    with pytest.raises(DatasetError, match="UrbanSound8K.csv line 4 is not UTF-8 text"):
        urbansound8k.load_manifest(root, DataConfig())


def test_cremad_symlink_loop(tmp_path):
    folder = tmp_path / "cremad" / "AudioWAV"
    folder.mkdir(parents=True)
    write_wav(folder / "1001_DFA_ANG_XX.wav")
    loop = folder / "1002_DFA_SAD_XX.wav"
    os.symlink(loop, loop)
    with pytest.raises(DatasetError, match=f"{loop}.*symlink loop.*remove"):
        cremad.load_manifest(tmp_path / "cremad", DataConfig())


def test_iemocap_non_utf8_and_malformed_lines(tmp_path):
    root = make_iemocap_tree(tmp_path / "iemocap", per_dialog=2)
    evaluation = sorted((root / "Session1" / "dialog" / "EmoEvaluation").glob("*impro*.txt"))[0]
    text = evaluation.read_bytes()
    evaluation.write_bytes(
        text.replace(b"neu", b"n\xffu", 1) if b"neu" in text else b"[\xff" + text
    )
    with pytest.raises(DatasetError, match=str(evaluation)):
        iemocap.load_manifest(root, DataConfig())


# --- a whole run ----------------------------------------------------------------------------------


def test_a_run_over_a_corrupt_clip_exits_with_the_file_named(gsc_tree, tmp_path, capsys):
    root = copy(gsc_tree, tmp_path)
    bad = root / "no" / "00000000_nohash_0.wav"
    bad.write_bytes(b"RIFF garbage")
    code = main(
        [
            "run",
            "--rounds",
            "1",
            "--quiet",
            f"--set=data.root={root}",
            "--set=model.name=crnn_tiny",
            f"--set=data.cache_dir={tmp_path / 'cache'}",
            "--out",
            str(tmp_path / "run"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and str(bad) in err and "Traceback" not in err
