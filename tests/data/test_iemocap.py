"""IEMOCAP loader on a tiny release-1.0 tree: improvised only, exc -> hap, speakers, sessions,
errors."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest

from fedac.config import DataConfig
from fedac.data.iemocap import CLASSES, load_manifest, speaker_of
from fedac.data.partition import partition
from fedac.errors import ConfigError, DatasetError
from iemocap_fixture import LABELS, make_iemocap_tree

PER_DIALOG = 12
KEPT = sum(label in ("neu", "hap", "exc", "sad", "ang") for label in LABELS)  # per dialog of 12


@pytest.fixture(scope="module")
def iemocap_root(tmp_path_factory) -> Path:
    return make_iemocap_tree(tmp_path_factory.mktemp("iemocap"), per_dialog=PER_DIALOG)


@pytest.fixture
def tree(tmp_path, iemocap_root) -> Path:
    """A private copy that a test may damage."""
    return Path(shutil.copytree(iemocap_root, tmp_path / "iemocap"))


def test_speaker_of():
    assert speaker_of("Ses01F_impro01_M003") == "Ses01M"
    assert speaker_of("Ses05M_impro05a_F012") == "Ses05F"


def test_improvised_only_exc_merged_into_hap(iemocap_root):
    m = load_manifest(iemocap_root, DataConfig())
    assert m.classes == CLASSES == ["neu", "hap", "sad", "ang"]
    assert not any("script" in c.path for c in m.clips)
    assert len(m.clips) == 5 * 2 * KEPT  # 5 sessions x 2 improvised dialogs
    by_utt = {Path(c.path).stem: c.label for c in m.clips}
    # LABELS[2] == "exc" -> hap; "fru", "xxx", "oth", "sur" turns are absent.
    assert by_utt["Ses01F_impro01_F001"] == CLASSES.index("hap")
    assert "Ses01F_impro01_M002" not in by_utt  # fru
    assert "Ses01F_impro01_F003" not in by_utt  # xxx
    expected = Counter({"neu": 2, "hap": 2, "sad": 2, "ang": 2})
    assert Counter(CLASSES[c.label] for c in m.clips if "Ses02M_impro02" in c.path) == expected


def test_clients_are_speakers_and_session_5_is_test(iemocap_root):
    m = load_manifest(iemocap_root, DataConfig())
    assert {c.client for c in m.clips} == {f"Ses{s:02d}{g}" for s in range(1, 6) for g in "FM"}
    assert {c.client[:5] for c in m.clips if c.split == "test"} == {"Ses05"}
    assert not any(c.client.startswith("Ses05") for c in m.clips if c.split != "test")
    # Validation: exactly one improvised dialog per training session, all training speakers kept.
    val_dialogs = {Path(c.path).parent.name for c in m.clips if c.split == "val"}
    assert sorted(d[:5] for d in val_dialogs) == ["Ses01", "Ses02", "Ses03", "Ses04"]
    train_dialogs = {Path(c.path).parent.name for c in m.clips if c.split == "train"}
    assert not val_dialogs & train_dialogs
    clients = partition(m, DataConfig(local_holdout=0.0), seed=0)
    assert [c.name for c in clients] == [f"Ses{s:02d}{g}" for s in range(1, 5) for g in "FM"]


def test_test_fold_selects_session(iemocap_root):
    m = load_manifest(iemocap_root, DataConfig(test_fold="1"))
    assert {c.client[:5] for c in m.clips if c.split == "test"} == {"Ses01"}
    assert {Path(c.path).parent.name[:5] for c in m.clips if c.split == "val"} == {
        "Ses02",
        "Ses03",
        "Ses04",
        "Ses05",
    }
    with pytest.raises(ConfigError, match="data.test_fold='6'.*1, 2, 3, 4, 5"):
        load_manifest(iemocap_root, DataConfig(test_fold="6"))


def test_malformed_line_names_file_and_line(tree):
    path = tree / "Session2" / "dialog" / "EmoEvaluation" / "Ses02F_impro01.txt"
    lines = path.read_text().splitlines()
    # Line 3 is the first utterance line (header, blank line, then the block).
    assert lines[2].startswith("[0.0000 - 1.5000]\tSes02F_impro01_F000")
    lines[2] = "[0.0000 - 1.5000]\tSes02F_impro01_F000\tneu"  # V/A/D part missing
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match=r"Ses02F_impro01\.txt line 3: .*not an utterance line"):
        load_manifest(tree, DataConfig())


def test_line_without_timestamps_is_malformed(tree):
    path = tree / "Session3" / "dialog" / "EmoEvaluation" / "Ses03M_impro02.txt"
    path.write_text(path.read_text() + "Ses03M_impro02_F099\tang\t[1, 2, 3]\n")
    with pytest.raises(DatasetError, match=r"Ses03M_impro02\.txt line \d+"):
        load_manifest(tree, DataConfig())


def test_unknown_label_and_foreign_utterance(tree):
    path = tree / "Session1" / "dialog" / "EmoEvaluation" / "Ses01F_impro01.txt"
    original = path.read_text()
    path.write_text(original.replace("_F000\tneu", "_F000\tjoy"))
    with pytest.raises(DatasetError, match="line 3: unknown emotion label 'joy'"):
        load_manifest(tree, DataConfig())
    path.write_text(original.replace("Ses01F_impro01_F000", "Ses01F_impro09_F000"))
    with pytest.raises(DatasetError, match="does not belong to dialog Ses01F_impro01"):
        load_manifest(tree, DataConfig())


def test_listed_utterance_without_wav(tree):
    wav = tree / "Session4" / "sentences" / "wav" / "Ses04M_impro02" / "Ses04M_impro02_M000.wav"
    wav.unlink()
    with pytest.raises(
        DatasetError,
        match=r"Ses04M_impro02\.txt line \d+ labels Ses04M_impro02_M000, but .* does not exist",
    ):
        load_manifest(tree, DataConfig())


def test_missing_wav_of_excluded_label_is_fine(tree):
    # F003 is labelled xxx: it is not used, so its audio is not required.
    (
        tree / "Session1" / "sentences" / "wav" / "Ses01F_impro01" / "Ses01F_impro01_F003.wav"
    ).unlink()
    assert len(load_manifest(tree, DataConfig()).clips) == 5 * 2 * KEPT


def test_missing_session_and_root(tree, tmp_path):
    with pytest.raises(DatasetError, match="does not exist.*sail.usc.edu/iemocap"):
        load_manifest(tmp_path / "nowhere", DataConfig())
    shutil.rmtree(tree / "Session3")
    with pytest.raises(DatasetError, match="lacks Session3"):
        load_manifest(tree, DataConfig())


def test_missing_annotations_folder(tree):
    shutil.rmtree(tree / "Session2" / "dialog" / "EmoEvaluation")
    with pytest.raises(
        DatasetError, match=r"Session2 annotations: folder .*EmoEvaluation does not exist"
    ):
        load_manifest(tree, DataConfig())
