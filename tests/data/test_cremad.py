"""CREMA-D loader: file-name parsing, all 91 actors kept (1001 and 1091 too), actor folds,
errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from fedac.config import DataConfig
from fedac.data.cremad import CLASSES, NUM_FOLDS, actor_folds, load_manifest
from fedac.data.partition import partition
from fedac.errors import ConfigError, DatasetError

ACTORS = [str(a) for a in range(1001, 1092)]
# Per actor: the four task emotions, a LO/HI level pair and two emotions the task leaves out.
FILES = [
    "DFA_ANG_XX",
    "DFA_HAP_XX",
    "DFA_SAD_XX",
    "DFA_NEU_XX",
    "IEO_ANG_LO",
    "IEO_SAD_HI",
    "TIE_DIS_XX",
    "TIE_FEA_XX",
]


@pytest.fixture(scope="module")
def cremad_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cremad")
    folder = root / "AudioWAV"
    folder.mkdir()
    tone = (0.1 * np.sin(np.arange(800) / 5)).astype(np.float32)
    for actor in ACTORS:
        for stem in FILES:
            sf.write(folder / f"{actor}_{stem}.wav", tone, 16000)
    sf.write(folder / "1040_ITH_SAD_X.wav", tone, 16000)  # the official file with level "X"
    return root


@pytest.fixture
def tree(tmp_path, cremad_root) -> Path:
    return Path(shutil.copytree(cremad_root, tmp_path / "cremad"))


def test_all_91_actors_kept_including_1001_and_1091(cremad_root):
    m = load_manifest(cremad_root, DataConfig())
    actors = {c.client for c in m.clips}
    assert actors == set(ACTORS) and len(actors) == 91
    assert "1001" in actors and "1091" in actors
    # Emotions: only the four task classes, in the protocol's order; DIS/FEA are left out.
    assert m.classes == CLASSES == ["ANG", "HAP", "SAD", "NEU"]
    assert len(m.clips) == 91 * 6 + 1
    assert not any("_DIS_" in c.path or "_FEA_" in c.path for c in m.clips)
    by_name = {Path(c.path).name: c.label for c in m.clips}
    assert by_name["1001_DFA_NEU_XX.wav"] == 3 and by_name["1091_IEO_ANG_LO.wav"] == 0
    assert by_name["1040_ITH_SAD_X.wav"] == 2


def test_actor_folds_round_robin():
    folds = actor_folds(["1003", "1001", "1002", "1005", "1004", "1006"])
    assert folds == {"1001": 0, "1002": 1, "1003": 2, "1004": 3, "1005": 4, "1006": 0}


@pytest.mark.parametrize("fold", ["0", "2", "4"])
def test_splits_are_actor_disjoint_folds(cremad_root, fold):
    m = load_manifest(cremad_root, DataConfig(test_fold=fold))
    split_actors = {
        s: {c.client for c in m.clips if c.split == s} for s in ("train", "val", "test")
    }
    assert not (
        split_actors["train"] & split_actors["val"]
        or split_actors["train"] & split_actors["test"]
        or split_actors["val"] & split_actors["test"]
    )
    test_index, val_index = int(fold), (int(fold) + 1) % NUM_FOLDS
    assert split_actors["test"] == set(ACTORS[test_index::NUM_FOLDS])
    assert split_actors["val"] == set(ACTORS[val_index::NUM_FOLDS])
    assert len(split_actors["train"]) == 91 - len(split_actors["test"]) - len(split_actors["val"])


def test_default_fold_and_natural_partition(cremad_root):
    m = load_manifest(cremad_root, DataConfig())
    assert {c.client for c in m.clips if c.split == "test"} == set(ACTORS[0::5])  # includes 1001
    clients = partition(m, DataConfig(local_holdout=0.0), seed=0)
    train_actors = sorted({c.client for c in m.clips if c.split == "train"})
    assert [c.name for c in clients] == train_actors
    assert all(c.num_samples in (6, 7) for c in clients)  # 1040 has the extra X-level file


def test_bad_test_fold(cremad_root):
    with pytest.raises(ConfigError, match="data.test_fold='5' is not a CREMA-D .*0, 1, 2, 3, 4"):
        load_manifest(cremad_root, DataConfig(test_fold="5"))


def test_unparseable_names_are_listed(tree):
    (tree / "AudioWAV" / "1001_DFA_ANGRY_XX.wav").write_bytes(b"")
    (tree / "AudioWAV" / "actor7.wav").write_bytes(b"")
    with pytest.raises(
        DatasetError, match=r"1001_DFA_ANGRY_XX\.wav, actor7\.wav do not follow CREMA-D"
    ):
        load_manifest(tree, DataConfig())


def test_unknown_sentence_or_level_is_unparseable(tree):
    (tree / "AudioWAV" / "1001_ABC_ANG_XX.wav").write_bytes(b"")
    with pytest.raises(DatasetError, match=r"1001_ABC_ANG_XX\.wav"):
        load_manifest(tree, DataConfig())


def test_non_wav_and_hidden_files_ignored(tree):
    (tree / "AudioWAV" / "README.txt").write_text("x")
    (tree / "AudioWAV" / "._1001_DFA_ANG_XX.wav").write_bytes(b"")
    assert len(load_manifest(tree, DataConfig()).clips) == 91 * 6 + 1


def test_missing_root_and_audio_folder(tmp_path):
    with pytest.raises(
        DatasetError, match="CREMA-D root: folder .* does not exist.*CheyneyComputerScience/CREMA-D"
    ):
        load_manifest(tmp_path / "nowhere", DataConfig())
    tmp_path.joinpath("empty").mkdir()
    with pytest.raises(
        DatasetError, match=r"CREMA-D audio folder: folder .*AudioWAV does not exist"
    ):
        load_manifest(tmp_path / "empty", DataConfig())
    (tmp_path / "empty" / "AudioWAV").mkdir()
    with pytest.raises(DatasetError, match="holds no .wav files"):
        load_manifest(tmp_path / "empty", DataConfig())


def test_only_left_out_emotions(tmp_path):
    folder = tmp_path / "AudioWAV"
    folder.mkdir()
    (folder / "1001_DFA_DIS_XX.wav").write_bytes(b"")
    with pytest.raises(DatasetError, match="no clip of the emotions ANG, HAP, SAD, NEU"):
        load_manifest(tmp_path, DataConfig())
