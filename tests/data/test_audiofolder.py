"""--dataset audiofolder: a user's own DIR/<label>/*.wav (and optional metadata.csv) trains without
a loader."""

import json
import logging
import shutil

import numpy as np
import pytest
import soundfile as sf

from fedac.cli import main
from fedac.config import load_config
from fedac.data.audiofolder import load_manifest
from fedac.data.corrupt import corrupt_training_labels
from fedac.data.partition import partition
from fedac.data.registry import load_manifest as load_configured
from fedac.errors import ConfigError, DatasetError

LABELS = ("car", "bird", "dog")  # not in sorted order: classes must come out sorted
CLIENTS = ("ann", "bob", "cid", "dee")
CLIPS = 3


@pytest.fixture(scope="module")
def audio_root(tmp_path_factory):
    """3 labels x 4 speakers x 3 clips of 0.3-0.6 s tones in noise at 8, 16 and 22.05 kHz; one clip
    is stereo, one is FLAC and one OGG. A stray text file sits beside the clips."""
    root = tmp_path_factory.mktemp("audiofolder")
    rng = np.random.default_rng(0)
    for li, label in enumerate(LABELS):
        (root / label).mkdir()
        (root / label / "notes.txt").write_text("not audio\n")
        for ci, client in enumerate(CLIENTS):
            for k in range(CLIPS):
                rate = (8000, 16000, 22050)[k]
                t = np.arange(int(rate * (0.3 + 0.1 * k))) / rate
                x = 0.3 * np.sin(2 * np.pi * (300 + 250 * li) * t) + 0.02 * rng.standard_normal(
                    len(t)
                )
                ext = {(0, 0, 0): "flac", (1, 0, 0): "ogg"}.get((li, ci, k), "wav")
                if (li, ci, k) == (2, 0, 0):
                    x = np.stack([x, 0.5 * x], axis=1)
                sf.write(root / label / f"{client}_{k}.{ext}", x, rate)
    return root


def cfg_for(root, *settings):
    return load_config(None, [f"data.root={root}", *settings], dataset="audiofolder")


def clip_rows(root):
    """(file relative to root, label, client) of every clip of the fixture, in path order."""
    return [
        (f"{label}/{client}_{k}.{ext}", label, client)
        for label in sorted(LABELS)
        for client in CLIENTS
        for k in range(CLIPS)
        for ext in [next(p.suffix[1:] for p in (root / label).glob(f"{client}_{k}.*"))]
    ]


def with_metadata(tmp_path, audio_root, text):
    root = tmp_path / "data"
    shutil.copytree(audio_root, root)
    (root / "metadata.csv").write_text(text)
    return root


def test_folders_without_metadata_split_clips_and_deal_clients(audio_root, caplog):
    cfg = cfg_for(audio_root, "data.num_clients=4")
    with caplog.at_level(logging.WARNING):
        manifest = load_configured(cfg)
    assert manifest.classes == sorted(LABELS) and manifest.name == "audiofolder"
    assert len(manifest.clips) == 36  # the FLAC, OGG and stereo clips are listed, notes.txt is not
    assert {p.split(".")[-1] for p in (c.path for c in manifest.clips)} == {"wav", "flac", "ogg"}
    assert manifest.counts() == {"train": 28, "val": 4, "test": 4}  # 10% each, drawn over clips
    warning = [r.getMessage() for r in caplog.records if r.name == "fedac.data.audiofolder"]
    assert (
        len(warning) == 1
        and "10% validation / 10% test" in warning[0]
        and "over clips" in warning[0]
    )
    dealt = [r.getMessage() for r in caplog.records if r.name == "fedac.data.registry"]
    assert (
        len(dealt) == 1
        and "28 training clips dealt at random (IID) over data.num_clients=4 clients" in dealt[0]
    )
    # 4 is the user's
    assert "train.fraction 0.1 -> 1" in dealt[0] and "data.num_clients 50" not in dealt[0]
    assert load_manifest(audio_root, cfg.data) == manifest  # seeded: the same split every time
    # default (natural) partition: training clips dealt IID over data.num_clients
    clients = partition(manifest, cfg.data, seed=0)
    assert [len(c.train) + len(c.holdout) for c in clients] == [7, 7, 7, 7]
    dirichlet = partition(
        manifest,
        cfg_for(
            audio_root, "data.partition=dirichlet", "data.num_clients=3", "data.min_client_size=2"
        ).data,
        seed=0,
    )
    assert len(dirichlet) == 3 and sum(len(c.train) + len(c.holdout) for c in dirichlet) == 28


def test_client_column_gives_natural_clients_and_a_client_disjoint_split(
    tmp_path, audio_root, caplog
):
    root = with_metadata(
        tmp_path,
        audio_root,
        "file,label,client\n"
        + "".join(f"{f},{label},{client}\n" for f, label, client in clip_rows(audio_root)),
    )
    cfg = cfg_for(root)
    with caplog.at_level(logging.WARNING):
        manifest = load_configured(cfg)
    by_client = {}
    for clip in manifest.clips:
        by_client.setdefault(clip.client, set()).add(clip.split)
    assert sorted(by_client) == list(CLIENTS)
    assert sorted(s for splits in by_client.values() for s in splits) == [
        "test",
        "train",
        "train",
        "val",
    ]
    assert "client-disjoint" in caplog.text and "num_clients" not in caplog.text
    clients = partition(manifest, cfg.data, seed=0)
    assert sorted(c.name for c in clients) == sorted(
        c for c, s in by_client.items() if s == {"train"}
    )


def test_split_column_is_honoured_and_metadata_is_the_source_of_truth(tmp_path, audio_root, caplog):
    rows = clip_rows(audio_root)[::2]  # metadata lists half the clips: the others are left out
    # split values are case-blind
    split_of = dict(zip(CLIENTS, ("train", "validation", "test", "Train")))
    root = with_metadata(
        tmp_path,
        audio_root,
        "\ufefffile,label,client,split,comment\n"
        + "".join(f"{f},{label},{client},{split_of[client]},x\n" for f, label, client in rows),
    )
    with caplog.at_level(logging.WARNING):
        manifest = load_configured(cfg_for(root))
    assert len(manifest.clips) == len(rows) and caplog.text == ""
    for clip, (f, label, client) in zip(manifest.clips, rows):
        assert (
            clip.path == str(root / f)
            and manifest.classes[clip.label] == label
            and clip.client == client
        )
        assert clip.split == {"validation": "val"}.get(split_of[client], split_of[client].lower())


def test_label_errors_and_noise_reach_audiofolder_clips(audio_root):
    cfg = cfg_for(audio_root, "data.num_clients=4")
    manifest = load_configured(cfg)
    splits = partition(manifest, cfg.data, seed=0)
    true = np.array([c.label for c in manifest.clips])
    noisy = corrupt_training_labels(manifest, splits, 0.5, seed=0)
    train = [i for s in splits for i in s.train]
    held = [i for i in range(len(true)) if i not in set(train)]
    assert (noisy[train] != true[train]).any() and (noisy[held] == true[held]).all()


def metadata_error(tmp_path, audio_root, text):
    with pytest.raises(DatasetError) as info:
        load_manifest(with_metadata(tmp_path, audio_root, text), cfg_for(tmp_path).data)
    return str(info.value)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("file,client\nbird/ann_0.wav,ann\n", ["metadata.csv line 1", "lacks column(s) label"]),
        (
            "file,label\nbird/ann_1.wav,bird\nbird/gone.wav,bird\n",
            ["metadata.csv line 3", "bird/gone.wav", "does not exist"],
        ),
        (
            "file,label,split\nbird/ann_1.wav,bird,train\nbird/ann_2.wav,bird,dev\n",
            ["metadata.csv line 3", "split 'dev'"],
        ),
        (
            "file,label\nbird/ann_1.wav,bird\nbird/ann_1.wav,dog\n",
            ["metadata.csv line 3", "already listed on line 2"],
        ),
        (
            "file,label,client\nbird/ann_1.wav,bird,\n",
            ["metadata.csv line 2", "client column is empty"],
        ),
        (
            "file,label\nbird/ann_1.wav,bird,extra\n",
            ["metadata.csv line 2", "3 fields, expected 2"],
        ),
        (
            "file,label,split\nbird/ann_1.wav,bird,train\ndog/ann_1.wav,dog,test\n",
            ["metadata.csv", "no clip has split validation"],
        ),
        ("file,label\n", ["metadata.csv lists no clips"]),
    ],
)
def test_bad_metadata_names_file_and_line(tmp_path, audio_root, text, expected):
    message = metadata_error(tmp_path, audio_root, text)
    assert all(part in message for part in expected), message


def test_bad_folders_are_refused_with_the_folder_named(tmp_path, audio_root):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DatasetError, match="holds no label folders"):
        load_manifest(empty, cfg_for(empty).data)
    root = tmp_path / "silent"
    shutil.copytree(audio_root, root)
    (root / "cat").mkdir()
    (root / "cat" / "readme.txt").write_text("x")
    with pytest.raises(
        DatasetError, match=r"label folder .*cat holds no audio file \(it holds readme.txt\)"
    ):
        load_manifest(root, cfg_for(root).data)
    single = tmp_path / "single"
    shutil.copytree(audio_root / "dog", single / "dog")
    with pytest.raises(DatasetError, match="one label"):
        load_manifest(single, cfg_for(single).data)
    with pytest.raises(ConfigError, match="set data.root=DIR"):
        load_configured(load_config(None, [], dataset="audiofolder"))


def test_run_stats_and_split_devices_from_the_cli(tmp_path, audio_root, fedac_home, capsys):
    assert (
        main(
            [
                "data",
                "stats",
                "audiofolder",
                "--root",
                str(audio_root),
                "--set",
                "data.num_clients=4",
                "--quiet",
            ]
        )
        == 0
    )
    assert "clients: 4, dealt at random (IID) over 4 clients" in capsys.readouterr().out
    out = tmp_path / "run"
    assert (
        main(
            [
                "run",
                "--dataset",
                "audiofolder",
                "--set",
                f"data.root={audio_root}",
                "--rounds",
                "2",
                "--quiet",
                "--set",
                "data.num_clients=4",
                "--set",
                "model.name=crnn_tiny",
                "--set",
                "train.local_epochs=1",
                "--set",
                "data.snr_db=20",
                "--set",
                "data.label_error=0.3",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    results = json.loads((out / "results.json").read_text())
    assert results["num_classes"] == 3 and results["clients"] == 4
    # the feature cache keyed like any dataset
    assert list((fedac_home / "features").glob("audiofolder-*"))
    devices = tmp_path / "devices"
    assert (
        main(
            [
                "data",
                "split-devices",
                "audiofolder",
                "--root",
                str(audio_root),
                "--out",
                str(devices),
                "--set",
                "data.num_clients=4",
                "--quiet",
            ]
        )
        == 0
    )
    assert sorted(p.name for p in devices.iterdir() if p.is_dir()) == [
        f"client{k:03d}" for k in range(4)
    ]


def test_unreadable_media_files_are_named_in_one_warning(tmp_path, audio_root, caplog):
    root = tmp_path / "data"
    shutil.copytree(audio_root, root)
    for name in ("bird/ann_9.m4a", "dog/sub/bob_9.m4a", "dog/cid_9.mp4"):
        (root / name).parent.mkdir(exist_ok=True)
        (root / name).write_bytes(b"\x00\x00\x00\x20ftypM4A ")
    with caplog.at_level(logging.WARNING):
        manifest = load_manifest(root, cfg_for(root).data)
    assert len(manifest.clips) == 36  # left out, as before
    warning = [r.getMessage() for r in caplog.records if "cannot read" in r.getMessage()]
    assert len(warning) == 1, caplog.text
    assert "3 file(s)" in warning[0] and "2 .m4a, 1 .mp4" in warning[0] and "ffmpeg" in warning[0]
    assert all(
        name in warning[0] for name in ("bird/ann_9.m4a", "dog/cid_9.mp4", "dog/sub/bob_9.m4a")
    )
    assert "notes.txt" not in caplog.text  # a file that is no audio is passed over in silence
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        load_manifest(audio_root, cfg_for(audio_root).data)
    assert "cannot read" not in caplog.text


def test_labels_that_differ_only_in_case_are_named(tmp_path, audio_root, caplog):
    root = tmp_path / "data"
    shutil.copytree(audio_root, root)
    shutil.copytree(audio_root / "dog", root / "Dog")
    shutil.copytree(audio_root / "bird", root / "BIRD")
    with caplog.at_level(logging.WARNING):
        manifest = load_manifest(root, cfg_for(root).data)
    # still separate classes, as the folders say
    assert manifest.classes == ["BIRD", "Dog", "bird", "car", "dog"]
    warning = [r.getMessage() for r in caplog.records if "differ only in case" in r.getMessage()]
    assert len(warning) == 1 and "BIRD / bird; Dog / dog" in warning[0]
    rows = "".join(
        f"{f},{label.upper() if label == 'car' and f.endswith('_0.wav') else label}\n"
        for f, label, _ in clip_rows(audio_root)
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        load_manifest(
            with_metadata(tmp_path / "meta", audio_root, "file,label\n" + rows), cfg_for(root).data
        )
    assert "labels CAR / car differ only in case and are 2 classes" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        load_manifest(audio_root, cfg_for(audio_root).data)
    assert "differ only in case" not in caplog.text


def test_long_clips_are_named_with_how_they_are_cut(tmp_path, audio_root, fedac_home, caplog):
    from fedac.engine.data import build_federated_data

    root = tmp_path / "data"
    shutil.copytree(audio_root, root)
    rng = np.random.default_rng(1)
    for name, seconds in (("dog/long.wav", 60.0), ("car/sub/longer.flac", 2.5)):
        (root / name).parent.mkdir(exist_ok=True)
        sf.write(root / name, 0.1 * rng.standard_normal(int(16000 * seconds)), 16000)
    cfg = cfg_for(root, "data.num_clients=4")
    with caplog.at_level(logging.WARNING):
        data = build_federated_data(cfg, progress=False)
    warning = [r.getMessage() for r in caplog.records if "longer than" in r.getMessage()]
    assert len(warning) == 1, caplog.text
    assert "2 clip(s) are longer than features.clip_seconds=1 s" in warning[0]
    assert "dog/long.wav (60 windows), car/sub/longer.flac (3 windows)" in warning[0]
    assert "equal hop" in warning[0] and "averaged" in warning[0]
    windows = (
        sum(c.num_samples for c in data.clients)
        + sum(len(c.holdout_y) for c in data.clients)
        + len(data.val.x)
        + len(data.test.x)
    )
    # what the warning says: one window per short clip, 60 and 3 for the long ones
    assert windows == 36 + 60 + 3
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        build_federated_data(cfg_for(audio_root, "data.num_clients=4"), progress=False)
    assert "longer than" not in caplog.text
