"""Every zoo network exports to ONNX with the feature front end inside, and onnxruntime computes
what PyTorch does (tiny sizes): logits within 1e-4 and the same argmax. The SSL encoder exports at
each exit of an early-exit model and with LoRA / IA3 merged into its weights."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

import torch

from fedac.config import FeatureConfig, ModelConfig
from fedac.export.frontend import FeatureFrontEnd, FeatureModel, SSLWaveformModel
from fedac.export.onnx_export import INPUT, OUTPUT, session, write_onnx
from fedac.export.run import merge_adapters
from fedac.models import build_model
from fedac.models.registry import ALL_MODELS, SSL_NAMES

pytestmark = pytest.mark.usefixtures("one_thread")

FEATURE_NETS = [n for n in ALL_MODELS if n not in SSL_NAMES]
#: the exporter takes ~20 s over MHAttRNN's two bidirectional GRU layers on 2 cores
SLOW = {"mhattrnn"}


def onnx_against_torch(module: torch.nn.Module, waves: torch.Tensor, path, free_length=False):
    """(max |logit diff|, argmax agreement) of the exported `module` on `waves`, on a batch of
    another size, and (with `free_length`) on a shorter clip the graph was not traced with."""
    module.eval()
    write_onnx(module, waves, path, free_length)
    sess = session(path, threads=1)
    # another batch size than the traced one (the batch axis is free), and with `free_length`
    # another length
    more = torch.cat([waves, waves.flip(0)])
    inputs = [waves, more] + ([waves[:1, : waves.shape[1] * 3 // 4]] if free_length else [])
    diffs, agree = [], []
    for x in inputs:
        got = sess.run([OUTPUT], {INPUT: x.numpy()})[0]
        with torch.no_grad():
            want = module(x).numpy()
        diffs.append(np.abs(got - want).max())
        agree.append((got.argmax(1) == want.argmax(1)).mean())
    return max(diffs), min(agree)


def waveforms(rows: int = 3, samples: int = 16000) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    t = torch.arange(samples) / 16000
    tone = torch.sin(2 * torch.pi * 440 * t)
    return (0.1 * torch.randn(rows, samples, generator=g) + 0.3 * tone).float()


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in FEATURE_NETS],
)
def test_every_feature_network_exports_and_matches(name, tmp_path):
    torch.manual_seed(0)
    model = build_model(name, 40, 6)
    diff, agree = onnx_against_torch(
        FeatureModel(FeatureFrontEnd(FeatureConfig()), model), waveforms(), tmp_path / "m.onnx"
    )
    assert diff <= 1e-4 and agree == 1.0


def ssl_deployed(peft: str = "none", exits=None, exit_at=None) -> SSLWaveformModel:
    from fedac.models.early_exit import build_multi_exit
    from fedac.models.ssl import build_encoder

    torch.manual_seed(0)
    options = ModelConfig(name="w2v2_tiny", encoder_path="random", peft=peft)
    if exits:
        model = build_multi_exit("w2v2_tiny", "classification", 5, exits, options, 0.0)
        model.use_exit(exit_at)
    else:
        model = build_model("w2v2_tiny", 1, 5, dropout=0.0, options=options)
    # (the adapters start as identity: move them so that merging them changes the weights)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name or "ia3_l" in name:
                p.add_(0.05 * torch.randn_like(p))
    return SSLWaveformModel(model.eval(), build_encoder("w2v2_tiny", "random").feature_extractor)


# (each SSL export takes 15-30 s on 2 busy cores: the slow subset)
@pytest.mark.slow
@pytest.mark.parametrize("exit_at", [1, 2, 3, 4])
def test_the_ssl_encoder_exports_at_each_exit(exit_at, tmp_path):
    deployed = ssl_deployed(exits=[3, 6, 9, 12], exit_at=exit_at)
    assert deployed.depth == exit_at  # (w2v2_tiny's 4 layers: exits 3, 6, 9, 12 of 12)
    diff, agree = onnx_against_torch(deployed, waveforms(2), tmp_path / "m.onnx", True)
    assert diff <= 1e-4 and agree == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("peft", ["lora", "ia3"])
def test_the_ssl_encoder_exports_with_its_adapters_merged(peft, tmp_path):
    pytest.importorskip("peft")
    deployed = ssl_deployed(peft)
    x = waveforms(2)
    with torch.no_grad():
        before = deployed(x)
    merged = merge_adapters(deployed.model)
    with torch.no_grad():
        after = deployed(x)
    assert merged > 0 and not any("lora" in n or "ia3" in n for n, _ in deployed.named_modules())
    assert torch.allclose(before, after, atol=1e-5)  # merging keeps the function
    diff, agree = onnx_against_torch(deployed, x, tmp_path / "m.onnx", True)
    assert diff <= 1e-4 and agree == 1.0
