"""UrbanSound8K loader: metadata parsing, fold splits, fsID grouping under Dirichlet, error
messages."""

from __future__ import annotations

import csv
import shutil
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from fedac.config import DataConfig
from fedac.data.partition import partition
from fedac.data.urbansound8k import CLASSES, COLUMNS, load_manifest, validation_fold
from fedac.errors import ConfigError, DatasetError

RECORDINGS_PER_CLASS = 10
SLICES = 3


def write_tree(root: Path) -> Path:
    """10 classes x 10 recordings x 3 slices of 0.05 s; recording k of each class lies in fold k +
    1."""
    rows = []
    tone = (0.1 * np.sin(np.arange(800) / 3)).astype(np.float32)
    for class_id, name in enumerate(CLASSES):
        for k in range(RECORDINGS_PER_CLASS):
            fs_id, fold = 1000 + 100 * class_id + k, k + 1
            (root / "audio" / f"fold{fold}").mkdir(parents=True, exist_ok=True)
            for s in range(SLICES):
                file_name = f"{fs_id}-{class_id}-0-{s}.wav"
                sf.write(root / "audio" / f"fold{fold}" / file_name, tone, 16000)
                rows.append(
                    [file_name, fs_id, 4.0 * s, 4.0 * s + 4, 1 + s % 2, fold, class_id, name]
                )
    (root / "metadata").mkdir(parents=True)
    with (root / "metadata" / "UrbanSound8K.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        writer.writerows(rows)
    return root


@pytest.fixture(scope="module")
def us8k_root(tmp_path_factory) -> Path:
    return write_tree(tmp_path_factory.mktemp("us8k"))


@pytest.fixture
def tree(tmp_path, us8k_root) -> Path:
    return Path(shutil.copytree(us8k_root, tmp_path / "us8k"))


def metadata(root: Path) -> Path:
    return root / "metadata" / "UrbanSound8K.csv"


def replace_line(root: Path, number: int, text: str) -> None:
    lines = metadata(root).read_text().splitlines()
    lines[number - 1] = text
    metadata(root).write_text("\n".join(lines) + "\n")


def test_classes_clients_and_default_folds(us8k_root):
    m = load_manifest(us8k_root, DataConfig())
    assert m.classes == CLASSES and m.num_classes == 10
    assert len(m.clips) == 10 * RECORDINGS_PER_CLASS * SLICES
    clip = next(c for c in m.clips if Path(c.path).name == "1302-3-0-1.wav")
    assert (clip.label, clip.client, clip.group, clip.split) == (3, "fs1302", "fs1302", "train")
    assert Path(clip.path) == us8k_root / "audio" / "fold3" / "1302-3-0-1.wav"

    def folds(split):
        return {Path(c.path).parent.name for c in m.clips if c.split == split}

    assert folds("test") == {"fold10"} and folds("val") == {"fold9"}
    assert folds("train") == {f"fold{k}" for k in range(1, 9)}
    assert m.counts() == {"train": 240, "val": 30, "test": 30}


def test_test_fold_and_its_validation_fold(us8k_root):
    assert (
        validation_fold("10") == "9"
        and validation_fold("1") == "10"
        and validation_fold("5") == "4"
    )
    m = load_manifest(us8k_root, DataConfig(test_fold="1"))
    assert {Path(c.path).parent.name for c in m.clips if c.split == "test"} == {"fold1"}
    assert {Path(c.path).parent.name for c in m.clips if c.split == "val"} == {"fold10"}
    with pytest.raises(ConfigError, match="data.test_fold='11' is not a UrbanSound8K fold"):
        load_manifest(us8k_root, DataConfig(test_fold="11"))


@pytest.mark.parametrize("alpha", [0.1, 0.5, 1.0])
def test_grouped_dirichlet_keeps_each_fsid_on_one_client(us8k_root, alpha):
    m = load_manifest(us8k_root, DataConfig())
    cfg = DataConfig(
        partition="dirichlet", num_clients=6, alpha=alpha, min_client_size=1, local_holdout=0.2
    )
    owner = defaultdict(set)
    for client in partition(m, cfg, seed=3):
        for i in client.train + client.holdout:
            owner[m.clips[i].group].add(client.name)
    train_groups = {c.group for c in m.clips if c.split == "train"}
    assert set(owner) == train_groups
    assert all(len(clients) == 1 for clients in owner.values())


def test_ungrouped_dirichlet_does_split_recordings(us8k_root):
    # The check above is meaningful: without grouping, some recording's slices land on two clients.
    m = load_manifest(us8k_root, DataConfig())
    cfg = DataConfig(
        partition="dirichlet", num_clients=6, alpha=1.0, min_client_size=1, group_by_source=False
    )
    owner = defaultdict(set)
    for client in partition(m, cfg, seed=3):
        for i in client.train + client.holdout:
            owner[m.clips[i].group].add(client.name)
    assert any(len(clients) > 1 for clients in owner.values())


@pytest.mark.parametrize(
    "line, message",
    [
        ("1000-0-0-0.wav,1000,0.0,4.0,1,1,0", r"line 2: 7 fields, expected 8"),
        (
            "1000-0-0-0.wav,1000,0.0,4.0,1,1,zero,air_conditioner",
            r"line 2: column classID must be an integer, got 'zero'",
        ),
        (
            "1000-0-0-0.wav,1000,0.0,4.0,1,one,0,air_conditioner",
            r"line 2: column fold must be an integer, got 'one'",
        ),
        (
            "1000-0-0-0.wav,1000,0.0,4.0,1,11,0,air_conditioner",
            r"line 2: fold 11 is not one of 1..10",
        ),
        (
            "1000-0-0-0.wav,1000,0.0,4.0,1,1,12,air_conditioner",
            r"line 2: classID 12 is not one of 0..9",
        ),
        (
            "1000-0-0-0.wav,1000,0.0,4.0,1,1,0,siren",
            r"line 2: classID 0 is 'air_conditioner', but the class column says 'siren'",
        ),
        (
            "1000-0-0-0.wav,x1000,0.0,4.0,1,1,0,air_conditioner",
            r"line 2: column fsID must be an integer",
        ),
        (
            "1000-0-0-0.wav,1000,0.0,4.0,1,2,0,air_conditioner",
            r"line 2 lists 1000-0-0-0.wav, but .*fold2.*does not exist",
        ),
        (
            "9999-0-0-0.wav,9999,0.0,4.0,1,1,0,air_conditioner",
            r"line 2 lists 9999-0-0-0.wav, but .* does not exist",
        ),
        (
            "1000-0-0-1.wav,1000,0.0,4.0,1,1,0,air_conditioner",
            r"line 3: 1000-0-0-1.wav is already listed on line 2",
        ),
    ],
)
def test_malformed_metadata_line(tree, line, message):
    replace_line(tree, 2, line)
    with pytest.raises(DatasetError, match=r"UrbanSound8K\.csv " + message):
        load_manifest(tree, DataConfig())


def test_bad_header(tree):
    replace_line(tree, 1, "slice_file_name,fsID,start,end,salience,fold,classID")
    with pytest.raises(
        DatasetError, match=r"UrbanSound8K\.csv line 1: header lacks column\(s\) class"
    ):
        load_manifest(tree, DataConfig())


def test_blank_lines_skipped_and_empty_metadata(tree):
    metadata(tree).write_text(metadata(tree).read_text() + "\n\n")
    assert len(load_manifest(tree, DataConfig()).clips) == 300
    metadata(tree).write_text(",".join(COLUMNS) + "\n")
    with pytest.raises(DatasetError, match="lists no slices"):
        load_manifest(tree, DataConfig())


def test_missing_root_audio_and_metadata(tree, tmp_path):
    with pytest.raises(
        DatasetError, match="UrbanSound8K root: folder .* does not exist.*urbansounddataset"
    ):
        load_manifest(tmp_path / "nowhere", DataConfig())
    metadata(tree).unlink()
    with pytest.raises(
        DatasetError,
        match=r"UrbanSound8K metadata: file .*metadata/UrbanSound8K\.csv does not exist",
    ):
        load_manifest(tree, DataConfig())
    shutil.rmtree(tree / "audio")
    with pytest.raises(
        DatasetError, match=r"audio folder \(audio/fold1..fold10\): folder .*audio does not exist"
    ):
        load_manifest(tree, DataConfig())
