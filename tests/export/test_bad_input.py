"""Bad input to export, predict and stream: one clear line naming the file or layer and the fix,
exit status 2, no traceback."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

import torch
from torch import nn

from fedac.cli import main
from fedac.config import Config, FeatureConfig, save_config
from fedac.export.frontend import FeatureFrontEnd, FeatureModel
from fedac.export.onnx_export import ExportError, write_onnx
from fedac.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")
LABELS = ["yes", "no", "up", "down"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A small exported model (random weights) with its sidecar."""
    path = tmp_path_factory.mktemp("model") / "model.onnx"
    torch.manual_seed(0)
    module = FeatureModel(FeatureFrontEnd(FeatureConfig()), build_model("cnn1_softmax", 40, 4))
    write_onnx(module.eval(), torch.randn(2, 16000), path, False)
    meta = {"labels": LABELS, "sample_rate": 16000, "clip_samples": 16000}
    path.with_suffix(".json").write_text(json.dumps(meta))
    return path


def refused(capsys, argv, *phrases) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and all(p in err for p in phrases), err
    return err


def test_a_run_without_a_checkpoint_is_refused(tmp_path, capsys):
    save_config(Config(), tmp_path / "config.yaml")
    refused(capsys, ["export", str(tmp_path)], "no checkpoint", str(tmp_path / "checkpoint.pt"))
    refused(capsys, ["export", str(tmp_path / "nothing")], "not a fedac run directory")
    refused(capsys, ["export", str(tmp_path), "--format", "pte"], "ExecuTorch", "docs/export.md")


class Untraceable(nn.Module):
    """Eigenvalues: torch traces them, ONNX has no operator for them."""

    def forward(self, x):
        square = x[..., :2, :2] @ x[..., :2, :2].transpose(-1, -2)
        return x + torch.linalg.eigvalsh(square)[..., :1, None]


def test_an_untraceable_layer_is_named(tmp_path):
    torch.manual_seed(0)
    model = build_model("cnn1_softmax", 40, 4)
    model.body.insert(0, Untraceable())
    module = FeatureModel(FeatureFrontEnd(FeatureConfig()), model).eval()
    with pytest.raises(ExportError, match=r"layer model\.body\.0 \(Untraceable\)"):
        write_onnx(module, torch.randn(2, 16000), tmp_path / "m.onnx", False)


def test_an_empty_or_undecodable_file_names_itself_and_the_others_are_labelled(
    exported, tmp_path, capsys
):
    empty, junk, good = tmp_path / "empty.wav", tmp_path / "junk.wav", tmp_path / "good.wav"
    sf.write(empty, np.zeros(0, np.float32), 16000)
    junk.write_text("not audio")
    rng = np.random.default_rng(0)
    # stereo at 8 kHz, half a second: every conversion, said once
    sf.write(good, 0.1 * rng.standard_normal((4000, 2)).astype(np.float32), 8000)
    assert main(["predict", str(exported), str(empty), str(junk), str(good), str(good)]) == 2
    out, err = capsys.readouterr()
    assert f"{empty} holds no samples" in err and f"cannot decode audio file {junk}" in err
    assert "Traceback" not in err
    for note in ("2 channels averaged", "8000 Hz resampled", "zero-padded"):
        assert err.count(note) == 1, err
    lines = out.splitlines()
    assert len(lines) == 2 and lines[0] == lines[1] and lines[0].startswith(f"{good}: ")
    assert len(lines[0].split(", ")) == 3  # --top 3 by default


def test_a_label_set_the_model_does_not_match_is_refused(exported, tmp_path, capsys):
    other = tmp_path / "other.onnx"
    other.write_bytes(exported.read_bytes())
    meta = json.loads(exported.with_suffix(".json").read_text())
    other.with_suffix(".json").write_text(json.dumps({**meta, "labels": LABELS + ["left"]}))
    refused(capsys, ["predict", str(other), "x.wav"], "outputs 4 classes but other.json lists 5")
    refused(capsys, ["stream", str(exported), "x.wav", "--keywords", "yes,maybe"], "maybe")
    (tmp_path / "bare.onnx").write_bytes(exported.read_bytes())
    refused(capsys, ["predict", str(tmp_path / "bare.onnx"), "x.wav"], "no sidecar bare.json")
