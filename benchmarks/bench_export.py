"""On-device cost of every zoo network, exported as `fedac export` exports it (waveform in, the
feature front end inside the graph) and run by onnxruntime on one thread: parameters, file size
float and int8, and the median latency of one 1 s clip (batch 1) after warm-up, float and int8.
With `--run DIR` (a trained run, e.g. the default run) its model's int8 accuracy drop on the test
split is measured too (`fedac export --int8`'s figure).

Networks carry random weights (seed 0; the cost does not depend on them) and 35 classes, 40 MFCCs
(the defaults); the SSL encoders' graphs hold their CNN feature encoder. int8 calibration for the
cost rows uses 32 synthetic clips (noise and tones: the sizes and latencies do not depend on it).

    .venv/bin/python benchmarks/bench_export.py [--models crnn_lite dscnn] [--runs 50]
        [--run /tmp/exp-default]

Writes benchmarks/results/export_cost.json; `--stream RUN` instead measures `fedac stream` on 40
of the run's test clips joined by silence (recall, false alarms), written to export_stream.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

RESULT = Path(__file__).parent / "results" / "export_cost.json"
STREAM = RESULT.with_name("export_stream.json")
DEFAULT_MODELS = [
    "crnn_tiny", "crnn_lite", "crnn_mid", "crnn_base", "crnn_deep",
    "dscnn", "mhattrnn", "resnet15", "kwt",
    "cnn2_softmax", "cnn3_relu", "dscnn3_relu", "ann3_relu", "cnn1_softmax", "cnn3_softmax",
    "cnn4_softmax", "w2v2_tiny", "w2v2_s",
]  # fmt: skip


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def deployed(name: str):
    import torch

    from fedac.config import FeatureConfig, ModelConfig
    from fedac.export.frontend import FeatureFrontEnd, FeatureModel, SSLWaveformModel
    from fedac.models import build_model, count_parameters
    from fedac.models.ssl import build_encoder, is_ssl_model

    torch.manual_seed(0)
    if is_ssl_model(name):
        model = build_model(name, 1, 35, options=ModelConfig(name=name, encoder_path="random"))
        cnn = build_encoder(name, "random").feature_extractor
        module = SSLWaveformModel(model.eval(), cnn)
        return module.eval(), count_parameters(model) + count_parameters(cnn)
    model = build_model(name, 40, 35)
    return FeatureModel(FeatureFrontEnd(FeatureConfig()), model).eval(), count_parameters(model)


def clips(count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    t = np.arange(16000) / 16000
    return [
        (0.05 * rng.standard_normal(16000) + 0.3 * np.sin(2 * np.pi * (200 + 50 * i) * t)).astype(
            np.float32
        )
        for i in range(count)
    ]


def latency_ms(path: Path, runs: int, warmup: int = 5) -> float:
    from fedac.export.onnx_export import INPUT, OUTPUT, session

    sess = session(path, threads=1)
    x = clips(1)[0][None]
    for _ in range(warmup):
        sess.run([OUTPUT], {INPUT: x})
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        sess.run([OUTPUT], {INPUT: x})
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def one_network(name: str, runs: int, folder: Path) -> dict:
    import torch

    from fedac.export.onnx_export import write_onnx
    from fedac.export.quantize import quantize_file

    module, params = deployed(name)
    example = torch.from_numpy(np.stack(clips(2)))
    path, path8 = folder / f"{name}.onnx", folder / f"{name}-int8.onnx"
    start = time.perf_counter()
    front = write_onnx(module, example, path, free_length=name.startswith("w2v2"))
    export_s = time.perf_counter() - start
    quantize_file(path, path8, clips(32), front)
    row = {
        "model": name,
        "params": params,
        "float_bytes": path.stat().st_size,
        "int8_bytes": path8.stat().st_size,
        "float_ms": latency_ms(path, runs),
        "int8_ms": latency_ms(path8, runs),
        "export_s": export_s,
    }
    print(json.dumps(row), flush=True)
    return row


def run_drop(run_dir: str) -> dict:
    """`fedac export --int8`'s accuracy drop of a trained run's model on its test split."""
    from fedac.export.onnx_export import check_export, write_onnx
    from fedac.export.quantize import quantize_int8
    from fedac.export.run import load_trained

    trained = load_trained(run_dir)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        example = torch_example(trained.clip_samples)
        front = write_onnx(trained.deployed, example, path, free_length=trained.ssl)
        check = check_export(trained, path)
        q = quantize_int8(trained, path, Path(tmp) / "model-int8.onnx", front)
        q8_ms = latency_ms(Path(tmp) / "model-int8.onnx", 50)
        return {"run": run_dir, "model": trained.cfg.model.name, "check": check, "int8": q,
                "float_ms": latency_ms(path, 50), "int8_ms": q8_ms}  # fmt: skip


def stream_eval(run_dir: str, count: int, thresholds=(0.5, 0.7, 0.9)) -> dict:
    """`fedac stream` on `count` test clips of the run (drawn with seed 0) joined by 1 s of
    silence: recall and false alarms against the clips' positions (same label within one hop), per
    threshold; beside them the model's accuracy on the same clips alone (the ceiling of recall)."""
    from fedac.data.audio import load_audio
    from fedac.export.predict import RunClassifier
    from fedac.export.stream import StreamSettings, concatenate, score, stream

    clf = RunClassifier(Path(run_dir))
    manifest = clf.trained.data.manifest
    test = manifest.split_indices("test")
    chosen = sorted(np.random.default_rng(0).choice(len(test), count, replace=False).tolist())
    audio_clips = [load_audio(manifest.clips[test[i]].path, clf.sample_rate) for i in chosen]
    labels = [manifest.classes[manifest.clips[test[i]].label] for i in chosen]
    alone = [clf.labels[int(clf.logits([c]).argmax())] for c in audio_clips]
    audio, starts = concatenate(audio_clips, clf.sample_rate, 1.0)
    out = {"run": run_dir, "clips": count, "gap_s": 1.0, "seconds": len(audio) / clf.sample_rate,
           "accuracy_alone": float(np.mean([a == b for a, b in zip(alone, labels)]))}  # fmt: skip
    for threshold in thresholds:
        s = StreamSettings(threshold=threshold)
        out[f"threshold_{threshold}"] = score(
            stream(clf, audio, s), list(zip(starts, labels)), s.hop
        )
    return out


def torch_example(samples: int):
    import torch

    return torch.randn(2, samples, generator=torch.Generator().manual_seed(0))


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    parser.add_argument("--runs", type=int, default=50, help="timed runs per model (median)")
    parser.add_argument("--run", help="a trained run directory: its int8 accuracy drop")
    parser.add_argument("--out", default=str(RESULT))
    parser.add_argument(
        "--stream",
        metavar="RUN",
        help="only `fedac stream` on RUN's test clips: export_stream.json",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.stream:
        result = {"command": f"benchmarks/bench_export.py --stream {args.stream}",
                  **stream_eval(args.stream, 40)}  # fmt: skip
        STREAM.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
        return
    import onnxruntime

    with tempfile.TemporaryDirectory() as tmp:
        rows = [one_network(name, args.runs, Path(tmp)) for name in args.models]
    result = {
        "command": "benchmarks/bench_export.py "
        + " ".join(
            f"--{k} {' '.join(v) if isinstance(v, list) else v}"
            for k, v in vars(args).items()
            if v and k != "out"
        ),  # fmt: skip
        "cpu": cpu_name(),
        "threads": 1,
        "onnxruntime": onnxruntime.__version__,
        "torch": torch.__version__,
        "clip": "1 s at 16 kHz, batch 1",
        "networks": rows,
    }
    if args.run:
        result["trained_run"] = run_drop(args.run)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
