"""Typed config: defaults < file < flags < --set; every bad key or value names the setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedac.config import Config, load_config, parse_override, save_config
from fedac.errors import ConfigError


def test_defaults_match_the_papers_protocol():
    cfg = Config()
    assert cfg.features.n_mfcc == 40 and cfg.features.n_mels == 40
    assert (
        cfg.features.win_ms == 30.0
        and cfg.features.hop_ms == 10.0
        and cfg.features.sample_rate == 16000
    )
    assert cfg.train.batch_size == 16 and cfg.train.select == "best_val"
    assert cfg.data.snr_db == 100.0


def test_paper_config_holds_fedmlac_schedule():
    """configs/paper.yaml: fedmlac.md 5.2 (5000 rounds, 1 epoch, batch 16, lr 0.01, 20% active, Base
    + Lite)."""
    cfg = load_config(Path(__file__).parents[1] / "configs" / "paper.yaml")
    t = cfg.train
    assert (t.rounds, t.local_epochs, t.batch_size, t.lr, t.fraction, t.momentum) == (
        5000,
        1,
        16,
        0.01,
        0.2,
        0.0,
    )
    assert cfg.model.client_model == "crnn_base" and cfg.fedmlac.plugin_model == "crnn_lite"


def test_precedence_file_then_flags_then_overrides(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(
        "algorithm: fedprox\nseed: 3\ntrain:\n  rounds: 7\n  lr: 0.5\nfedprox:\n  mu: 0.2\n"
    )
    cfg = load_config(path)
    assert (cfg.algorithm, cfg.seed, cfg.train.rounds, cfg.train.lr, cfg.fedprox.mu) == (
        "fedprox",
        3,
        7,
        0.5,
        0.2,
    )
    # untouched settings keep their defaults
    assert cfg.train.batch_size == 16
    cfg = load_config(
        path, ["train.rounds=9", "seed=11"], **{"train.rounds": 8, "seed": 5, "algorithm": "fedavg"}
    )
    assert cfg.train.rounds == 9  # --set wins over the flag
    assert cfg.seed == 11
    assert cfg.algorithm == "fedavg"  # flag wins over the file
    # a None flag (option not given) does not override the file
    cfg = load_config(path, None, algorithm=None, seed=None)
    assert cfg.algorithm == "fedprox" and cfg.seed == 3


def test_override_types_are_coerced():
    cfg = load_config(
        None,
        [
            "train.rounds=12",
            "train.lr=1e-2",
            "data.group_by_source=false",
            "model.heterogeneous=yes",
            "model.zoo=crnn_tiny,crnn_lite",
            "data.root=none",
            "data.max_clients=4",
            "train.fraction=1",
        ],
    )
    assert cfg.train.rounds == 12 and isinstance(cfg.train.rounds, int)
    assert cfg.train.lr == pytest.approx(0.01) and isinstance(cfg.train.lr, float)
    assert cfg.data.group_by_source is False
    assert cfg.model.heterogeneous is True
    assert load_config(None, ["data.group_by_source=0"]).data.group_by_source is False
    assert load_config(None, ["model.heterogeneous=1"]).model.heterogeneous is True
    assert cfg.model.zoo == ["crnn_tiny", "crnn_lite"]
    assert cfg.data.root is None
    assert cfg.data.max_clients == 4
    assert cfg.train.fraction == 1.0 and isinstance(cfg.train.fraction, float)
    # a string setting keeps a YAML-looking value as text
    assert load_config(None, ["data.task=12"]).data.task == "12"


@pytest.mark.parametrize(
    "override, words",
    [
        ("train.roundz=3", ["train.roundz", "train.rounds"]),
        ("nope=1", ["'nope'"]),
        ("train.rounds=abc", ["train.rounds", "int", "abc"]),
        ("train.rounds=2.5", ["train.rounds", "int"]),
        ("train.lr=fast", ["train.lr", "float"]),
        ("data.group_by_source=maybe", ["data.group_by_source", "true/false"]),
        ("data.group_by_source=2", ["data.group_by_source", "true/false"]),
        ("train=3", ["'train'", "section"]),
        ("model.zoo={a: 1}", ["model.zoo", "list"]),
        ("train.rounds=true", ["train.rounds", "int", "True"]),
        ("train.lr=[0.1, 0.2]", ["train.lr", "float"]),
        ("algorithm=[fedavg, fedprox]", ["'algorithm'", "str"]),
    ],
)
def test_bad_overrides_name_the_setting(override, words):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    for word in words:
        assert word in str(info.value)


def test_override_without_equals_sign():
    with pytest.raises(ConfigError, match="key=value"):
        parse_override("train.rounds")
    assert parse_override("a.b= 3") == ("a.b", 3)
    assert parse_override("data.root=") == ("data.root", None)


def test_bad_config_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(scalar)
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("train:\n  epochs: 3\n")
    with pytest.raises(ConfigError, match="train.epochs"):
        load_config(unknown)


def test_saved_config_reloads_identically(tmp_path):
    cfg = load_config(
        None,
        [
            "algorithm=fedadam",
            "train.rounds=3",
            "data.max_clients=5",
            "data.root=/x/y",
            "model.zoo=crnn_tiny",
            "fedopt.tau=0.001",
            "out=runs/a",
        ],
    )
    save_config(cfg, tmp_path / "config.yaml")
    again = load_config(tmp_path / "config.yaml")
    assert again == cfg
    assert again.to_dict() == cfg.to_dict()
    # the default config survives a round trip too (None values, lists, nested sections)
    save_config(Config(), tmp_path / "default.yaml")
    assert load_config(tmp_path / "default.yaml") == Config()


def test_algorithm_defaults_are_a_layer_under_file_flags_and_overrides(tmp_path):
    from fedac.config import algorithm_defaults

    shared = Config().train
    fedmlac = algorithm_defaults("fedmlac")
    cfg = load_config(algorithm="fedmlac")
    assert (cfg.data.max_clients, cfg.train.fraction, cfg.train.rounds) == (
        fedmlac["data.max_clients"],
        fedmlac["train.fraction"],
        fedmlac["train.rounds"],
    )
    assert cfg.train.fraction != shared.fraction  # the layer does change something
    # the algorithm may be named in any layer; every later layer still wins over its defaults
    assert load_config(overrides=["algorithm=fedmlac"]).train.fraction == fedmlac["train.fraction"]
    assert load_config(overrides=["algorithm=fedmlac", "train.fraction=0.3"]).train.fraction == 0.3
    path = tmp_path / "c.yaml"
    path.write_text("algorithm: fedmlac\ntrain:\n  rounds: 7\n")
    from_file = load_config(path)
    assert (from_file.train.rounds, from_file.train.fraction) == (7, fedmlac["train.fraction"])
    # other algorithms, and comparisons (one schedule for every method), keep the shared defaults
    assert load_config(algorithm="fedavg").train == shared
    assert load_config(algorithm="fedmlac", algorithm_defaults=False).train == shared
    # a saved config repeats the run exactly
    save_config(cfg, tmp_path / "saved.yaml")
    assert load_config(tmp_path / "saved.yaml") == cfg


def test_paper_config_keeps_every_client_under_fedmlac():
    paper = Path(__file__).parents[1] / "configs" / "paper.yaml"
    assert load_config(paper, algorithm="fedmlac").data.max_clients is None
    assert load_config(algorithm="fedmlac").data.max_clients == 24


def test_committed_run_configs_still_load_with_every_algorithm_section():
    """Algorithm sections come from the registry now (settings/): a sample of the config.yaml
    files committed under docs/results, from every experiment, loads to a config holding each of its
    sections."""
    import yaml

    from fedac.config import algorithm_sections

    paths = sorted((Path(__file__).parents[1] / "docs" / "results").rglob("config.yaml"))
    assert len(paths) > 100
    for path in paths[::50]:
        saved = yaml.safe_load(path.read_text())
        cfg = load_config(path)
        assert set(saved) <= set(cfg.to_dict()), path
        for section in set(saved) & set(algorithm_sections()):
            expected = {**vars(getattr(Config(), section)), **saved[section]}
            # load_config writes the rounds that run into both keys (test_config_ranges)
            if section == "zeroshot":
                expected["rounds"] = cfg.zeroshot.rounds
            assert vars(getattr(cfg, section)) == expected, (path, section)


@pytest.mark.parametrize(
    "overrides, noted",
    [
        ([], {"num_clients", "alpha", "min_client_size", "group_by_source"}),  # natural speakers
        (["data.partition=dirichlet"], {"min_speaker_clips"}),
        (
            ["data.partition=iid"],
            {"alpha", "min_client_size", "group_by_source", "min_speaker_clips"},
        ),
    ],
)
def test_config_yaml_notes_the_settings_the_partition_does_not_read(tmp_path, overrides, noted):
    """config.yaml marks with a YAML comment each data setting its partition leaves unread (the
    default run's data.num_clients: 50 under 240 natural clients), and still loads as the same
    Config; a user's folder, whose clients only its data tell, gets no note."""
    cfg = load_config(overrides=overrides)
    save_config(cfg, tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text()
    marked = {
        line.split(":")[0].strip() for line in text.splitlines() if "# not applied under" in line
    }
    assert marked == noted
    assert load_config(tmp_path / "config.yaml") == cfg
    save_config(load_config(dataset="audiofolder"), tmp_path / "user.yaml")
    assert "not applied" not in (tmp_path / "user.yaml").read_text()
