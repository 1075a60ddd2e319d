"""A small folder of clips without client ids learns at the defaults (registry.fit_dealt_clients),
an explicit setting is never changed, natural clients are never touched; the run says why a held-out
metric has no value; `fedac data stats` labels dealt clients honestly."""

import json
import logging
import math

import numpy as np
import pytest
import yaml

from fedac.cli import main
from fedac.config import Config, load_config
from fedac.data.layout import dealt_client_count, user_manifest, write_wav
from fedac.data.registry import explicit, load_manifest
from fedac.data.synth import speech_commands as synth
from fedac.engine.report import final_table, unavailable

WORDS = ("yes", "no", "up", "down", "left", "right")


def spoken_folder(root, per_word=30, seed=0):
    """DIR/<word>/<speaker>.wav: the synthetic Speech Commands generator's espeak speakers (one clip
    of each word per speaker, `per_word` speakers), the layout a user's own recordings would
    have."""
    speakers = synth._plan(per_word, seed)
    for w, word in enumerate(WORDS):
        (root / word).mkdir(parents=True)
        for spk in speakers:
            rng = np.random.default_rng([seed, w, spk.index])
            write_wav(root / word / f"{spk.speaker_id}.wav", synth._clip(word, spk, rng))
    return root


def silent_folder(root, per_word, words=WORDS):
    """Labels and file names only (nothing here decodes audio): 10 ms of silence per clip."""
    for word in words:
        (root / word).mkdir(parents=True)
        for k in range(per_word):
            write_wav(root / word / f"c{k:03d}.wav", np.zeros(160))
    return root


def cfg_for(root, *settings, path=None):
    return load_config(path, [f"data.root={root}", *settings], dataset="audiofolder")


@pytest.fixture(scope="module")
def small_root(tmp_path_factory):
    # 180 clips: 144 train, 18 val, 18 test
    return silent_folder(tmp_path_factory.mktemp("small"), 30)


def test_learns_at_the_defaults(tmp_path, fedac_home):
    """6 words x 30 clips, no metadata, --rounds 5, every other setting at its default. Before the
    defaults were fitted (50 clients of 2-3 clips, 5 a round) this run tested 4/18 = 22.2% (chance
    16.7%; 11-22% over run seeds 0-2); fitted (3 clients of 48 clips, all of them a round) 10/18 =
    55.6%. Over run seeds 0-4 on three generated folders (15 runs, CPU) 33.3-55.6%, mean 45%: the
    threshold, twice chance (6/18), is the lowest of those; this folder and seed sit 4 clips above
    it, room for another machine's float rounding (which moves a run far less than another seed
    does)."""
    root = spoken_folder(tmp_path / "words")
    out = tmp_path / "run"
    assert (
        main(
            [
                "run",
                "--dataset",
                "audiofolder",
                "--set",
                f"data.root={root}",
                "--rounds",
                "5",
                "--quiet",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    results = json.loads((out / "results.json").read_text())
    assert results["final"]["accuracy"] >= 2 / len(WORDS) - 1e-9, results["final"]
    assert results["clients"] == 3 and results["final"]["client_accuracy_mean"] is not None
    saved = yaml.safe_load((out / "config.yaml").read_text())  # what --resume and re-runs read back
    assert saved["data"]["num_clients"] == 3 and saved["train"]["fraction"] == 1.0
    assert load_config(out / "config.yaml").data.num_clients == 3


def test_dealt_client_count_rule():
    # one client per 40 training clips, at least 2, at most the default 50
    assert [dealt_client_count(n, 50) for n in (0, 1, 79, 80, 144, 1999, 2000, 10**6)] == [
        2,
        2,
        2,
        2,
        3,
        49,
        50,
        50,
    ]
    assert dealt_client_count(10**6, 7) == 7


def test_small_folder_defaults_adapt_and_say_why(small_root, caplog):
    cfg = cfg_for(small_root)
    with caplog.at_level(logging.WARNING):
        manifest = load_manifest(cfg)
    assert cfg.data.num_clients == 3 and cfg.train.fraction == 1.0
    lines = [r.getMessage() for r in caplog.records if r.name == "fedac.data.registry"]
    assert (
        len(lines) == 1
        and "data.num_clients 50 -> 3" in lines[0]
        and "train.fraction 0.1 -> 1" in lines[0]
    )
    assert (
        "2-3 each" in lines[0]
        and "dealt at random (IID) over data.num_clients=3 clients" in lines[0]
    )
    train = manifest.split_indices("train")
    assert len(train) == 144 and sorted({manifest.clips[i].client for i in train}) == [
        "client000",
        "client001",
        "client002",
    ]
    # dealt again over 3: the very clients the loader deals when told 3
    assert manifest == load_manifest(cfg_for(small_root, "data.num_clients=3"))
    # loading again (stats, then the run's data) changes nothing further
    assert load_manifest(cfg) == manifest and cfg.data.num_clients == 3


@pytest.mark.parametrize(
    "settings, clients, fraction",
    [
        # set to the default value: still the user's (5 of 50 a round already)
        (["data.num_clients=50"], 50, 0.1),
        (["data.num_clients=10"], 10, 0.5),  # clients set, fraction not: at least 5 a round
        (["train.fraction=0.1"], 3, 0.1),  # fraction set, clients not
        (["data.num_clients=10", "train.fraction=0.2"], 10, 0.2),
        (["data.max_clients=2"], 3, 1.0),  # 2 of the 3 clients kept: both trained
    ],
)
def test_an_explicit_setting_is_never_overridden(small_root, settings, clients, fraction):
    cfg = cfg_for(small_root, *settings)
    load_manifest(cfg)
    assert (cfg.data.num_clients, cfg.train.fraction) == (clients, pytest.approx(fraction))


def test_a_config_file_setting_counts_as_explicit(small_root, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("data:\n  num_clients: 50\n")
    cfg = cfg_for(small_root, path=path)
    assert explicit(cfg, "data.num_clients") and not explicit(cfg, "train.fraction")
    load_manifest(cfg)
    assert cfg.data.num_clients == 50


def test_a_hand_built_config_counts_values_off_the_default_as_explicit():
    cfg = Config()
    assert not explicit(cfg, "data.num_clients")
    cfg.data.num_clients = 4
    assert explicit(cfg, "data.num_clients") and not explicit(cfg, "train.fraction")


def test_natural_clients_and_central_training_are_not_adapted(small_root, tmp_path, gsc_root):
    rows = [(f"{w}/c{k:03d}.wav", w, f"spk{k % 4}") for w in WORDS for k in range(30)]
    (tmp_path / "meta").mkdir()
    meta = silent_folder(tmp_path / "meta", 30)
    (meta / "metadata.csv").write_text(
        "file,label,client\n" + "".join(",".join(r) + "\n" for r in rows)
    )
    cfg = cfg_for(meta)
    manifest = load_manifest(cfg)
    assert not manifest.dealt and (cfg.data.num_clients, cfg.train.fraction) == (50, 0.1)
    gsc = load_config(None, [f"data.root={gsc_root}"])
    assert not load_manifest(gsc).dealt and (gsc.data.num_clients, gsc.train.fraction) == (50, 0.1)
    pooled = cfg_for(small_root, "data.partition=pooled")
    load_manifest(pooled)
    assert (pooled.data.num_clients, pooled.train.fraction) == (50, 0.1)


def test_user_manifest_marks_dealt_clients_only():
    rows = [(f"/x/{k}.wav", "ab"[k % 2], None, None) for k in range(40)]
    dealt, _ = user_manifest("t", "t", "/x", ["a", "b"], rows, False, Config().data, "none", "fix")
    named, _ = user_manifest(
        "t",
        "t",
        "/x",
        ["a", "b"],
        [(p, lab, f"s{k % 3}", s) for k, (p, lab, _, s) in enumerate(rows)],
        True,
        Config().data,
        "none",
        "fix",
    )
    assert dealt.dealt and not named.dealt


def test_stats_says_clients_are_dealt_at_random(small_root, tmp_path, capsys):
    assert main(["data", "stats", "audiofolder", "--root", str(small_root), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "clients: 3, dealt at random (IID) over 3 clients" in out and "natural" not in out
    assert (
        main(
            [
                "data",
                "stats",
                "audiofolder",
                "--root",
                str(small_root),
                "--quiet",
                "--set",
                "data.partition=iid",
                "--set",
                "data.num_clients=4",
            ]
        )
        == 0
    )
    assert "clients (iid): 4" in capsys.readouterr().out


def test_a_nan_held_out_accuracy_says_why(tmp_path, fedac_home):
    """Explicit 50 clients of 144 training clips: 2-3 clips each, floor(0.2 x 3) = 0 held back."""
    root = tmp_path / "tones"
    rng = np.random.default_rng(0)
    for w, word in enumerate(WORDS[:3]):
        (root / word).mkdir(parents=True)
        for k in range(20):
            t = np.arange(4000) / 16000
            write_wav(
                root / word / f"{k}.wav",
                0.3 * np.sin(2 * np.pi * (300 + 200 * w) * t) + 0.01 * rng.standard_normal(4000),
            )
    out = tmp_path / "run"
    assert (
        main(
            [
                "run",
                "--dataset",
                "audiofolder",
                "--set",
                f"data.root={root}",
                "--rounds",
                "1",
                "--quiet",
                "--set",
                "data.num_clients=20",
                "--set",
                "model.name=crnn_tiny",
                "--set",
                "train.local_epochs=1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    results = json.loads((out / "results.json").read_text())
    assert results["final"]["client_accuracy_mean"] is None
    reason = results["unavailable"]["client_accuracy_mean"]
    assert (
        "data.local_holdout=0.2" in reason
        and "below 5 clips" in reason
        and "data.num_clients" in reason
    )
    results["final"]["client_accuracy_mean"] = results["final"]["client_accuracy_std"] = math.nan
    row = next(line for line in final_table(results).splitlines() if "client held-out acc." in line)
    assert "nan" not in row and f"n/a ({reason})" in row


@pytest.mark.parametrize(
    "extra, final, expected",
    [
        ({"clients": 4}, {}, "data.local_holdout=0 holds back no clip"),
        ({"clients": 0}, {}, "holds no client's clips"),
        ({"clients": 4}, {"wer": 0.5}, "CTC task"),
    ],
)
def test_unavailable_names_the_reason(extra, final, expected):
    cfg = Config()
    cfg.data.local_holdout = 0.0
    results = {
        "final": {
            "client_accuracy_mean": math.nan,
            "personalized_local_accuracy_mean": math.nan,
            "accuracy": 0.5,
            **final,
        },
        **extra,
    }
    why = unavailable(results, cfg)
    assert set(why) == {"client_accuracy_mean", "personalized_local_accuracy_mean"}
    assert all(expected in text for text in why.values())
    assert unavailable({"final": {"client_accuracy_mean": 0.5}, "clients": 4}, cfg) == {}


def test_a_comparison_on_a_small_folder_can_be_run_again(small_root, tmp_path, fedac_home):
    """Each run's config.yaml holds the fitted values; run again (to finish a killed table), the
    comparison fits its configs the same way before checking them against those files."""
    args = [
        "compare",
        "--dataset",
        "audiofolder",
        "--set",
        f"data.root={small_root}",
        "--method",
        "A=fedavg",
        "--seeds",
        "0",
        "--rounds",
        "1",
        "--set",
        "model.name=crnn_tiny",
        "--set",
        "train.local_epochs=1",
        "--out",
        str(tmp_path / "cmp"),
        "--quiet",
    ]
    assert main(args) == 0
    saved = yaml.safe_load((tmp_path / "cmp" / "A-s0" / "config.yaml").read_text())
    assert (saved["data"]["num_clients"], saved["train"]["fraction"]) == (3, 1.0)
    assert main(args) == 0
