"""`fedac export --int8`: post-training int8 quantisation of an exported graph with onnxruntime's
quantisation tools, calibrated on clips of the run's own training split.

Two steps:
1. `onnxruntime.quantization.quantize_static` in QDQ form: the weights of every convolution,
   matrix product and linear layer per output channel in int8, their input activations in uint8
   with ranges calibrated (MinMax) on `CALIBRATION_CLIPS` training-split clips drawn at random with
   the run's seed (all the run's clients pooled: the training split is theirs). The feature front
   end is left out: a power spectrum spans ten decades, which an 8-bit activation range cannot hold.
2. Weight-only int8 for what stays in float: the GRUs' weight matrices (onnxruntime quantises no
   GRU statically), the mel filterbank and DCT basis, position embeddings and other large
   constants: each stored as int8 with one scale per row and dequantised in the graph
   (DequantizeLinear, a standard ONNX operator), so the arithmetic stays float while the file
   shrinks to about a quarter.

`fedac export --int8` reports the int8 model's test accuracy beside the float graph's and the drop
between them, and writes both in the int8 model's sidecar.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from fedac.export.onnx_export import INPUT, clip_mean, graph_fn, run_rows, session, test_inputs
from fedac.export.run import TrainedModel

CALIBRATION_CLIPS = 200
#: Constants with fewer elements stay float (small biases, norms, scales).
MIN_WEIGHT_ONLY = 256


def calibration_rows(trained: TrainedModel, clips: int = CALIBRATION_CLIPS):
    """(rows, description): the waveform rows of `clips` training-split clips drawn with the run's
    seed."""
    from fedac.data.features import clip_waveforms
    from fedac.data.waveform import load_waveform

    cfg, manifest = trained.cfg, trained.data.manifest
    train = manifest.split_indices("train")
    rng = np.random.default_rng(cfg.seed)
    chosen = sorted(rng.choice(len(train), min(clips, len(train)), replace=False).tolist())
    rows: list[np.ndarray] = []
    for i in chosen:
        clip = train[i]
        if trained.ssl:
            rows.append(load_waveform(manifest.clips[clip], 16000, cfg.data.snr_db, cfg.seed))
        else:
            rows += clip_waveforms(manifest, clip, cfg.features, cfg.data.snr_db, cfg.seed)
    what = {
        "split": "train",
        "clips": len(chosen),
        "draw": (
            f"uniform without replacement over the {len(train)} training clips, seed {cfg.seed}"
        ),
        "method": "MinMax",
    }
    return rows, what


def _reader(rows: list[np.ndarray], batch: int = 32):
    from onnxruntime.quantization import CalibrationDataReader

    same = len({len(r) for r in rows}) == 1
    size = batch if same else 1
    batches = [np.stack(rows[i : i + size]) for i in range(0, len(rows), size)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter(batches)

        def get_next(self):
            item = next(self.items, None)
            return None if item is None else {INPUT: item}

    return Reader()


def weight_only_int8(model, min_size: int = MIN_WEIGHT_ONLY) -> int:
    """Every float initializer of at least `min_size` elements as int8 (symmetric, one scale per
    row along axis 0) + DequantizeLinear; returns how many were converted."""
    from onnx import TensorProto, helper, numpy_helper

    graph, converted, nodes = model.graph, 0, []
    for init in list(graph.initializer):
        if init.data_type != TensorProto.FLOAT or int(np.prod(init.dims)) < min_size:
            continue
        w = numpy_helper.to_array(init).astype(np.float64)
        rows = w.reshape(w.shape[0], -1) if w.ndim > 1 else w.reshape(1, -1)
        scale = np.abs(rows).max(axis=1) / 127.0
        scale[scale == 0] = 1.0
        q = np.clip(np.round(rows / scale[:, None]), -127, 127).astype(np.int8).reshape(w.shape)
        name = init.name
        per_row = w.ndim > 1
        graph.initializer.remove(init)
        graph.initializer.extend(
            [
                numpy_helper.from_array(q, f"{name}_int8"),
                numpy_helper.from_array(
                    (scale if per_row else scale[:1].reshape(())).astype(np.float32),
                    f"{name}_scale",
                ),
                numpy_helper.from_array(
                    np.zeros(len(scale) if per_row else (), np.int8), f"{name}_zero"
                ),
            ]
        )
        extra: dict[str, Any] = {"axis": 0} if per_row else {}
        nodes.append(
            helper.make_node(
                "DequantizeLinear",
                [f"{name}_int8", f"{name}_scale", f"{name}_zero"],
                [name],
                name=f"{name}_dequantize",
                **extra,
            )
        )
        converted += 1
    for node in reversed(nodes):
        graph.node.insert(0, node)
    return converted


def quantize_file(float_path: Path, out: Path, rows: list[np.ndarray], front: list[str]) -> int:
    """Steps 1 and 2 of the module docstring on `float_path`, calibrated on waveform `rows`,
    written to `out`; returns how many tensors step 2 stored as int8."""
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    staged = out.with_name(f".{out.name}.static")
    root = logging.getLogger()
    level, root.level = root.level, logging.ERROR  # (its advice to pre-process: not applicable)
    try:
        quantize_static(
            str(float_path),
            str(staged),
            _reader(rows),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            weight_type=QuantType.QInt8,
            activation_type=QuantType.QUInt8,
            calibrate_method=CalibrationMethod.MinMax,
            nodes_to_exclude=front,
        )
        model = onnx.load(str(staged))
    finally:
        root.setLevel(level)
        staged.unlink(missing_ok=True)
        for leftover in out.parent.glob("augmented_model*.onnx"):
            leftover.unlink(missing_ok=True)
    weight_only = weight_only_int8(model)
    del model.graph.value_info[:]  # (shapes the quantiser inferred: onnxruntime infers them again)
    onnx.save(model, str(out))
    return weight_only


def quantize_int8(
    trained: TrainedModel, float_path: Path, out: Path, front: list[str]
) -> dict[str, Any]:
    """Write the int8 model of `float_path` to `out` (the module docstring); returns what it did,
    measured: file sizes, the calibration clips, test accuracy float and int8, and the drop.
    `front`: the feature front end's nodes (`onnx_export.write_onnx`), left in float."""
    rows, calibration = calibration_rows(trained)
    weight_only = quantize_file(float_path, out, rows, front)
    return {
        "calibration": calibration,
        "weight_only_int8_tensors": weight_only,
        **int8_accuracy(trained, float_path, out),
    }


def int8_accuracy(trained: TrainedModel, float_path: Path, int8_path: Path) -> dict[str, float]:
    """Test-split clip accuracy of the float and the int8 graph, the drop (points), and how often
    their predictions agree."""
    rows, owner, labels = test_inputs(trained)
    preds = {}
    for key, path in (("float", float_path), ("int8", int8_path)):
        out = run_rows(graph_fn(session(path)), rows)
        preds[key] = clip_mean(out, owner, len(labels)).argmax(1)
    acc = {key: float((p == labels).mean()) for key, p in preds.items()}
    return {
        "float_accuracy": acc["float"],
        "int8_accuracy": acc["int8"],
        "accuracy_drop_points": 100 * (acc["float"] - acc["int8"]),
        "int8_float_agreement": float((preds["float"] == preds["int8"]).mean()),
        "float_bytes": float_path.stat().st_size,
        "int8_bytes": int8_path.stat().st_size,
    }
