"""The pretrained w2v2_s encoder shipped with fedac (models/pretrained/w2v2_s), the default of
`model.encoder_path`, and emotion recognition on SSL encoders from the CLI (issue 16)."""

from __future__ import annotations

import hashlib
import json
import shlex

import numpy as np
import pytest
import soundfile as sf
import torch

from fedac.cli import build_parser, main
from fedac.config import ModelConfig
from fedac.errors import EncoderError
from fedac.experiments.pretrain import CORPUS_SEED_OFFSET
from fedac.experiments.pretrain_settings import settings_from_args
from fedac.models import build_model
from fedac.models.ssl import (
    RANDOM_INIT,
    SHIPPED,
    SHIPPED_WEIGHTS,
    build_encoder,
    resolve_encoder_path,
)

pytestmark = pytest.mark.usefixtures("one_thread")

FOLDER = SHIPPED["w2v2_s"]
RECORD = json.loads((FOLDER / "pretrain.json").read_text())


def _encoder_weights(encoder_path):
    torch.manual_seed(0)
    model = build_model(
        "w2v2_s", 0, 4, 0.0, "classification", ModelConfig(name="w2v2_s", encoder_path=encoder_path)
    )
    return model.encoder.state_dict()


def test_shipped_weights_match_their_recorded_checksum():
    digest = hashlib.sha256((FOLDER / SHIPPED_WEIGHTS).read_bytes()).hexdigest()
    assert digest == RECORD["sha256"]
    assert RECORD["settings"]["model"] == "w2v2_s"
    assert RECORD["parameters"] == sum(
        p.numel() for p in build_encoder("w2v2_s", None).parameters()
    )
    assert str(RECORD["sha256"]) in (FOLDER / "README.md").read_text()


def test_the_recorded_command_is_one_the_cli_accepts_and_gives_the_recorded_settings():
    argv = shlex.split(RECORD["command"])
    assert argv[:2] == ["fedac", "pretrain"]
    args = build_parser().parse_args(argv[1:])
    assert args.func.__name__ == "cmd_pretrain"
    assert vars(settings_from_args(args)) == RECORD["settings"]
    assert RECORD["command"] in (FOLDER / "README.md").read_text()


def test_w2v2_s_loads_the_shipped_encoder_by_default_and_random_on_request():
    from safetensors.torch import load_file

    stored = load_file(str(FOLDER / SHIPPED_WEIGHTS))
    default = _encoder_weights(None)
    assert all(torch.equal(value, stored[f"encoder.{key}"]) for key, value in default.items())
    random = _encoder_weights(RANDOM_INIT)
    weights = [k for k in default if k.endswith("weight") and "layer_norm" not in k]
    assert all(not torch.equal(default[k], random[k]) for k in weights)
    # sizes without a shipped encoder stay random
    assert resolve_encoder_path("w2v2_tiny", None) is None
    assert resolve_encoder_path("w2v2_s", "/my/ckpt") == "/my/ckpt"


def test_a_missing_shipped_file_names_it_and_the_ways_out(monkeypatch, tmp_path):
    monkeypatch.setitem(SHIPPED, "w2v2_s", tmp_path / "gone")
    with pytest.raises(EncoderError) as err:
        build_encoder("w2v2_s", None)
    message = str(err.value)
    assert str(tmp_path / "gone" / SHIPPED_WEIGHTS) in message
    assert "model.encoder_path=DIR" in message and f"model.encoder_path={RANDOM_INIT}" in message
    # random init needs no file
    assert build_encoder("w2v2_s", RANDOM_INIT).config.hidden_size == 128


def _signature(talker):
    return talker.voice, round(talker.pitch, 6), round(talker.rate, 6)


def test_pretraining_speakers_are_none_of_the_downstream_stand_in_speakers():
    from fedac.data.synth.sentences import talkers

    s = RECORD["settings"]
    pretraining = {
        _signature(t)
        for t in talkers(
            np.random.default_rng([CORPUS_SEED_OFFSET + s["seed"], 1]), s["speakers"] + 3
        )
    }
    # the embedded stand-in
    librispeech = {_signature(t) for t in talkers(np.random.default_rng([0, 1]), 100 + 3 * 10)}
    assert len(pretraining) == s["speakers"] + 3 and not pretraining & librispeech


# --------------------------------------------------------------------------- emotion recognition


@pytest.fixture(scope="module")
def cremad_root(tmp_path_factory):
    """30 CREMA-D actors, the four task emotions once each: 0.2 s tones whose pitch is the
    emotion."""
    root = tmp_path_factory.mktemp("cremad")
    (root / "AudioWAV").mkdir()
    rng = np.random.default_rng(0)
    t = np.arange(3200)
    for actor in range(1001, 1031):
        for i, emotion in enumerate(("ANG", "HAP", "SAD", "NEU")):
            wave = 0.1 * np.sin(t * (0.05 + 0.03 * i)) + 0.01 * rng.standard_normal(t.size)
            sf.write(
                root / "AudioWAV" / f"{actor}_DFA_{emotion}_XX.wav", wave.astype(np.float32), 16000
            )
    return root


@pytest.mark.slow
@pytest.mark.parametrize("model", ["w2v2_tiny", "w2v2_s"])
def test_emotion_recognition_on_ssl_encoders_from_the_cli(
    cremad_root, tmp_path, monkeypatch, model
):
    from fedac.models import ssl

    loaded = []
    monkeypatch.setattr(
        ssl,
        "load_encoder",
        lambda path, dropout=None, real=ssl.load_encoder: (
            loaded.append(path) or real(path, dropout)
        ),
    )
    out = tmp_path / "er"
    assert (
        main(
            [
                "run",
                "--quiet",
                "--dataset",
                "cremad",
                "--rounds",
                "1",
                "--out",
                str(out),
                "--set",
                f"data.root={cremad_root}",
                "--set",
                f"model.name={model}",
                "--set",
                "train.optimizer=adamw",
                "--set",
                "train.lr=0.001",
                "--set",
                "train.local_epochs=1",
                "--set",
                "train.batch_size=4",
            ]
        )
        == 0
    )
    results = json.loads((out / "results.json").read_text())
    assert results["num_classes"] == 4 and 0 <= results["final"]["accuracy"] <= 1
    assert np.isfinite(results["history"][0]["train_loss"])
    # w2v2_s starts from the shipped encoder
    assert set(loaded) == ({FOLDER} if model in SHIPPED else set())


# --------------------------------------------------------------------------- Flower


@pytest.mark.slow
def test_in_process_flower_run_of_an_ssl_model_equals_the_simulator(tmp_path, monkeypatch):
    """FedAvg on w2v2_tiny through the ServerApp and two ClientApps in one process
    (flower_helpers.LocalGrid) ends with the simulator's global model and test accuracy."""
    from fedac.engine.simulator import Simulator
    from fedac.flower import clientapp, serverapp
    from fedac.flower.settings import deployment_settings, fedac_config
    from flower_helpers import LocalGrid, use_task_identity
    from gsc_fixture import make_gsc_tree

    use_task_identity(monkeypatch)
    root = make_gsc_tree(tmp_path / "gsc", speakers=4, clips=1)
    settings = {
        "data.root": root,
        "data.cache_dir": tmp_path / "cache",
        "data.partition": "iid",
        "data.num_clients": 2,
        "model.name": "w2v2_tiny",
        "train.local_epochs": 1,
        "train.batch_size": 8,
        "runtime.threads": 1,
        "train.optimizer": "adamw",
        "train.eval_every": 1,
    }
    config = {
        "algorithm": "fedavg",
        "rounds": 2,
        "fraction": 1.0,
        "seed": 3,
        "lr": 0.001,
        "strategy": "fedac",
        "fedac-set": ";".join(f"{k}={v}" for k, v in settings.items()),
        "run-dir": str(tmp_path / "run"),
        "min-nodes": 2,
        "round-timeout": 120.0,
        "node-wait": 60.0,
        "poll-interval": 0.01,
    }
    grid = LocalGrid(
        clientapp.app, {100 + k: {"partition-id": k, "num-partitions": 2} for k in range(2)}, config
    )
    cfg = fedac_config(config)
    cfg.out = str(tmp_path / "run")
    (tmp_path / "run").mkdir()
    results = serverapp.run_deployment(grid, cfg, deployment_settings(config), tmp_path / "run")
    sim = Simulator(fedac_config(config), tmp_path / "sim", progress=False)
    expected = sim.run()
    flower_params = torch.load(tmp_path / "run" / "server_state.pt")["params"]
    assert set(flower_params) == set(sim.state.server["params"])
    for name, value in sim.state.server["params"].items():
        torch.testing.assert_close(flower_params[name], value, rtol=0, atol=1e-5, msg=name)
    assert results["final"]["accuracy"] == pytest.approx(expected["final"]["accuracy"], abs=1e-6)
