"""Early-exit federated fine-tuning (issue 17): the three aggregation modes by hand, exits equal to
the encoder's hidden_states[L], nothing above a client's depth trained or uploaded, depth assignment
settings, every exit evaluated from the CLI, and resume exactness."""

from __future__ import annotations

import json

import pytest
import torch
from test_resume import params_equal, trained_rounds

from fedac.algorithms import build_algorithm
from fedac.algorithms.base import ClientData, Task
from fedac.cli import main
from fedac.config import ModelConfig, load_config
from fedac.data.waveform import Padded
from fedac.engine.data import build_federated_data
from fedac.engine.simulator import Simulator
from fedac.errors import ConfigError
from fedac.models.early_exit import MEMO_BYTES, MultiExitSSL, scaled_exits
from fedac.models.ssl import frame_lengths, size_config, stats_pool
from fedac.rules.exits import exit_aggregate
from fedac.seeding import torch_generator

pytestmark = pytest.mark.usefixtures("one_thread")

CLIENTS = [f"c{i}" for i in range(4)]


# --------------------------------------------------------------------------- aggregation by hand


def _hand_case():
    """Four layers (w2v2_tiny: depths 3/6/12 -> layers 1/2/4), clients A (L=1, n=10), B (L=2, n=20),
    C (L=4, n=30) uploading the value 1, 2, 3 for every tensor they trained; the global value is 5.
    Nobody trains the head of exit 3."""
    names = (
        ["front"]
        + [f"encoder.layers.{i}.w" for i in range(4)]
        + [f"exit_heads.{e}.w" for e in (1, 2, 3, 4)]
    )
    reference = {n: torch.tensor(5.0) for n in names}

    def upload(depth, value):
        keep = (
            {"front"} | {f"encoder.layers.{i}.w" for i in range(depth)} | {f"exit_heads.{depth}.w"}
        )
        return {**{n: torch.tensor(float(value)) for n in keep}, "depth": torch.tensor(depth)}

    return reference, [(upload(1, 1), 10), (upload(2, 2), 20), (upload(4, 3), 30)]


@pytest.mark.parametrize(
    "mode, expected",
    [
        # weights n_i * L_i = 10, 40, 120 over the clients that trained each tensor (Eq. 1)
        (
            "depth_weighted",
            {
                "front": 450 / 170,
                "encoder.layers.0.w": 450 / 170,
                "encoder.layers.1.w": 440 / 160,
                "encoder.layers.2.w": 3,
                "encoder.layers.3.w": 3,
                "exit_heads.1.w": 1,
                "exit_heads.2.w": 2,
                "exit_heads.3.w": 5,
                "exit_heads.4.w": 3,
            },
        ),
        # weights n_i = 10, 20, 30 over the same sets
        (
            "layerwise",
            {
                "front": 140 / 60,
                "encoder.layers.0.w": 140 / 60,
                "encoder.layers.1.w": 130 / 50,
                "encoder.layers.2.w": 3,
                "encoder.layers.3.w": 3,
                "exit_heads.1.w": 1,
                "exit_heads.2.w": 2,
                "exit_heads.3.w": 5,
                "exit_heads.4.w": 3,
            },
        ),
        # full models, untrained tensors = 5, weights n_i over the cohort: deep updates diluted
        (
            "fedavg",
            {
                "front": 140 / 60,
                "encoder.layers.0.w": 140 / 60,
                "encoder.layers.1.w": (50 + 40 + 90) / 60,
                "encoder.layers.2.w": (50 + 100 + 90) / 60,
                "encoder.layers.3.w": 240 / 60,
                "exit_heads.1.w": (10 + 250) / 60,
                "exit_heads.2.w": (50 + 40 + 150) / 60,
                "exit_heads.3.w": 5,
                "exit_heads.4.w": (50 + 100 + 90) / 60,
            },
        ),
    ],
)
def test_exit_aggregation_modes_by_hand(mode, expected):
    reference, uploads = _hand_case()
    out = exit_aggregate(uploads, reference, mode)
    assert set(out) == set(reference)
    for name, value in expected.items():
        assert out[name].item() == pytest.approx(value, abs=1e-6), name


def test_fedavg_of_partial_uploads_equals_fedavg_of_full_models():
    reference, uploads = _hand_case()
    full = [({**reference, **p}, n) for p, n in uploads]
    a, b = exit_aggregate(uploads, reference, "fedavg"), exit_aggregate(full, reference, "fedavg")
    assert all(torch.allclose(a[k], b[k]) for k in reference)


def test_unknown_exit_aggregation_is_refused():
    reference, uploads = _hand_case()
    with pytest.raises(
        ConfigError, match="earlyexit.aggregation must be one of depth_weighted, layerwise, fedavg"
    ):
        exit_aggregate(uploads, reference, "mean")


# --------------------------------------------------------------------------- multi-exit model


def test_exits_scale_to_the_encoder_depth():
    assert scaled_exits([3, 6, 9, 12], 4) == [1, 2, 3, 4]
    assert scaled_exits([3, 6, 9, 12], 12) == [3, 6, 9, 12]
    assert scaled_exits([6, 12], 4) == [2, 4]
    with pytest.raises(ConfigError, match=r"earlyexit.exits=\[0, 13\]"):
        scaled_exits([0, 13], 4)


def test_each_exit_is_hidden_states_of_that_layer_and_runs_nothing_deeper():
    from transformers import Wav2Vec2Model

    torch.manual_seed(0)
    backbone = Wav2Vec2Model(size_config("w2v2_tiny"))
    model = MultiExitSSL(backbone, "classification", 5, [1, 2, 4], freeze_cnn=False).eval()
    samples = torch.tensor([16000, 11200])
    wav = torch.randn(2, 16000) * (torch.arange(16000) < samples[:, None])
    with torch.no_grad():
        ref = backbone(
            wav,
            attention_mask=(torch.arange(16000) < samples[:, None]).long(),
            output_hidden_states=True,
        )
    mask = (
        torch.arange(ref.last_hidden_state.shape[1])
        < frame_lengths(backbone.config, samples)[:, None]
    )
    heads = [model.exit_heads[str(e)].head.weight for e in (1, 2, 4)]
    assert not any(torch.equal(heads[0], h) for h in heads[1:])  # independent heads
    for depth in (1, 2, 4):
        ran = []
        hooks = [
            layer.register_forward_hook(lambda *a, i=i: ran.append(i))
            for i, layer in enumerate(backbone.encoder.layers)
        ]
        model.memo.forget()  # (else the shallower exit's run continues: layers below it not rerun)
        with torch.no_grad():
            hidden, _ = model.use_exit(depth).hidden(Padded(wav, samples))
            logits = model(Padded(wav, samples))
        for hook in hooks:
            hook.remove()
        assert (hidden - ref.hidden_states[depth])[mask].abs().max() < 1e-5
        assert set(ran) == set(range(depth))  # both forwards ran layers[:depth] only
        expected = model.exit_heads[str(depth)].head(stats_pool(ref.hidden_states[depth], mask))
        assert torch.allclose(logits, expected, atol=1e-5)
    assert set(k.split(".")[1] for k in model.state_dict() if k.startswith("exit_heads.")) == {
        "1",
        "2",
        "4",
    }
    assert not any(k.startswith("head.") for k in model.state_dict())  # each head stored once


@pytest.mark.parametrize("kind", ["classification", "verification", "ctc"])
def test_evaluating_every_exit_equals_each_exit_alone_and_runs_each_layer_once_per_batch(kind):
    from transformers import Wav2Vec2Model

    from fedac.engine.data import EvalSplit
    from fedac.training.evaluate import evaluate, evaluate_exits

    torch.manual_seed(0)
    backbone = Wav2Vec2Model(size_config("w2v2_tiny"))
    model = MultiExitSSL(
        backbone,
        "ctc" if kind == "ctc" else "classification",
        29 if kind == "ctc" else 3,
        [1, 2, 4],
        freeze_cnn=False,
    )
    samples = torch.tensor([8000, 5600, 8000, 4000, 7200, 6400])
    wav = torch.randn(6, 8000) * (torch.arange(8000) < samples[:, None])
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    split = EvalSplit(
        Padded(wav, samples),
        torch.arange(6),
        labels,
        kind,
        texts=["ab", "a b", "ba", "b", "ab", "a"] if kind == "ctc" else None,
        trials=torch.tensor(
            [[a, b, int(labels[a] == labels[b])] for a in range(6) for b in range(a + 1, 6)]
        ),
    )
    alone = {}
    for depth in (1, 2, 4):
        model.memo.forget()  # each exit from the start (the model remembers evaluated batches)
        alone[depth] = evaluate(model.use_exit(depth), split, batch_size=4)
    model.memo.forget()
    ran = []
    hooks = [
        layer.register_forward_hook(lambda *a, i=i: ran.append(i))
        for i, layer in enumerate(backbone.encoder.layers)
    ]
    shared = evaluate_exits(model, split, batch_size=4)
    for hook in hooks:
        hook.remove()
    assert shared == alone  # exactly: the same operations on the same batches
    # 2 batches, each layer once per batch (alone: 1+2+4 per batch)
    assert sorted(ran) == sorted(list(range(4)) * 2)
    if kind != "verification":  # (a random encoder's EERs on 15 trials coincide across exits)
        assert len(set(tuple(m.values()) for m in shared.values())) > 1  # the exits do differ


def test_evaluate_views_reports_every_exit_and_leaves_the_model_at_eval_exit():
    """The headline is eval_exit's; the model goes back to eval_exit, since the simulator then
    scores FA / FR and the clients' held-out accuracy with it."""
    from fedac.engine.data import EvalSplit
    from fedac.training.evaluate import evaluate

    algo = _algorithm(**{"earlyexit.mode": "homo", "earlyexit.depth": 6})  # exit 2 of w2v2_tiny's 4
    model = algo.global_model(algo.init_server())
    # cached CNN frames
    frames = Padded(torch.randn(3, 20, model.config.conv_dim[-1]), torch.tensor([20, 14, 20]))
    split = EvalSplit(frames, torch.arange(3), torch.tensor([0, 1, 2]))
    headline, views = algo.evaluate_views(model, split, 2)
    assert model.depth == algo.eval_exit == 2 and set(views) == {"exit1", "exit2", "exit3", "exit4"}
    assert headline == views["exit2"] == evaluate(model, split, 2)


def test_a_shared_pass_restarts_for_a_new_batch_or_a_shallower_exit():
    from transformers import Wav2Vec2Model

    torch.manual_seed(0)
    model = MultiExitSSL(
        Wav2Vec2Model(size_config("w2v2_tiny")), "classification", 3, [1, 2, 4], freeze_cnn=False
    ).eval()
    x, other = (Padded(torch.randn(2, 4000), torch.tensor([4000, 3000])) for _ in range(2))
    with torch.no_grad():
        alone = {(id(b), d): model.hidden(b, d)[0] for b in (x, other) for d in (1, 4)}
        with model.shared_pass():
            for batch, depth in ((x, 4), (x, 1), (other, 1), (other, 4), (x, 4)):
                assert torch.equal(model.hidden(batch, depth)[0], alone[id(batch), depth])


# --------------------------------------------------------------------------- algorithm


def _algorithm(**settings):
    overrides = {
        "algorithm": "earlyexit",
        "model.name": "w2v2_tiny",
        "train.batch_size": 4,
        "train.lr": 0.05,
        "train.local_epochs": 1,
        **settings,
    }
    cfg = load_config(overrides=[f"{k}={v}" for k, v in overrides.items()])
    return build_algorithm(cfg, Task(64, 3, CLIENTS))


def _client(name="c0"):
    torch.manual_seed(1)
    frames = [torch.randn(n, 64) for n in (30, 25, 20, 28)]
    return ClientData(
        name,
        Padded.stack(frames),
        torch.tensor([0, 1, 2, 1]),
        Padded.stack([], (64,)),
        torch.zeros(0, dtype=torch.long),
    )


@pytest.mark.parametrize("aggregation", ["depth_weighted", "fedavg"])
def test_nothing_above_the_client_depth_is_trained_or_uploaded(aggregation):
    algo = _algorithm(
        **{"earlyexit.mode": "homo", "earlyexit.depth": 6, "earlyexit.aggregation": aggregation}
    )
    payload = algo.init_server()["params"]
    result = algo.client_update(payload, None, _client(), 1, torch_generator(0, "batches"))
    upload = result.upload
    assert int(upload.pop("depth")) == 2 and algo.depths["c0"] == 2  # depth 6 of 12 -> layer 2 of 4
    deep = [
        k
        for k in payload
        if k.startswith(
            (
                "encoder.layers.2.",
                "encoder.layers.3.",
                "exit_heads.1.",
                "exit_heads.3.",
                "exit_heads.4.",
            )
        )
    ]
    trained = [k for k in payload if k not in deep]
    assert deep and all(not torch.equal(upload[k], payload[k]) for k in trained if "weight" in k)
    if aggregation == "fedavg":  # full models: untouched tensors exactly as received
        assert set(upload) == set(payload) and all(torch.equal(upload[k], payload[k]) for k in deep)
    else:
        assert set(upload) == set(trained)
    model = algo.scratch_model("w2v2_tiny")
    # frozen locally as well
    assert all(torch.equal(model.state_dict()[k], payload[k]) for k in deep)


def test_depth_settings_and_their_effects():
    hetero = _algorithm()
    # low 3 -> 1, high: deepest
    assert sorted(hetero.depths.values()) == [1, 1, 4, 4] and hetero.eval_exit == 4
    assert hetero.depths == _algorithm().depths  # seeded
    assert sorted(_algorithm(**{"earlyexit.low_fraction": 0.75}).depths.values()) == [1, 1, 1, 4]
    assert sorted(
        _algorithm(**{"earlyexit.low_depth": 6, "earlyexit.high_depth": 9}).depths.values()
    ) == [2, 2, 3, 3]
    assert set(_algorithm(**{"earlyexit.mode": "homo", "earlyexit.depth": 9}).depths.values()) == {
        3
    }
    assert _algorithm(**{"earlyexit.eval_exit": 3}).eval_exit == 1
    assert _algorithm(**{"earlyexit.exits": "6,12", "earlyexit.low_depth": 6}).exits == [2, 4]
    with pytest.raises(
        ConfigError,
        match=r"earlyexit.low_depth=3 is layer 1 of this encoder, which has no exit there",
    ):
        _algorithm(**{"earlyexit.exits": "6,12"})
    with pytest.raises(ConfigError, match="earlyexit.mode must be one of hetero, homo, budget"):
        _algorithm(**{"earlyexit.mode": "deep"})
    with pytest.raises(ConfigError, match="model.name=crnn_tiny is not one"):
        _algorithm(**{"model.name": "crnn_tiny"})
    for setting, value in (
        ("aggregation.method", "lpa"),
        ("attack.kind", "label_flip"),
        ("dp.mode", "central"),
    ):
        with pytest.raises(
            ConfigError, match=f"{setting}={value} does not apply to --algorithm earlyexit"
        ):
            _algorithm(**{setting: value})


def test_aggregation_setting_changes_the_global_model():
    results = {}
    for mode in ("depth_weighted", "layerwise", "fedavg"):
        algo = _algorithm(**{"earlyexit.aggregation": mode})
        payload = algo.init_server()["params"]
        uploads = [
            (
                algo.client_update(
                    payload, None, _client(c), 1, torch_generator(0, "batches", c)
                ).upload,
                n,
            )
            for c, n in (("c0", 4), ("c1", 4), ("c2", 4), ("c3", 4))
        ]
        results[mode] = algo.server_update({"params": payload}, uploads, 1)[0]["params"]
    layer = "encoder.layers.0.attention.k_proj.weight"  # trained by every client, at depths 1 and 4
    assert not torch.equal(results["depth_weighted"][layer], results["layerwise"][layer])
    # trained by the deep clients only: fedavg dilutes it
    deep = "encoder.layers.3.attention.k_proj.weight"
    assert torch.equal(results["depth_weighted"][deep], results["layerwise"][deep])
    assert not torch.equal(results["fedavg"][deep], results["layerwise"][deep])


def test_head_lr_sets_the_heads_rate_alone():
    """One AdamW step (4 clips, batch 4): its first update is lr * g / (|g| + eps), so the encoder's
    tensors move exactly as without earlyexit.head_lr and the head's move 10x as far."""
    settings = {
        "earlyexit.mode": "homo",
        "earlyexit.depth": 6,
        "train.optimizer": "adamw",
        "train.lr": 0.001,
        "model.dropout": 0.0,
    }
    base, fast = _algorithm(**settings), _algorithm(**settings, **{"earlyexit.head_lr": 0.01})
    payload = base.init_server()["params"]
    a = base.client_update(payload, None, _client(), 1, torch_generator(0, "batches")).upload
    b = fast.client_update(payload, None, _client(), 1, torch_generator(0, "batches")).upload
    head = [k for k in a if k.startswith("exit_heads.2.")]
    assert head and all(torch.equal(a[k], b[k]) for k in a if k not in head and k != "depth")
    for k in head:
        assert torch.allclose(b[k] - payload[k], 10 * (a[k] - payload[k]), rtol=1e-3, atol=1e-7), k
    with pytest.raises(ConfigError, match="earlyexit.head_lr must be >= 0"):
        _algorithm(**{"earlyexit.head_lr": -1})


def test_head_norm_standardises_each_exits_pooled_vector():
    """model.head_norm: each exit's head has its own BatchNorm1d; in training it standardises every
    pooled dimension over the batch (by hand), a batch of one clip uses the running statistics, and
    the statistics travel in the client's upload and are averaged like weights."""
    algo = _algorithm(**{"earlyexit.mode": "homo", "earlyexit.depth": 6, "model.head_norm": True})
    model = algo.scratch_model("w2v2_tiny").use_exit(2).train()
    assert {f"exit_heads.{e}.norm.running_mean" for e in (1, 2, 3, 4)} <= set(model.state_dict())
    pooled = (
        torch.randn(5, model.norm.num_features) * torch.linspace(0.01, 3, model.norm.num_features)
        + 2
    )
    expected = (pooled - pooled.mean(0)) / (pooled.var(0, unbiased=False) + model.norm.eps).sqrt()
    assert torch.allclose(model.norm(pooled), expected, atol=1e-4)
    assert torch.allclose(model.norm.running_mean, 0.1 * pooled.mean(0))
    one = model.norm(pooled[:1])  # a last batch of one clip: the running statistics, not an error
    running = (pooled[:1] - model.norm.running_mean) / (
        model.norm.running_var + model.norm.eps
    ).sqrt()
    assert torch.allclose(one, running, atol=1e-5)
    payload = algo.init_server()["params"]
    upload = algo.client_update(payload, None, _client(), 1, torch_generator(0, "batches")).upload
    assert not torch.equal(
        upload["exit_heads.2.norm.running_mean"], payload["exit_heads.2.norm.running_mean"]
    )
    # another exit's head: not trained, not uploaded
    assert "exit_heads.4.norm.running_mean" not in upload
    merged = algo.server_update({"params": payload}, [(upload, 4)], 1)[0]["params"]
    assert torch.equal(
        merged["exit_heads.2.norm.running_mean"], upload["exit_heads.2.norm.running_mean"]
    )
    from fedac.models import build_model

    with pytest.raises(
        ConfigError,
        match="model.head_norm applies to the SSL models' pooled heads, not to crnn_tiny",
    ):
        build_model("crnn_tiny", 64, 3, options=ModelConfig(head_norm=True))


def test_head_norm_is_refused_for_ctc_heads():
    from fedac.errors import EncoderError
    from fedac.models.ssl import build_ssl_model

    with pytest.raises(EncoderError, match="a CTC head has none"):
        build_ssl_model("w2v2_tiny", "ctc", 29, "random", head_norm=True)


# --------------------------------------------------------------------------- runs


@pytest.fixture(scope="module")
def voxceleb_root(tmp_path_factory):
    from fedac.data.synth.voxceleb1 import generate

    out = tmp_path_factory.mktemp("voxceleb1")
    generate(out, speakers=3, utterances=6, trial_speakers=3, trials=12, workers=1, progress=False)
    return out


def _settings(root, cache):
    return {
        "algorithm": "earlyexit",
        "dataset": "voxceleb1",
        "data.root": root,
        "data.cache_dir": cache,
        "data.num_clients": 3,
        "model.name": "w2v2_tiny",
        "train.local_epochs": 1,
        "train.batch_size": 4,
        "train.lr": 0.01,
        "train.fraction": 1.0,
        "train.eval_every": 1,
        "train.checkpoint_every": 1,
        "train.rounds": 2,
    }


@pytest.mark.slow
def test_resumed_earlyexit_run_equals_the_uninterrupted_one(voxceleb_root, tmp_path):
    cfg = load_config(
        overrides=[f"{k}={v}" for k, v in _settings(voxceleb_root, tmp_path / "cache").items()]
    )
    data = build_federated_data(cfg, progress=False)
    whole = Simulator(cfg, tmp_path / "whole", data, progress=False)
    whole.run()
    assert Simulator(cfg, tmp_path / "split", data, progress=False).run(stop_after=1) is None
    resumed = Simulator(cfg, tmp_path / "split", data, progress=False)
    rounds = trained_rounds(resumed)
    resumed.run(resume=True)
    assert rounds == [2]
    assert params_equal(resumed.state.server["params"], whole.state.server["params"])


@pytest.mark.slow
@pytest.mark.parametrize("peft", ["none", "lora"])
def test_flower_deployment_runs_earlyexit_unchanged(voxceleb_root, tmp_path, monkeypatch, peft):
    """The Flower apps move the partial uploads (flat tensor dicts with the depth) as they are: an
    in-process deployment ends with the simulator's global model (with LoRA: adapters and heads
    only)."""
    from fedac.flower import clientapp, serverapp
    from fedac.flower.settings import deployment_settings, fedac_config
    from flower_helpers import LocalGrid, assert_same_metrics, use_task_identity

    use_task_identity(monkeypatch)

    settings = {
        k: v
        for k, v in {**_settings(voxceleb_root, tmp_path / "cache"), "model.peft": peft}.items()
        if k not in ("algorithm", "dataset", "train.rounds", "train.fraction")
    }
    config = {
        "algorithm": "earlyexit",
        "dataset": "voxceleb1",
        "rounds": 2,
        "fraction": 1.0,
        "seed": 0,
        "lr": 0.01,
        "fedac-set": ";".join(f"{k}={v}" for k, v in settings.items()),
        "run-dir": str(tmp_path / "run"),
        "min-nodes": 3,
        "round-timeout": 120.0,
        "node-wait": 60.0,
        "poll-interval": 0.01,
    }
    nodes = {100 + k: {"partition-id": k, "num-partitions": 3} for k in range(3)}
    cfg = fedac_config(config)
    cfg.out = str(tmp_path / "run")
    (tmp_path / "run").mkdir()
    results = serverapp.run_deployment(
        LocalGrid(clientapp.app, nodes, config), cfg, deployment_settings(config), tmp_path / "run"
    )
    sim = Simulator(cfg, tmp_path / "sim", progress=False)
    expected = sim.run()
    flower_params = torch.load(tmp_path / "run" / "server_state.pt")["params"]
    assert flower_params.keys() == sim.state.server["params"].keys()
    if peft == "lora":
        assert all("lora_" in name or name.startswith("exit_heads.") for name in flower_params)
    for name, value in sim.state.server["params"].items():
        torch.testing.assert_close(flower_params[name], value, rtol=0, atol=1e-6, msg=name)
    assert results["final"]["exit1_accuracy"] == pytest.approx(expected["final"]["exit1_accuracy"])
    # val_exit* too
    assert_same_metrics(tmp_path / "run" / "metrics.csv", tmp_path / "sim" / "metrics.csv", 2)


def test_memory_command_measures_each_depth(tmp_path, capsys):
    out = tmp_path / "memory"
    assert (
        main(
            [
                "memory",
                "--model",
                "w2v2_tiny",
                "--batch",
                "2",
                "--steps",
                "1",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    result = json.loads((out / "memory.json").read_text())
    assert (
        (out / "memory.csv").is_file()
        and (out / "memory.png").is_file()
        and "Per layer" in capsys.readouterr().out
    )
    assert "| 4 | 0.89 |" in (out / "memory.md").read_text()  # depth 4: 4 layers + front end + head
    rows = result["rows"]
    assert [r["depth"] for r in rows] == [1, 2, 3, 4]
    # hand count: 64-d layers (4 x 64^2 + 4 x 64 attention, 2 x 64 x 256 + 256 + 64 FFN, 2 x 2 x 64
    # norms)
    layer = 4 * 64 * 64 + 4 * 64 + 2 * 64 * 256 + 256 + 64 + 4 * 64
    assert result["weights_mb_per_layer"] == pytest.approx(layer * 4 / 1e6)
    # AdamW: weights + gradients + two moments of every tensor the client trains, + activations
    for r in rows:
        assert r["train_mb"] == pytest.approx(4 * r["weights_mb"] + r["activations_mb"])
    steps = [b["activations_mb"] - a["activations_mb"] for a, b in zip(rows, rows[1:])]
    # linear: each exit runs one more layer
    assert steps[0] > 0 and steps == pytest.approx([steps[0]] * 3)


def test_budget_mode_picks_the_deepest_exit_that_fits():
    memory = _algorithm(
        **{"earlyexit.mode": "budget", "earlyexit.budgets_mb": "[1e9]"}
    ).memory_per_exit()
    assert list(memory) == [1, 2, 3, 4] and memory[1] < memory[2] < memory[3] < memory[4]
    budgets = f"[{(memory[2] + memory[3]) / 2}, {memory[4]}]"
    algo = _algorithm(**{"earlyexit.mode": "budget", "earlyexit.budgets_mb": budgets})
    assert set(algo.depths.values()) == {2, 4}  # both budgets are drawn among 4 clients (seed 0)
    with pytest.raises(ConfigError, match=r"client c\d: its memory budget 0.1 MB is below"):
        _algorithm(**{"earlyexit.mode": "budget", "earlyexit.budgets_mb": "[0.1]"})
    with pytest.raises(ConfigError, match="earlyexit.mode=budget needs earlyexit.budgets_mb"):
        _algorithm(**{"earlyexit.mode": "budget"})


def test_budget_mode_takes_each_clients_memory_from_the_device_trace(tmp_path):
    memory = _algorithm(
        **{"earlyexit.mode": "budget", "earlyexit.budgets_mb": "[1e9]"}
    ).memory_per_exit()
    between = (memory[2] + memory[3]) / 2
    rows = [f"{c},1e9,1e6,1e6,{between if i % 2 else memory[4]}" for i, c in enumerate(CLIENTS)]
    trace = tmp_path / "devices.csv"
    trace.write_text("client,flops_per_s,up_bps,down_bps,memory_mb\n" + "\n".join(rows) + "\n")
    algo = _algorithm(**{"earlyexit.mode": "budget", "system.devices": trace})
    assert algo.depths == {c: 2 if i % 2 else 4 for i, c in enumerate(CLIENTS)}
    trace.write_text(
        "client,flops_per_s,up_bps,down_bps\n"
        + "\n".join(f"{c},1e9,1e6,1e6" for c in CLIENTS)
        + "\n"
    )
    with pytest.raises(ConfigError, match="fill its memory_mb column"):
        _algorithm(**{"earlyexit.mode": "budget", "system.devices": trace})


# --------------------------------------------------------------------------- tables


def test_table_error_rates_and_methods():
    from fedac.experiments.earlyexit import (
        central_epochs,
        dataset_settings,
        error_rates,
        table1_methods,
    )

    assert error_rates({"accuracy": 0.75, "asv_eer": 0.125}) == {"error": 25.0, "EER": 12.5}
    assert error_rates(
        {"wer": 0.5, "test_other_wer": 0.625, "cer": 0.25, "test_other_cer": 0.375, "accuracy": 0.1}
    ) == {"WER": 50.0, "WER other": 62.5, "CER": 25.0, "CER other": 37.5}
    # T_task (the paper's best FL exit): 6 for keyword spotting, 9 otherwise, for homo FL and the
    # high clients; the pooled-head norm on classification tasks; the user's --set wins
    assert dataset_settings("speech_commands", [], task_depth=True) == [
        "model.head_norm=true",
        "earlyexit.depth=6",
        "earlyexit.high_depth=6",
    ]
    assert dataset_settings("librispeech", ["train.lr=1"], task_depth=True) == [
        "earlyexit.depth=9",
        "earlyexit.high_depth=9",
    ]
    assert dataset_settings(
        "voxceleb1", ["earlyexit.depth=12", "model.head_norm=false"], task_depth=True
    ) == ["earlyexit.high_depth=12"]
    assert (
        dataset_settings("speech_commands", ["earlyexit.high_depth=12"], task_depth=True)[-1]
        == "earlyexit.depth=6"
    )
    assert dataset_settings("cremad", [], task_depth=False) == ["model.head_norm=true"]
    table1 = table1_methods([3, 12], central_rounds=4)
    assert [m.label for m in table1] == [
        "central L=3",
        "homo FL L=3",
        "central L=12",
        "homo FL L=12",
    ]
    assert {
        "data.num_clients=1",
        "earlyexit.mode=homo",
        "earlyexit.depth=3",
        "train.rounds=4",
    } <= set(table1[0].overrides)
    assert "data.num_clients=1" not in table1[1].overrides and not any(
        "rounds" in o for o in table1[1].overrides
    )
    # the centralised budget: the clips an FL row's clients train on in all (30 rounds x 10% -> 3
    # epochs)
    assert central_epochs(load_config(overrides=["train.rounds=30", "train.fraction=0.1"])) == 3
    assert central_epochs(load_config(overrides=["train.rounds=2", "train.fraction=0.1"])) == 1


@pytest.mark.slow
def test_table2_from_the_cli_with_every_exit_evaluated(voxceleb_root, tmp_path):
    """Runs of each method from the CLI: every exit is logged per round and in results.json, and
    each table cell is its run's own result."""
    import csv

    out = tmp_path / "t2"
    assert (
        main(
            [
                "reproduce",
                "earlyexit-table2",
                "--datasets",
                "voxceleb1",
                "--seeds",
                "0",
                "--rounds",
                "1",
                "--quiet",
                "--out",
                str(out),
                "--set",
                f"data.root={voxceleb_root}",
                "--set",
                f"data.cache_dir={tmp_path / 'cache'}",
                "--set",
                "model.name=w2v2_tiny",
                "--set",
                "data.num_clients=3",
                "--set",
                "train.fraction=1",
            ]
        )
        == 0
    )
    table = (out / "table.md").read_text()
    assert (
        "| homo FL | hetero FedAvg | hetero depth-weighted |" in table
        and "| voxceleb1 | EER |" in table
    )
    assert (out / "figure.png").is_file()
    summary = json.loads((out / "summary.json").read_text())
    for row in summary["rows"]:  # the quoted mean (one seed: its value) and std of each cell
        assert all(row["mean_std"][m] == [v[0], 0.0] for m, v in row["values"].items())
    for row in csv.DictReader(open(out / "results.csv")):  # every cell is its run's own result
        final = json.loads((tmp_path / row["run_dir"] / "results.json").read_text())["final"]
        expected = (
            100 * (1 - final["accuracy"]) if row["metric"] == "error" else 100 * final["asv_eer"]
        )
        assert float(row["value"]) == pytest.approx(expected)
        # T_task = 9 of 12, layer 3 of w2v2_tiny's 4, for homo FL and the high-resource clients
        exits = 3
        # the headline is earlyexit.eval_exit's
        assert final["accuracy"] == final[f"exit{exits}_accuracy"]
        assert {f"exit{e}_{m}" for e in (1, 2, 3, 4) for m in ("accuracy", "asv_eer")} <= set(final)
        header = (tmp_path / row["run_dir"] / "metrics.csv").read_text().splitlines()[0].split(",")
        assert {f"val_exit{e}_accuracy" for e in (1, 2, 3, 4)} <= set(
            header
        ) and "mean_depth" in header
        config = (tmp_path / row["run_dir"] / "config.yaml").read_text()
        if row["method"] == "homo FL":
            assert "mode: homo" in config and "\n  depth: 9" in config
        else:
            assert "mode: hetero" in config and "high_depth: 9" in config
            assert ("aggregation: fedavg" in config) == (row["method"] == "hetero FedAvg")
        assert "head_norm: true" in config and "head_lr: 0.003" in config


@pytest.mark.slow
def test_table1_centralised_rows_train_their_own_epochs(voxceleb_root, tmp_path, capsys):
    """--central-epochs sets the centralised rows' rounds (one client, every round evaluated) and
    leaves the FL rows at --rounds; other experiments refuse it."""
    out = tmp_path / "t1"
    common = [
        "--datasets",
        "voxceleb1",
        "--seeds",
        "0",
        "--rounds",
        "1",
        "--quiet",
        "--out",
        str(out),
        "--set",
        f"data.root={voxceleb_root}",
        "--set",
        f"data.cache_dir={tmp_path / 'cache'}",
        "--set",
        "model.name=w2v2_tiny",
        "--set",
        "data.num_clients=3",
        "--set",
        "train.fraction=1",
    ]
    assert (
        main(
            [
                "reproduce",
                "earlyexit-table1",
                "--central-epochs",
                "2",
                "--methods",
                "central L=3",
                "homo FL L=3",
                *common,
            ]
        )
        == 0
    )
    central = json.loads((out / "voxceleb1" / "central_L=3-s0" / "results.json").read_text())
    fl = json.loads((out / "voxceleb1" / "homo_FL_L=3-s0" / "results.json").read_text())
    assert (central["rounds"], central["clients"], len(central["history"])) == (2, 1, 2)
    assert (fl["rounds"], fl["clients"]) == (1, 3)
    # the paper's layout: a row per metric and depth, a column per kind of training
    table = (out / "table.md").read_text()
    assert "| Dataset | Metric | central | homo FL |" in table
    error = {
        run: f"{100 * (1 - r['final']['accuracy']):.2f}"
        for run, r in (("central", central), ("fl", fl))
    }
    assert f"| voxceleb1 | error, L=3 | {error['central']} | {error['fl']} |" in table
    assert main(["reproduce", "earlyexit-table2", "--central-epochs", "2", *common]) != 0
    assert "earlyexit-table2 does not use --central-epochs" in capsys.readouterr().err


def test_a_twelve_layer_checkpoint_uses_the_paper_exits(tmp_path):
    """A user's Base-like checkpoint (here tiny and random, 12 layers) through model.encoder_path:
    exits 3/6/9/12 as written, low clients at 3, and a client at 3 uploads layers 0-2 only."""
    from transformers import Wav2Vec2Model

    config = size_config("w2v2_tiny")
    config.num_hidden_layers = 12
    torch.manual_seed(0)
    Wav2Vec2Model(config).save_pretrained(tmp_path / "base")
    algo = _algorithm(**{"model.encoder_path": tmp_path / "base"})
    assert algo.exits == [3, 6, 9, 12] and sorted(algo.depths.values()) == [3, 3, 12, 12]
    low = next(c for c, d in algo.depths.items() if d == 3)
    payload = algo.init_server()["params"]
    upload = algo.client_update(
        payload, None, _client(low), 1, torch_generator(0, "batches")
    ).upload
    layers = {int(k.split(".")[2]) for k in upload if k.startswith("encoder.layers.")}
    assert layers == {0, 1, 2} and {
        k.split(".")[1] for k in upload if k.startswith("exit_heads.")
    } == {"3"}


def _layer_runs(model):
    ran: list[int] = []
    hooks = [
        layer.register_forward_hook(lambda *a, i=i: ran.append(i))
        for i, layer in enumerate(model.encoder.layers)
    ]
    return ran, hooks


def test_scoring_a_clients_clips_at_every_exit_runs_each_layer_once_and_equals_a_fresh_model():
    """clients.csv's scores of an early-exit model (the headline exit, then every exit, on the same
    held-out clips: engine/clients.py) run the encoder once thanks to the model's EncoderMemo, and
    equal the scores of a model that remembers nothing."""
    from fedac.engine.clients import exit_scores, holdout_metrics

    algo = _algorithm(**{"earlyexit.mode": "homo", "earlyexit.depth": 6})
    model = algo.global_model(algo.init_server())
    client = _client()
    data = ClientData("c0", client.x, client.y, client.x, client.y)  # held-out = its 4 clips
    model.memo.limit = 0  # remembers nothing: every call runs the encoder from the start
    ran, hooks = _layer_runs(model)
    fresh = {**holdout_metrics(model, data, 3, 2), **exit_scores(model, data, 3, 2)}
    assert len(ran) == 2 * (2 + 1 + 2 + 3 + 4)  # per batch: the headline exit 2, then 1, 2, 3, 4
    ran.clear()
    model.memo.limit = MEMO_BYTES
    with torch.no_grad():
        scores = {**holdout_metrics(model, data, 3, 2), **exit_scores(model, data, 3, 2)}
    for hook in hooks:
        hook.remove()
    assert scores == fresh and "exit4_accuracy" in scores
    assert sorted(ran) == sorted(list(range(4)) * 2)  # 2 batches of 2 clips, each layer once
    assert model.depth == 2  # (exit_scores leaves the model at the exit it found)


def test_the_memo_forgets_new_weights_a_changed_batch_and_training():
    algo = _algorithm()
    model = algo.global_model(algo.init_server()).eval()
    x = _client().x
    with torch.no_grad():
        before = model(x)
        assert torch.equal(model(x), before) and len(model.memo.runs) == 1
        other = algo.initial_params(algo.cfg.model.name, "other-init")
        model.load_state_dict(other)  # new weights: a fresh run
        after = model(x)
        assert not torch.allclose(after, before)
        model.memo.limit = 0
        assert torch.equal(model(x), after)  # what a model without memo computes
        model.memo.limit = MEMO_BYTES
        x.values.mul_(2)  # the batch written in place: a fresh run
        changed = model(x)
        model.memo.forget()
        assert torch.equal(changed, model(x)) and not torch.equal(changed, after)
    model.train()
    assert not model.memo.runs


def test_the_memo_keeps_at_most_its_limit_and_the_latest_batch():
    algo = _algorithm()
    model = algo.global_model(algo.init_server()).eval()
    model.memo.limit = 1  # byte: every batch evicts the one before
    batches = [_client(f"c{i}").x for i in range(3)]
    with torch.no_grad():
        first = [model(b) for b in batches]
        assert len(model.memo.runs) == 1
        assert all(torch.equal(model(b), f) for b, f in zip(batches, first))
