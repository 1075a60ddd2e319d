"""--dataset hf: a Hugging Face datasets folder on disk (save_to_disk or parquet) trains like the
other datasets."""

import json
import logging
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from fedac.cli import main
from fedac.config import load_config
from fedac.data.audio import load_audio
from fedac.data.corrupt import corrupt_training_labels
from fedac.data.gsc import WORDS_35
from fedac.data.gsc import load_manifest as load_gsc
from fedac.data.hf import MISSING_PACKAGE, load_manifest
from fedac.data.partition import partition
from fedac.data.registry import load_manifest as load_configured
from fedac.data.synth.speech_commands import generate
from fedac.errors import DatasetError

datasets = pytest.importorskip(
    "datasets",
    reason="datasets is not installed (pip install -e '.[hf]'); --dataset hf tests skipped",
)

WORDS = ("yes", "no", "stop", "go")  # 16-20 clips each in the 6-speaker stand-in
NAMES = [*WORDS_35, "_silence_"]  # the datasets library's speech_commands v0.02 ClassLabel
RUN = ["--rounds", "2", "--quiet", "--set", "model.name=crnn_tiny", "--set", "train.local_epochs=1"]


@pytest.fixture(scope="module")
def synth_root(tmp_path_factory):
    """The synthetic Speech Commands stand-in, 6 speakers (4 train, 1 validation, 1 test)."""
    root = tmp_path_factory.mktemp("synth_gsc")
    generate(root, speakers=6, seed=0, workers=1, progress=False)
    return root


def speech_commands_rows(root):
    """split -> the stand-in's clips of WORDS as the datasets library's speech_commands writes
    them."""
    held = {
        name: set((root / f"{name}_list.txt").read_text().split())
        for name in ("validation", "testing")
    }
    rows = {"train": [], "validation": [], "test": []}
    for word in WORDS:
        for path in sorted((root / word).glob("*.wav")):
            rel = f"{word}/{path.name}"
            split = (
                "validation"
                if rel in held["validation"]
                else "test"
                if rel in held["testing"]
                else "train"
            )
            speaker, _, n = path.stem.split("_")
            rows[split].append(
                {
                    "file": rel,
                    "audio": {"bytes": path.read_bytes(), "path": rel},
                    "label": NAMES.index(word),
                    "is_unknown": False,
                    "speaker_id": speaker,
                    "utterance_id": int(n),
                }
            )
    return rows


def hf_table(rows, **casts):
    """A Dataset from row dicts; Audio / ClassLabel are cast on (encoding through them needs
    torchcodec)."""
    table = datasets.Dataset.from_list(rows)
    for column, feature in casts.items():
        table = table.cast_column(column, feature)
    return table


@pytest.fixture(scope="module")
def gsc_dict(synth_root, tmp_path_factory):
    """speech_commands as DatasetDict.save_to_disk writes it."""
    out = tmp_path_factory.mktemp("hf") / "speech_commands"
    splits = {
        name: hf_table(rows, audio=datasets.Audio(), label=datasets.ClassLabel(names=NAMES))
        for name, rows in speech_commands_rows(synth_root).items()
    }
    datasets.DatasetDict(splits).save_to_disk(str(out))
    return out


@pytest.fixture(scope="module")
def flat_rows(synth_root):
    """One table, no split, no speaker: {array, sampling_rate} audio, string labels."""
    rows = []
    for word in WORDS:
        for path in sorted((synth_root / word).glob("*.wav"))[:10]:
            audio = load_audio(path, sample_rate=None)
            rows.append(
                {
                    "audio": {"array": audio.tolist(), "sampling_rate": 16000},
                    "label": word,
                    "speaker": path.stem.split("_")[0],
                }
            )
    return rows


@pytest.fixture(scope="module")
def flat_root(flat_rows, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "flat"
    hf_table(flat_rows).save_to_disk(str(out))
    return out


def cfg_for(root, *settings):
    return load_config(None, [f"data.root={root}", *settings], dataset="hf")


def described(manifest):
    """(split, client, label name) of every clip."""
    return [(c.split, c.client, manifest.classes[c.label]) for c in manifest.clips]


def test_speech_commands_dict_trains_like_the_official_layout(synth_root, gsc_dict, caplog):
    with caplog.at_level(logging.WARNING):
        manifest = load_configured(cfg_for(gsc_dict))
    assert caplog.text == ""  # splits and speakers come from the data: nothing drawn
    # ClassLabel order
    assert manifest.name == "hf" and manifest.classes == [n for n in NAMES if n in WORDS]
    official = load_gsc(synth_root, cfg_for(synth_root).data)
    expected = {
        (Path(c.path).parent.name, Path(c.path).name): (
            c.split,
            c.client,
            official.classes[c.label],
        )
        for c in official.clips
        if official.classes[c.label] in WORDS
    }
    rows = [
        (split, r["file"]) for split, part in speech_commands_rows(synth_root).items() for r in part
    ]
    assert len(manifest.clips) == len(expected) == len(rows)
    assert described(manifest) == [expected[tuple(file.split("/"))] for _, file in rows]
    # the same audio, resampled like any file
    for clip, (_, file) in list(zip(manifest.clips, rows))[::25]:
        for rate in (16000, 8000):
            np.testing.assert_array_equal(
                load_audio(clip.path, rate), load_audio(synth_root / file, rate)
            )
    # the cache gives the same files
    assert load_manifest(gsc_dict, cfg_for(gsc_dict).data) == manifest


def test_parquet_files_split_by_name_give_the_same_manifest(gsc_dict, tmp_path):
    root = tmp_path / "parquet"
    (root / "data").mkdir(parents=True)
    for split, table in datasets.load_from_disk(str(gsc_dict)).items():
        table.to_parquet(str(root / "data" / f"{split}-00000-of-00001.parquet"))
    saved, parquet = load_configured(cfg_for(gsc_dict)), load_configured(cfg_for(root))
    assert parquet.classes == saved.classes and described(parquet) == described(saved)
    assert all(
        Path(c.path).parent.parent.parent == Path(parquet.clips[0].path).parent.parent.parent
        for c in parquet.clips
    )  # one cache folder per dataset, never the other dataset's
    assert {Path(c.path).parent.parent.parent for c in saved.clips}.isdisjoint(
        {Path(c.path).parent.parent.parent for c in parquet.clips}
    )
    (root / "data" / "dev-00000-of-00001.parquet").write_bytes(
        (root / "data" / "test-00000-of-00001.parquet").read_bytes()
    )
    with pytest.raises(DatasetError, match=r"dev-00000-of-00001.parquet: unknown split name 'dev'"):
        load_configured(cfg_for(root))


def test_no_split_no_speaker_draws_a_split_and_deals_clients(
    flat_root, flat_rows, tmp_path, caplog
):
    cfg = cfg_for(flat_root, "data.num_clients=3")
    with caplog.at_level(logging.WARNING):
        manifest = load_configured(cfg)
    assert manifest.classes == sorted(WORDS) and len(manifest.clips) == len(flat_rows)
    assert manifest.counts() == {"train": 32, "val": 4, "test": 4}
    assert (
        "10% validation / 10% test split drawn over clips" in caplog.text
        and "data.num_clients=3" in caplog.text
    )
    assert [len(c.train) + len(c.holdout) for c in partition(manifest, cfg.data, seed=0)] == [
        11,
        11,
        10,
    ]
    iid = partition(
        manifest, cfg_for(flat_root, "data.partition=iid", "data.num_clients=4").data, seed=0
    )
    dirichlet = partition(
        manifest,
        cfg_for(
            flat_root, "data.partition=dirichlet", "data.num_clients=2", "data.min_client_size=2"
        ).data,
        seed=0,
    )
    assert len(iid) == 4 and len(dirichlet) == 2
    # the array's values reach the pipeline exactly (float WAV in the cache)
    np.testing.assert_array_equal(
        load_audio(manifest.clips[0].path, None),
        np.asarray(flat_rows[0]["audio"]["array"], np.float32),
    )
    # flipping data.speaker_column: the 'speaker' column becomes the natural client, split
    # client-disjoint
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        by_speaker = load_configured(cfg_for(flat_root, "data.speaker_column=speaker"))
    speakers = {r["speaker"] for r in flat_rows}
    assert {c.client for c in by_speaker.clips} == speakers and "client-disjoint" in caplog.text
    assert all(len({c.split for c in by_speaker.clips if c.client == s}) == 1 for s in speakers)
    # parquet without split names: the same draw
    single = tmp_path / "single"
    single.mkdir()
    datasets.load_from_disk(str(flat_root)).to_parquet(str(single / "clips.parquet"))
    assert described(load_configured(cfg_for(single, "data.num_clients=3"))) == described(manifest)


def test_noise_label_errors_and_feature_cache_reach_hf_clips(flat_root, tmp_path, fedac_home):
    cfg = cfg_for(flat_root, "data.num_clients=3")
    manifest = load_configured(cfg)
    splits = partition(manifest, cfg.data, seed=0)
    true = np.array([c.label for c in manifest.clips])
    noisy = corrupt_training_labels(manifest, splits, 0.5, seed=0)
    train = [i for s in splits for i in s.train]
    assert (noisy[train] != true[train]).any()
    # a rewritten dataset at the same folder gets new clip files, hence a new feature-cache key
    rows = datasets.load_from_disk(str(flat_root)).to_list()
    for row in rows:
        row["audio"]["array"] = [0.5 * x for x in row["audio"]["array"]]
    other = tmp_path / "rewritten"
    hf_table(rows).save_to_disk(str(other))
    again = load_configured(cfg_for(other, "data.num_clients=3"))
    assert described(again) == described(manifest)
    assert not {c.path for c in again.clips} & {c.path for c in manifest.clips}
    np.testing.assert_allclose(
        load_audio(again.clips[0].path, None),
        0.5 * load_audio(manifest.clips[0].path, None),
        atol=1e-6,
    )


def test_run_and_split_devices_from_the_cli(gsc_dict, flat_root, tmp_path, fedac_home):
    out = tmp_path / "speakers"
    assert (
        main(
            [
                "run",
                "--dataset",
                "hf",
                "--set",
                f"data.root={gsc_dict}",
                *RUN,
                "--out",
                str(out),
                "--set",
                "data.snr_db=20",
                "--set",
                "data.label_error=0.3",
            ]
        )
        == 0
    )
    results = json.loads((out / "results.json").read_text())
    # the stand-in's 4 training speakers
    assert results["num_classes"] == 4 and results["clients"] == 4
    assert list((fedac_home / "features").glob("hf-*"))
    out = tmp_path / "dealt"
    assert (
        main(
            [
                "run",
                "--dataset",
                "hf",
                "--set",
                f"data.root={flat_root}",
                "--set",
                "data.num_clients=3",
                *RUN,
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert json.loads((out / "results.json").read_text())["clients"] == 3
    devices = tmp_path / "devices"
    assert (
        main(
            [
                "data",
                "split-devices",
                "hf",
                "--root",
                str(flat_root),
                "--out",
                str(devices),
                "--set",
                "data.num_clients=3",
                "--quiet",
            ]
        )
        == 0
    )
    assert sorted(p.name for p in devices.iterdir() if p.is_dir()) == [
        f"client{k:03d}" for k in range(3)
    ]


def broken(flat_rows, tmp_path, row=5):
    rows = [dict(r) for r in flat_rows]
    rows[row] = dict(rows[row], audio={"bytes": b"RIFF not a wav", "path": "bad.wav"})
    for r in rows:
        if "array" in r["audio"]:
            r["audio"] = {"bytes": _wav(r["audio"]["array"]), "path": None}
    out = tmp_path / "broken"
    hf_table(rows, audio=datasets.Audio()).save_to_disk(str(out))
    return out


def _wav(array):
    import io

    import soundfile as sf

    buffer = io.BytesIO()
    sf.write(buffer, np.asarray(array, np.float32), 16000, format="WAV")
    return buffer.getvalue()


def test_an_unreadable_clip_is_named_by_row_or_skipped(flat_rows, tmp_path, caplog):
    root = broken(flat_rows, tmp_path)
    with pytest.raises(
        DatasetError, match=re.escape(f"hf {root} row 5: its audio cannot be decoded")
    ):
        load_configured(cfg_for(root))
    with caplog.at_level(logging.WARNING):
        manifest = load_configured(cfg_for(root, "data.on_bad_file=skip"))
    # screen_manifest drops it later
    assert "row 5" in caplog.text and len(manifest.clips) == len(flat_rows)
    # the cached clips still refuse it under on_bad_file=error
    with pytest.raises(DatasetError, match="row 5"):
        load_configured(cfg_for(root))
    out = tmp_path / "run"
    assert (
        main(
            [
                "run",
                "--dataset",
                "hf",
                "--set",
                f"data.root={root}",
                "--set",
                "data.on_bad_file=skip",
                *RUN,
                "--set",
                "data.num_clients=3",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert len((out / "bad_files.txt").read_text().strip().splitlines()) == 1


def test_bad_columns_and_splits_are_named(flat_root, flat_rows, tmp_path):
    with pytest.raises(
        DatasetError,
        match=r"no audio column 'clip' \(data.audio_column\); its columns are "
        r"audio, label, speaker",
    ):
        load_configured(cfg_for(flat_root, "data.audio_column=clip"))
    renamed = tmp_path / "renamed"
    hf_table([{"clip": r["audio"], "word": r["label"]} for r in flat_rows]).save_to_disk(
        str(renamed)
    )
    with pytest.raises(
        DatasetError, match=r"no audio column 'audio' .* its columns are clip, word"
    ):
        load_configured(cfg_for(renamed))
    with pytest.raises(DatasetError, match=r"no label column 'label' \(data.label_column\)"):
        load_configured(cfg_for(renamed, "data.audio_column=clip"))
    assert (
        len(
            load_configured(
                cfg_for(renamed, "data.audio_column=clip", "data.label_column=word")
            ).clips
        )
        == 40
    )
    with pytest.raises(DatasetError, match=r"no speaker column 'who'"):
        load_configured(cfg_for(flat_root, "data.speaker_column=who"))
    odd = tmp_path / "odd"
    table = datasets.load_from_disk(str(flat_root))
    datasets.DatasetDict({"train": table, "holdout": table}).save_to_disk(str(odd))
    with pytest.raises(DatasetError, match=r"split holdout: unknown split name 'holdout'"):
        load_configured(cfg_for(odd))
    unlabelled = tmp_path / "unlabelled"
    hf_table(
        [dict(r, label=-1 if i == 3 else 0) for i, r in enumerate(flat_rows)],
        label=datasets.ClassLabel(names=list(WORDS)),
    ).save_to_disk(str(unlabelled))
    with pytest.raises(DatasetError, match=r"row 3: label -1 is not a class of its ClassLabel"):
        load_configured(cfg_for(unlabelled))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(
        DatasetError, match="holds no dataset_dict.json, state.json or parquet file"
    ):
        load_configured(cfg_for(empty))


def test_without_the_datasets_package_the_error_says_how_to_install(flat_root, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` now raises ImportError
    with pytest.raises(DatasetError) as info:
        load_configured(cfg_for(flat_root))
    assert str(info.value) == MISSING_PACKAGE
    assert main(["run", "--dataset", "hf", "--set", f"data.root={flat_root}", "--quiet"]) == 2


def test_training_rows_without_a_speaker_join_seeded_training_speakers(flat_rows, tmp_path, caplog):
    """Like the datasets library's speech_commands, whose _silence_ rows have speaker_id None."""
    root = tmp_path / "orphans"
    hf_table(
        [dict(r, speaker=None if i % 10 == 0 else r["speaker"]) for i, r in enumerate(flat_rows)]
    ).save_to_disk(str(root))
    with caplog.at_level(logging.WARNING):
        manifest = load_configured(cfg_for(root, "data.speaker_column=speaker"))
    speakers = {r["speaker"] for i, r in enumerate(flat_rows) if i % 10}
    train = [c for c in manifest.clips if c.split == "train"]
    assert {c.client for c in train} <= speakers and all(c.client for c in train)
    assert "without a client given to seeded training clients" in caplog.text
