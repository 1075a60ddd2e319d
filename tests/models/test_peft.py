"""model.peft on the SSL encoders: LoRA and IA3 through Hugging Face peft compute what their
papers write, only the adapters and the heads train and travel (FedAvg, FedMMD, early exits with
their depth split), peft=none is today's model and update, a missing extra is one clear error,
and from the CLI an early-exit LoRA run uploads less than full fine-tuning, trains, and resumes
exactly after a signal."""

from __future__ import annotations

import csv
import json
import sys

import pytest
import torch
from test_earlyexit import _client
from test_interrupt import signal_in_round

from fedac.algorithms import build_algorithm
from fedac.algorithms.base import Task
from fedac.cli import main
from fedac.config import ModelConfig, load_config
from fedac.engine.checkpoint import load_checkpoint
from fedac.errors import ConfigError, EncoderError
from fedac.models import build_model
from fedac.models.ssl import SSLModel, build_encoder
from fedac.rules.exits import exit_aggregate
from fedac.seeding import torch_generator

pytestmark = pytest.mark.usefixtures("one_thread")

CLIENTS = [f"c{i}" for i in range(4)]
WIDTH, LAYERS, CLASSES = 64, 4, 3  # w2v2_tiny, the synthetic client's three classes


def _algorithm(algorithm: str, **settings):
    overrides = {
        "algorithm": algorithm,
        "model.name": "w2v2_tiny",
        "train.batch_size": 4,
        "train.lr": 0.05,
        "train.local_epochs": 1,
        **settings,
    }
    cfg = load_config(overrides=[f"{k}={v}" for k, v in overrides.items()])
    return build_algorithm(cfg, Task(WIDTH, CLASSES, CLIENTS))


def _model(**peft) -> SSLModel:
    torch.manual_seed(0)
    model = build_model(
        "w2v2_tiny", WIDTH, CLASSES, 0.0, options=ModelConfig(encoder_path="random", **peft)
    )
    assert isinstance(model, SSLModel)
    return model


# --------------------------------------------------------------------------- the methods by hand


def test_lora_adds_the_scaled_low_rank_product_to_each_target():
    """h = W x + b + (alpha / r) B A x on q_proj and v_proj (LoRA, Eq. 3), nowhere else."""
    model = _model(peft="lora", peft_rank=2, peft_alpha=6.0)
    attention = model.encoder.layers[1].attention
    q = attention.q_proj
    torch.nn.init.normal_(q.lora_B["default"].weight)  # B starts at 0: make the path visible
    x = torch.randn(5, WIDTH)
    base = q.base_layer
    A, B = q.lora_A["default"].weight, q.lora_B["default"].weight
    assert A.shape == (2, WIDTH) and B.shape == (WIDTH, 2)
    expected = x @ base.weight.T + base.bias + (6.0 / 2) * (x @ A.T @ B.T)
    assert torch.allclose(q(x), expected, atol=1e-5)
    assert isinstance(attention.k_proj, torch.nn.Linear)  # not a target: left as it was
    assert hasattr(attention.v_proj, "lora_A") and not hasattr(attention.out_proj, "lora_A")


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_lora_dropout_acts_on_the_low_rank_path_in_training_only(dropout):
    q = _model(peft="lora", peft_dropout=dropout).encoder.layers[0].attention.q_proj
    torch.nn.init.normal_(q.lora_B["default"].weight)
    x = torch.randn(5, WIDTH)
    q.train()
    assert torch.equal(q(x), q(x)) == (dropout == 0)
    q.eval()
    assert torch.equal(q(x), q(x))


def test_ia3_scales_keys_values_and_the_feed_forward_input():
    """IA3: a learned vector l rescales k_proj's and v_proj's outputs and output_dense's input."""
    model = _model(peft="ia3")
    layer = model.encoder.layers[0]
    k, out = layer.attention.k_proj, layer.feed_forward.output_dense
    with torch.no_grad():
        k.ia3_l["default"].uniform_(0.5, 1.5)
        out.ia3_l["default"].uniform_(0.5, 1.5)
    x, h = torch.randn(5, WIDTH), torch.randn(5, out.in_features)
    assert torch.allclose(k(x), k.base_layer(x) * k.ia3_l["default"].flatten(), atol=1e-5)
    assert torch.allclose(out(h), out.base_layer(h * out.ia3_l["default"].flatten()), atol=1e-5)


@pytest.mark.parametrize(
    "peft, adapter",
    [
        # q_proj and v_proj of each of 4 layers: A (r x 64) and B (64 x r), r = 8
        ({"peft": "lora"}, LAYERS * 2 * (8 * WIDTH + WIDTH * 8)),
        ({"peft": "lora", "peft_rank": 2, "peft_targets": ["k_proj"]}, LAYERS * (2 * WIDTH * 2)),
        # k_proj, v_proj (64 each) and output_dense's input (256) per layer
        ({"peft": "ia3"}, LAYERS * (WIDTH + WIDTH + 4 * WIDTH)),
    ],
    ids=["lora", "lora-k-r2", "ia3"],
)
def test_the_state_holds_only_the_adapters_and_the_head(peft, adapter):
    model = _model(**peft)
    head = 2 * WIDTH * CLASSES + CLASSES  # Linear(2H, C) on the pooled [mean; std]
    state = model.state_dict()
    assert sum(v.numel() for v in state.values()) == adapter + head
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == set(state) and not trainable & model.frozen
    # the frozen weights are every weight of transformers' encoder above its CNN
    plain = build_encoder("w2v2_tiny", "random")
    assert len(model.frozen) == sum(
        len(list(part.parameters())) for part in (plain.feature_projection, plain.encoder)
    )
    # a state without the frozen weights loads strictly; a wrong key is still refused
    model.load_state_dict(state)
    with pytest.raises(RuntimeError, match="Unexpected key"):
        model.load_state_dict({**state, "nonsense": torch.zeros(1)})


def test_head_only_freezes_every_encoder_weight_and_needs_no_peft(monkeypatch):
    """model.peft=head: the encoder as built with every weight frozen (the same weights as the
    unfrozen one), no adapter; only the head trains and is in the state."""
    monkeypatch.setitem(sys.modules, "peft", None)  # head-only imports no peft
    model = _model(peft="head")
    state = model.state_dict()
    assert set(state) == {"head.weight", "head.bias"}
    assert {n for n, p in model.named_parameters() if p.requires_grad} == set(state)
    plain = _model(peft="none")
    full = plain.state_dict()
    assert model.frozen == set(full) - set(state)
    weights = dict(model.named_parameters())
    with torch.random.fork_rng(devices=[]):  # the frozen encoder comes from FROZEN_BASE_SEED
        torch.manual_seed(0)
        again = _model(peft="head")
    assert all(torch.equal(p, dict(again.named_parameters())[n]) for n, p in weights.items())
    model.load_state_dict(state)


def test_early_exit_head_only_clients_train_and_upload_their_exit_head_alone():
    """With model.peft=head a client at exit 2 of 4 trains only exit 2's head: its upload is that
    head (and the depth), every other tensor of its model is as received."""
    algo = _algorithm(
        "earlyexit", **{"model.peft": "head", "earlyexit.mode": "homo", "earlyexit.depth": 6}
    )
    payload = algo.init_server()["params"]
    assert set(payload) == {
        f"exit_heads.{e}.head.{p}" for e in (1, 2, 3, 4) for p in ("weight", "bias")
    }
    model = algo.scratch_model("w2v2_tiny")
    frozen = _frozen_weights(model)
    result = algo.client_update(payload, None, _client(), 1, torch_generator(0, "batches"))
    upload = dict(result.upload)
    assert int(upload.pop("depth")) == 2
    assert set(upload) == {"exit_heads.2.head.weight", "exit_heads.2.head.bias"}
    assert all(not torch.equal(upload[k], payload[k]) for k in upload)
    assert all(torch.equal(p, frozen[n]) for n, p in _frozen_weights(model).items())


def test_peft_targets_that_match_nothing_are_one_clear_error():
    with pytest.raises(EncoderError, match=r"model.peft_targets=\['nonsense'\].*q_proj"):
        _model(peft="lora", peft_targets=["nonsense"])


def test_a_missing_peft_extra_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # import peft now raises ImportError
    with pytest.raises(EncoderError, match=r"model.peft=lora needs Hugging Face peft.*\[peft\]"):
        _model(peft="lora")
    _model(peft="none")  # needs no peft


def test_peft_refuses_a_trained_cnn_and_other_models():
    with pytest.raises(EncoderError, match="model.freeze_cnn=false"):
        _model(peft="lora", freeze_cnn=False)
    with pytest.raises(ConfigError, match="model.peft=lora adapts the SSL encoders"):
        build_model("crnn_tiny", 40, 3, options=ModelConfig(peft="lora"))


# --------------------------------------------------------------------------- what travels


def _frozen_weights(model: SSLModel) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if n in model.frozen}


@pytest.mark.parametrize("algorithm", ["fedavg", "fedmmd", "fedprox", "fedadam"])
@pytest.mark.parametrize("peft", ["lora", "ia3", "head"])
def test_clients_train_and_upload_only_adapters_and_head(algorithm, peft):
    algo = _algorithm(algorithm, **{"model.peft": peft, "fedmmd.weight": 1.0, "fedprox.mu": 0.1})
    payload = algo.init_server()["params"]
    model = algo.scratch_model("w2v2_tiny")
    frozen = _frozen_weights(model)
    assert frozen and not set(frozen) & set(payload)
    result = algo.client_update(payload, None, _client(), 1, torch_generator(0, "batches"))
    assert set(result.upload) == set(payload)
    # the adapters and the head moved (LoRA's A waits for B to leave 0: one step moves B only)
    moved = {k for k in payload if not torch.equal(result.upload[k], payload[k])}
    assert any(peft in k for k in moved) and "head.weight" in moved
    assert all(torch.equal(p, frozen[n]) for n, p in _frozen_weights(model).items())
    # the frozen-global model of FedMMD, every role's model, holds the same frozen encoder
    other = algo.scratch_model("w2v2_tiny", role="frozen-global")
    assert all(torch.equal(p, frozen[n]) for n, p in _frozen_weights(other).items())
    server, _ = algo.server_update(algo.init_server(), [(result.upload, 4)], 1)
    assert set(server["params"]) == set(payload)


@pytest.mark.parametrize("aggregation", ["depth_weighted", "fedavg"])
def test_early_exit_clients_leave_the_adapters_above_their_depth_untouched(aggregation):
    """A client at layer 2 of 4 trains the adapters of layers 0 and 1 and its exit's head; the
    adapters of layers 2 and 3 stay as received, locally and after aggregation."""
    algo = _algorithm(
        "earlyexit",
        **{
            "model.peft": "lora",
            "earlyexit.mode": "homo",
            "earlyexit.depth": 6,
            "earlyexit.aggregation": aggregation,
        },
    )
    payload = algo.init_server()["params"]
    with torch.no_grad():  # B = 0 would leave the A's untouched in any case
        for name, value in payload.items():
            if "lora_B" in name:
                value.normal_()
    result = algo.client_update(payload, None, _client(), 1, torch_generator(0, "batches"))
    upload = dict(result.upload)
    assert int(upload.pop("depth")) == 2
    adapters = [k for k in payload if "lora_" in k]
    deep = [k for k in adapters if k.startswith(("encoder.layers.2.", "encoder.layers.3."))]
    shallow = [k for k in adapters if k not in deep]
    assert len(deep) == len(shallow) == 8
    assert all(not torch.equal(upload[k], payload[k]) for k in shallow)
    if aggregation == "fedavg":  # the baseline uploads every trainable tensor
        assert set(upload) == set(payload)
        assert all(torch.equal(upload[k], payload[k]) for k in deep)
    else:
        assert set(upload) == set(shallow) | {"exit_heads.2.head.weight", "exit_heads.2.head.bias"}
    model = algo.scratch_model("w2v2_tiny")
    assert all(torch.equal(model.state_dict()[k], payload[k]) for k in deep)
    merged = exit_aggregate([(result.upload, 4)], payload, aggregation)
    assert all(torch.equal(merged[k], payload[k]) for k in deep)
    assert all(torch.equal(merged[k], upload[k]) for k in shallow)


def test_peft_none_is_the_model_and_update_of_before(monkeypatch):
    """peft=none builds the encoder transformers builds, with nothing frozen and no state hooks,
    and an early-exit client's upload is bit-identical to the one of the code before model.peft
    (its encoder built by build_encoder, trainability set by depth alone)."""
    import fedac.algorithms.earlyexit as earlyexit
    import fedac.models.early_exit as early_exit

    model = _model(peft="none")
    torch.manual_seed(0)
    plain = SSLModel(build_encoder("w2v2_tiny", "random", 0.0), "classification", CLASSES)
    assert not model.frozen and not model._state_dict_hooks
    assert all(
        torch.equal(a, b) for a, b in zip(model.state_dict().values(), plain.state_dict().values())
    )

    def update():
        algo = _algorithm("earlyexit", **{"model.peft": "none"})
        payload = algo.init_server()["params"]
        return algo.client_update(payload, None, _client(), 1, torch_generator(0, "batches"))

    now = update().upload

    def before_train_to(model, depth):
        for name, param in model.named_parameters():
            param.requires_grad_(depth is None or earlyexit.EarlyExitFL.trained(name, depth))

    monkeypatch.setattr(early_exit, "adapted_encoder", lambda n, p, d, *_: build_encoder(n, p, d))
    monkeypatch.setattr(earlyexit, "train_to", before_train_to)
    before = update().upload
    assert now.keys() == before.keys() and all(torch.equal(now[k], before[k]) for k in now)


def test_fedac_models_lists_each_choice(capsys):
    assert main(["models", "--num-classes", str(CLASSES), "--num-features", str(WIDTH)]) == 0
    out = capsys.readouterr().out
    row = next(
        line for line in out.split("by model.peft")[1].splitlines() if line.startswith("w2v2_tiny")
    )
    lora = LAYERS * 2 * 16 * WIDTH + 2 * WIDTH * CLASSES + CLASSES
    assert f"lora {lora:>10,} / {4 * lora / 1e6:7.3f} MB" in row and "ia3" in row and "none" in row


# --------------------------------------------------------------------------- from the CLI


def _run(gsc_root, tmp_path, run_dir, *extra: str) -> int:
    settings = {
        "data.root": gsc_root,
        "data.cache_dir": tmp_path / "cache",
        "data.task": 12,
        "model.name": "w2v2_tiny",
        "model.head_norm": "true",
        "train.optimizer": "adamw",
        "train.lr": 0.01,
        "train.batch_size": 8,
        "train.local_epochs": 2,
        "train.fraction": 1,
        "train.eval_every": 1,
        "train.checkpoint_every": 1000,
        "train.rounds": 3,
    }
    sets = [f"--set={k}={v}" for k, v in settings.items()]
    argv = ["run", "--algorithm", "earlyexit", "--dataset", "speech_commands", "--quiet"]
    return main([*argv, "--out", str(run_dir), *sets, *extra])


def _metrics(run_dir) -> list[dict[str, float]]:
    with open(run_dir / "metrics.csv", newline="") as handle:
        return [{k: float(v) for k, v in row.items() if v} for row in csv.DictReader(handle)]


@pytest.mark.slow
def test_early_exit_lora_uploads_less_trains_and_resumes_exactly(gsc_root, tmp_path):
    lora = "--set=model.peft=lora"
    assert _run(gsc_root, tmp_path, tmp_path / "full", "--set=train.rounds=1") == 0
    assert _run(gsc_root, tmp_path, tmp_path / "whole", lora) == 0
    full, whole = _metrics(tmp_path / "full"), _metrics(tmp_path / "whole")
    # the same clients and depths every round: LoRA's upload is a few percent of full fine-tuning's
    assert whole[0]["upload_bytes"] < 0.1 * full[0]["upload_bytes"]
    assert whole[0]["download_bytes"] < 0.1 * full[0]["download_bytes"]
    # trains: the clients' training loss falls round after round
    losses = [row["train_loss"] for row in whole]
    assert losses[2] < losses[1] < losses[0]

    with pytest.MonkeyPatch.context() as patch:  # SIGINT during round 2: stops after it
        signal_in_round(patch, at=2, times=1)
        assert _run(gsc_root, tmp_path, tmp_path / "split", lora) == 130
    assert load_checkpoint(tmp_path / "split").round == 2
    assert main(["run", "--resume", str(tmp_path / "split"), "--quiet"]) == 0
    straight, resumed = (load_checkpoint(tmp_path / d).server["params"] for d in ("whole", "split"))
    assert straight.keys() == resumed.keys() and all(
        torch.equal(straight[k], resumed[k]) for k in straight
    )
    assert all("lora_" in k or k.startswith("exit_heads.") for k in straight)
    results = [json.loads((tmp_path / d / "results.json").read_text()) for d in ("whole", "split")]
    assert results[0]["final"] == results[1]["final"]
