"""`fedac export`: a run's model as an ONNX graph (waveform in, logits out) through torch's own
exporter (`torch.onnx.export(dynamo=True)`, onnx + onnxscript), a sidecar JSON that describes it,
and the check that the graph computes what PyTorch does.

The graph's input `waveform` is (batch, samples) float32 at the sidecar's `sample_rate`: one model
input window of `clip_samples` samples for feature networks (a longer clip is cut as
data/audio.py's `fit_length` cuts it and its windows' logits averaged, as evaluation does); any
length for SSL encoders (one clip per row). Its output `logits` is (batch, classes) in the order of
the sidecar's `labels`.

The CRNNs' and MHAttRNN's nn.GRU export as ONNX's standard GRU operator: fedac's compiled GRU
kernel (fedac/kernels) belongs to the stacked cohort path of training only and never enters a
single model's forward, so there is nothing to swap out; the check below compares the numbers.

The check runs onnxruntime on every test-split clip of the run and reports: the largest absolute
difference between its logits and PyTorch's on the same waveforms (`max_abs_logit_diff`), the
share of windows whose argmax agrees (`argmax_agreement`), the test accuracy of the exported
model, and the share of clips where it predicts what the run's own evaluation predicted (features
from the float16 cache; export/frontend.py says why these may differ in rare clips).
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fedac.errors import ConfigError, FedacError
from fedac.export.run import FEATURE_KEYS, TrainedModel

ONNX_EXTRA = "pip install -e '.[export]' (scripts/setup.sh installs it)"
OPSET = 20
INPUT, OUTPUT = "waveform", "logits"


class ExportError(FedacError):
    """The exporter cannot trace a model (the message names the layer)."""


def need_onnx() -> None:
    """onnx, onnxscript and onnxruntime, or a ConfigError naming the extra."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            f"fedac export needs {exc.name}, fedac's `export` extra: {ONNX_EXTRA}"
        ) from None


def session(path: str | Path, threads: int = 0):
    """An onnxruntime CPU session of `path` (threads 0: onnxruntime's default)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@contextlib.contextmanager
def _quiet():
    """torch.onnx's progress lines, its warnings and its log records, kept out of the output."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch._export", "torch.export")]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)


def _export(module: nn.Module, example: torch.Tensor, free_length: bool):
    """torch.onnx.export's program of `module` on `example` (batch axis free, the samples axis too
    when `free_length`)."""
    dims: dict[int, Any] = {0: torch.export.Dim.AUTO}
    if free_length:
        dims[1] = torch.export.Dim("samples", min=2000, max=16000 * 600)
    with _quiet(), torch.no_grad():
        return torch.onnx.export(
            module,
            (example,),
            dynamo=True,
            opset_version=OPSET,
            input_names=[INPUT],
            output_names=[OUTPUT],
            dynamic_shapes=(dims,),
            verbose=False,
        )


def untraceable_layer(module: nn.Module, example: torch.Tensor) -> tuple[str, str] | None:
    """(name, reason) of the first leaf module, in forward order, that the exporter cannot take to
    ONNX alone on the input it receives; None when each can (the failure lies between them)."""
    seen: list[tuple[str, nn.Module, tuple]] = []
    hooks = [
        m.register_forward_hook(lambda mod, args, _out, name=name: seen.append((name, mod, args)))
        for name, m in module.named_modules()
        if name and not list(m.children())
    ]
    try:
        with torch.no_grad():
            module(example)
    except Exception as exc:  # (the model fails in PyTorch itself: that is the reason)
        return type(module).__name__, f"it fails in PyTorch: {_first_line(exc)}"
    finally:
        for hook in hooks:
            hook.remove()
    for name, layer, args in seen:
        try:
            if len(args) == 1 and isinstance(args[0], torch.Tensor) and args[0].dim() >= 1:
                _export(layer, args[0], False)
            else:
                with _quiet(), torch.no_grad():
                    torch.export.export(layer, tuple(args), strict=False)
        except Exception as exc:
            return f"{name} ({type(layer).__name__})", _first_line(exc)
    return None


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def write_onnx(
    module: nn.Module, example: torch.Tensor, path: Path, free_length: bool
) -> list[str]:
    """Export `module` to `path`, or an ExportError naming the layer the exporter cannot trace.
    Returns the names of the feature front end's nodes (`front_nodes`). The file keeps no
    exporter metadata (source lines, module paths: a third of a small model's file)."""
    import onnx

    try:
        program = _export(module, example, free_length)
    except Exception as exc:  # any tracing failure: name the layer, not a traceback
        where = untraceable_layer(module, example)
        layer, why = where if where else ("(between layers)", _first_line(exc))
        raise ExportError(
            f"torch.onnx cannot trace layer {layer}: {why}. Write that layer with torch "
            "operations on tensors only (no .item(), .numpy() or Python branches on values)"
        ) from None
    path.parent.mkdir(parents=True, exist_ok=True)
    model = program.model_proto
    front = front_nodes(model)
    for item in [*model.graph.node, *model.graph.value_info, *model.graph.input]:
        del item.metadata_props[:]
    onnx.save(model, str(path))
    return front


#: Name scope of the feature front end in the exported graph (export/frontend.py `FeatureModel`).
FRONT_SCOPE = "front"


def front_nodes(model) -> list[str]:
    """Names of the nodes of the feature front end (their torch name scope starts at `front`)."""
    names = []
    for node in model.graph.node:
        scopes = {p.key: p.value for p in node.metadata_props}.get("pkg.torch.onnx.name_scopes")
        path = ast.literal_eval(scopes) if scopes else []
        if len(path) > 1 and path[1] == FRONT_SCOPE:
            names.append(node.name)
    return names


def test_inputs(trained: TrainedModel) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """The test split as the graph reads it: its waveform rows (equal-length windows of feature
    networks, whole clips of SSL encoders), the clip of each row, and each clip's label."""
    from fedac.data.features import clip_waveforms
    from fedac.data.waveform import load_waveform

    cfg, manifest = trained.cfg, trained.data.manifest
    clips = manifest.split_indices("test")
    rows, owner = [], []
    for position, index in enumerate(clips):
        if trained.ssl:
            waves = [
                load_waveform(manifest.clips[index], 16000, cfg.data.snr_db, cfg.seed),
            ]
        else:
            waves = clip_waveforms(manifest, index, cfg.features, cfg.data.snr_db, cfg.seed)
        rows += waves
        owner += [position] * len(waves)
    labels = np.array([manifest.clips[i].label for i in clips])
    return rows, np.array(owner), labels


def graph_fn(sess):
    """Waveform batch -> logits of onnxruntime session `sess`."""
    return lambda batch: sess.run([OUTPUT], {INPUT: batch})[0]


def run_rows(fn, rows: list[np.ndarray], batch: int = 256) -> np.ndarray:
    """fn over the rows in batches of equal length (one row at a time where lengths differ)."""
    same = len({len(r) for r in rows}) == 1
    size = batch if same else 1
    return np.concatenate(
        [fn(np.stack(rows[i : i + size])) for i in range(0, len(rows), size)]
    ).astype(np.float64)


def clip_mean(out: np.ndarray, owner: np.ndarray, clips: int) -> np.ndarray:
    """Each clip's mean logits over its windows (training/evaluate.py `clip_argmax`)."""
    summed = np.zeros((clips, out.shape[1]))
    np.add.at(summed, owner, out)
    return summed / np.bincount(owner, minlength=clips)[:, None]


def check_export(trained: TrainedModel, path: Path) -> dict[str, Any]:
    """onnxruntime against PyTorch on the run's test split (the module docstring)."""
    from fedac.training.evaluate import clip_predictions

    rows, owner, labels = test_inputs(trained)
    sess = session(path)

    def torch_fn(batch: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return trained.deployed(torch.from_numpy(batch)).numpy()

    try:
        got = run_rows(graph_fn(sess), rows)
    except Exception as exc:  # (a shape the exporter fixed where the model varies it)
        raise ExportError(
            f"onnxruntime cannot run the exported {path} on the test split: {_first_line(exc)}"
        ) from None
    want = run_rows(torch_fn, rows)
    clip_pred = clip_mean(got, owner, len(labels)).argmax(1)
    run_pred = clip_predictions(trained.model, trained.data.test).numpy()
    return {
        "split": "test",
        "clips": int(len(labels)),
        "windows": int(len(rows)),
        "max_abs_logit_diff": float(np.abs(got - want).max()),
        "max_abs_logit": float(np.abs(want).max()),
        "argmax_agreement": float((got.argmax(1) == want.argmax(1)).mean()),
        "accuracy": float((clip_pred == labels).mean()),
        "run_accuracy": float((run_pred == labels).mean()),
        "agreement_with_run": float((clip_pred == run_pred).mean()),
    }


#: The check's tolerance on the logits, relative to the largest |logit| (at least 1): onnxruntime
#: and PyTorch pick their own kernels per CPU (AVX2, AVX-512), whose sums round differently; on a
#: CPU where PyTorch ran AVX2 kernels (ATEN_CPU_CAPABILITY=avx2) and onnxruntime AVX-512 ones, a
#: 35-word crnn_lite differed by 1.06e-4 at logits of a few units.
LOGIT_TOLERANCE = 1e-4


def check_passed(check: dict[str, Any]) -> bool:
    """Same argmax on every window, and logits within LOGIT_TOLERANCE of PyTorch's."""
    scale = max(1.0, float(check.get("max_abs_logit", 1.0)))
    return (
        check["argmax_agreement"] == 1.0 and check["max_abs_logit_diff"] <= LOGIT_TOLERANCE * scale
    )


def sidecar(trained: TrainedModel, path: Path, extra: dict[str, Any]) -> dict[str, Any]:
    """What a device needs beside the graph (labels, audio, features) and where it came from."""
    from fedac.data.features import resolve_features
    from fedac.version import code_version

    features = resolve_features(trained.cfg.features)
    version = code_version()
    return {
        "format": "onnx",
        "file": path.name,
        "input": {"name": INPUT, "shape": ["batch", "samples"], "dtype": "float32"},
        "output": {"name": OUTPUT, "shape": ["batch", len(trained.labels)]},
        "labels": trained.labels,
        "sample_rate": trained.sample_rate,
        "clip_samples": None if trained.ssl else trained.clip_samples,
        "clip_seconds": None if trained.ssl else features.clip_seconds,
        "waveform_input": "ssl" if trained.ssl else "features",
        "features": (
            {"front_end": "wav2vec 2.0 CNN encoder on the per-utterance normalised waveform"}
            if trained.ssl
            else {"style": features.style, **{k: getattr(features, k) for k in FEATURE_KEYS}}
        ),
        "fedac_version": version["fedac"],
        "code_version": {k: version[k] for k in ("source_sha256", "git_commit")},
        "source": trained.source,
        **extra,
    }


def write_sidecar(path: Path, content: dict[str, Any]) -> Path:
    side = path.with_suffix(".json")
    side.write_text(json.dumps(content, indent=2) + "\n")
    return side


def file_mb(path: Path) -> float:
    return os.path.getsize(path) / 1e6
