"""`fedac pretrain` (issue 16): a 50-step smoke run of the HuBERT-style objective that writes a
Hugging Face checkpoint `model.encoder_path` loads, resumes after a kill to the same weights, and is
reused."""

from __future__ import annotations

import json

import pytest
import torch

from fedac.cli import main
from fedac.errors import ConfigError
from fedac.experiments.pretrain import PretrainSettings, pretrain
from fedac.models.ssl import load_encoder

pytestmark = pytest.mark.usefixtures("one_thread")

SMOKE = [
    "--model",
    "w2v2_tiny",
    "--steps",
    "50",
    "--speakers",
    "2",
    "--utterances",
    "3",
    "--batch-size",
    "2",
    "--crop-seconds",
    "1.0",
    "--checkpoint-every",
    "10",
    "--clusters",
    "20",
    "--quiet",
]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """The same 50-step run twice: killed after step 20 and started again, and uninterrupted."""
    root = tmp_path_factory.mktemp("pretrain")
    # the corpus cache (the autouse FEDAC_HOME is per test)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FEDAC_HOME", str(root / "home"))
        assert main(["pretrain", *SMOKE, "--out", str(root / "killed"), "--stop-after", "20"]) == 0
        assert (root / "killed" / "state.pt").is_file() and not (
            root / "killed" / "model.safetensors"
        ).exists()
        assert main(["pretrain", *SMOKE, "--out", str(root / "killed")]) == 0
        assert main(["pretrain", *SMOKE, "--out", str(root / "straight")]) == 0
    assert (root / "home" / "synthetic").is_dir()
    return root


@pytest.mark.slow
def test_pretraining_writes_a_loadable_encoder_with_its_record(smoke):
    out = smoke / "straight"
    record = json.loads((out / "pretrain.json").read_text())
    assert record["settings"]["steps"] == 50 and record["settings"]["objective"] == "hubert"
    assert len(record["sha256"]) == 64 and record["command"].startswith("fedac pretrain")
    losses = [float(line.split(",")[1]) for line in (out / "loss.csv").read_text().splitlines()[1:]]
    assert len(losses) == 50 and all(loss == loss for loss in losses)  # finite, one per step
    assert not (out / "state.pt").exists()
    encoder = load_encoder(out)
    assert len(encoder.encoder.layers) == 4 and encoder.config.apply_spec_augment is False


def test_a_killed_run_resumes_to_the_uninterrupted_weights(smoke):
    a, b = (
        load_encoder(smoke / "killed").state_dict(),
        load_encoder(smoke / "straight").state_dict(),
    )
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert (smoke / "killed" / "loss.csv").read_text() == (
        smoke / "straight" / "loss.csv"
    ).read_text()


def test_a_finished_folder_is_reused(smoke, monkeypatch):
    import fedac.experiments.pretrain as module

    monkeypatch.setattr(
        module, "corpus", lambda *a, **k: (_ for _ in ()).throw(AssertionError("trained again"))
    )
    assert main(["pretrain", *SMOKE, "--out", str(smoke / "straight")]) == 0


def test_bad_settings_are_named():
    with pytest.raises(ConfigError, match="--objective 'bert'"):
        PretrainSettings(objective="bert").check()
    with pytest.raises(ConfigError, match="--model 'crnn_lite'"):
        pretrain(PretrainSettings(model="crnn_lite"), out=None)


def test_contrastive_objective_takes_a_step():
    """wav2vec 2.0's contrastive + diversity loss through Wav2Vec2ForPreTraining and its
    samplers."""
    import numpy as np

    from fedac.experiments.pretrain import batch, build, step_loss

    s = PretrainSettings(model="w2v2_tiny", objective="contrastive", batch_size=2, crop_seconds=1.0)
    model, head = build(s)
    assert head is None and type(model).__name__ == "Wav2Vec2ForPreTraining"
    waves = [
        np.random.default_rng(k).standard_normal(16000 + 4000 * k).astype(np.float32)
        for k in range(3)
    ]
    np.random.seed(0)
    loss = step_loss(model, head, None, *batch(waves, s, 0), s)
    assert torch.isfinite(loss) and loss > 0
    loss.backward()
    assert model.wav2vec2.encoder.layers[0].attention.q_proj.weight.grad is not None
    assert model.quantizer.codevectors.grad is not None  # the quantized targets train too
