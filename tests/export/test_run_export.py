"""From a trained run to the device, through the command line: `fedac export` writes the graph and
its sidecar and checks itself on the test split, `--int8` a smaller model with its accuracy drop,
`fedac predict` gives the run's own prediction of a test clip (from the run and from the graph),
and `fedac stream` prints what the decoder finds in test clips joined with silence."""

from __future__ import annotations

import json
import re

import pytest
import soundfile as sf

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from fedac.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def run_dir(gsc_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "tiny"
    argv = ["run", "--quiet", "--out", str(out), "--algorithm", "central", "--rounds", "4"]
    for key, value in {
        "data.root": gsc_root,
        "data.cache_dir": tmp_path_factory.mktemp("cache"),
        "model.name": "crnn_tiny",
        "central.warmup_epochs": 1,
    }.items():
        argv += ["--set", f"{key}={value}"]
    assert main(argv) == 0
    return out


@pytest.fixture(scope="module")
def exported(run_dir):
    assert main(["export", str(run_dir), "--int8"]) == 0
    return run_dir / "model.onnx"


def test_export_writes_the_graph_and_checks_it_against_pytorch(run_dir, exported, capsys):
    meta = json.loads(exported.with_suffix(".json").read_text())
    check = meta["check"]
    assert check["argmax_agreement"] == 1.0
    assert check["max_abs_logit_diff"] <= 1e-4 * max(1.0, check["max_abs_logit"])
    assert 1.0 < check["max_abs_logit"] < 100  # (a trained 35-word model's logits: a few units)
    run = json.loads((run_dir / "results.json").read_text())["final"]
    assert check["run_accuracy"] == pytest.approx(run["accuracy"])  # the run's selected model
    assert meta["sample_rate"] == 16000 and meta["clip_samples"] == 16000
    assert len(meta["labels"]) == 35  # (GSC's 35 words, data.task=35)
    assert meta["source"]["algorithm"] == "central" and meta["fedac_version"]
    int8 = exported.with_name("model-int8.onnx")
    q = json.loads(int8.with_suffix(".json").read_text())["quantization"]
    assert q["calibration"]["split"] == "train" and q["calibration"]["clips"] > 0
    assert int8.stat().st_size == q["int8_bytes"] < 0.6 * exported.stat().st_size
    assert q["accuracy_drop_points"] == pytest.approx(
        100 * (q["float_accuracy"] - q["int8_accuracy"])
    )


def test_predict_gives_the_runs_own_prediction(run_dir, exported, capsys):
    from fedac.export.run import load_trained
    from fedac.training.evaluate import clip_predictions

    trained = load_trained(run_dir)
    manifest = trained.data.manifest
    test = manifest.split_indices("test")
    predicted = clip_predictions(trained.model, trained.data.test).tolist()
    files = [manifest.clips[i].path for i in test[:6]]
    for model in (run_dir, exported):
        capsys.readouterr()
        assert main(["predict", str(model), *files, "--top", "2"]) == 0
        lines = capsys.readouterr().out.splitlines()
        top = [line.split(": ", 1)[1].split(" ")[0] for line in lines]
        assert top == [trained.labels[p] for p in predicted[:6]]


def test_stream_prints_the_decoders_detections(run_dir, exported, tmp_path, capsys):
    from fedac.data.audio import load_audio
    from fedac.export.predict import open_classifier
    from fedac.export.stream import StreamSettings, concatenate, stream

    clf = open_classifier(exported)
    manifest = json.loads(exported.with_suffix(".json").read_text())
    assert manifest["labels"] == clf.labels
    from fedac.export.run import load_trained

    m = load_trained(run_dir).data.manifest
    clips = [load_audio(m.clips[i].path, 16000) for i in m.split_indices("test")[:12]]
    audio, _ = concatenate(clips, 16000, 1.0)
    sf.write(tmp_path / "long.wav", audio, 16000)
    assert main(["stream", str(exported), str(tmp_path / "long.wav"), "--threshold", "0.3"]) == 0
    out = capsys.readouterr().out
    want = stream(clf, audio, StreamSettings(threshold=0.3))
    printed = re.findall(r"^\s+([\d.]+) s  (\S+)  ([\d.]+)$", out, re.M)
    assert [(float(t), label) for t, label, _ in printed] == [
        (pytest.approx(d.time, abs=0.005), d.label) for d in want
    ]
    assert f"{len(want)} detection(s)" in out


def test_the_check_scales_its_logit_tolerance_with_the_logits():
    """1e-4 of the largest |logit| (at least 1e-4): a difference of 1.06e-4 at logits of 5 units
    passes (two runtimes' kernels), 6e-4 there fails, as does 1.5e-4 at logits below 1; any
    window whose argmax differs fails."""
    from fedac.export.onnx_export import check_passed

    def check(diff, largest, agreement=1.0):
        return {"max_abs_logit_diff": diff, "max_abs_logit": largest, "argmax_agreement": agreement}

    assert check_passed(check(1.06e-4, 5.0)) and check_passed(check(0.9e-4, 0.5))
    assert not check_passed(check(6e-4, 5.0)) and not check_passed(check(1.5e-4, 0.5))
    assert not check_passed(check(0.0, 5.0, agreement=0.99))
