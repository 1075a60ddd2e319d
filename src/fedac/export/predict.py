"""`fedac predict`: the top-k labels of audio files, from a run directory (PyTorch, the run's own
preprocessing bit for bit: features through the float16 feature cache's rounding, then CMVN, as
its evaluation computed them) or from an exported graph (onnxruntime, with its sidecar JSON beside
it).

A file is read as training reads a clip (data/audio.py `load_audio`): mono (channels averaged),
resampled to the model's rate (scipy's polyphase filter), then cut into model-input windows as
`fit_length` cuts it (shorter: zero-padded; longer: equal-hop windows whose logits are averaged);
an SSL encoder reads the whole clip normalised per utterance. What was converted is said once per
kind of conversion; a file that cannot be decoded (or holds no samples) names itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedac.errors import ConfigError, FedacError


class Classifier:
    """A model that maps waveform rows to logits, with its labels and audio format."""

    labels: list[str]
    sample_rate: int
    clip_samples: int | None
    """Samples of one model input window; None: whole clips (SSL encoders)."""
    name: str

    def logits(self, rows: list[np.ndarray]) -> np.ndarray:
        raise NotImplementedError


class RunClassifier(Classifier):
    """A run directory's model in PyTorch, fed as its evaluation fed it."""

    def __init__(self, run_dir: Path, client: str | None = None, exit_layer: int | None = None):
        from fedac.export.run import load_trained

        self.trained = t = load_trained(run_dir, client, exit_layer)
        self.labels, self.sample_rate = t.labels, t.sample_rate
        self.clip_samples = None if t.ssl else t.clip_samples
        self.name = f"run {run_dir} (PyTorch)"
        if not t.ssl:
            from fedac.data.features import FeatureExtractor

            self.extractor = FeatureExtractor(t.cfg.features)

    @torch.no_grad()
    def logits(self, rows: list[np.ndarray]) -> np.ndarray:
        from fedac.data.waveform import Padded
        from fedac.training.types import model_input

        t = self.trained
        if t.ssl:
            cnn: Any = t.deployed.cnn  # the frozen CNN whose float16 frames the run cached
            frames = [cnn(torch.from_numpy(r)[None]).transpose(1, 2)[0] for r in rows]
            x = Padded.stack([f.to(torch.float16) for f in frames])
            return t.model(x).numpy()
        feats = self.extractor(torch.from_numpy(np.stack(rows))).to(torch.float16)
        return t.model(model_input(feats, t.cfg)).numpy()


class OnnxClassifier(Classifier):
    """An exported graph run by onnxruntime, described by its sidecar JSON."""

    def __init__(self, path: Path, threads: int = 0):
        from fedac.export.onnx_export import INPUT, OUTPUT, need_onnx, session

        need_onnx()
        side = path.with_suffix(".json")
        if not side.is_file():
            raise FedacError(
                f"{path} has no sidecar {side.name} beside it (labels, sample rate): export it "
                "with `fedac export RUN_DIR --out FILE.onnx`, which writes both"
            )
        meta: dict[str, Any] = json.loads(side.read_text())
        try:
            self.session = session(path, threads)
        except Exception as exc:  # onnxruntime's own error for a damaged or foreign file
            raise FedacError(f"onnxruntime cannot load {path}: {str(exc)[:200]}") from None
        self.io = (INPUT, OUTPUT)
        self.labels, self.sample_rate = list(meta["labels"]), int(meta["sample_rate"])
        self.clip_samples = meta.get("clip_samples")
        self.name = f"{path} (onnxruntime)"
        width = self.session.get_outputs()[0].shape[-1]
        if isinstance(width, int) and width != len(self.labels):
            raise ConfigError(
                f"{path} outputs {width} classes but {side.name} lists {len(self.labels)} labels: "
                "the sidecar belongs to another model; export again to write a matching pair"
            )

    def logits(self, rows: list[np.ndarray]) -> np.ndarray:
        inp, out = self.io
        if len({len(r) for r in rows}) == 1:
            return self.session.run([out], {inp: np.stack(rows)})[0]
        return np.concatenate([self.session.run([out], {inp: r[None]})[0] for r in rows])


def open_classifier(
    path: str | Path, client: str | None = None, exit_layer: int | None = None, threads: int = 0
) -> Classifier:
    """A run directory (PyTorch) or an .onnx file (onnxruntime)."""
    path = Path(path)
    if path.is_dir():
        return RunClassifier(path, client, exit_layer)
    if path.suffix == ".onnx" and path.is_file():
        if client or exit_layer:
            raise ConfigError(
                "--client and --exit choose a run's model; an exported file holds one already"
            )
        return OnnxClassifier(path, threads)
    raise FedacError(
        f"{path} is neither a run directory nor an exported .onnx file (`fedac export` writes one)"
    )


def read_rows(clf: Classifier, path: str | Path, said: set[str]) -> list[np.ndarray]:
    """The model input rows of audio file `path`; a line for each new kind of conversion goes to
    `said` (the caller prints it once)."""
    import soundfile as sf

    from fedac.data.audio import fit_length, load_audio

    audio = load_audio(path, clf.sample_rate)  # (AudioError names the file)
    info = sf.info(str(path))
    if info.samplerate != clf.sample_rate:
        said.add(f"audio at {info.samplerate} Hz resampled to the model's {clf.sample_rate} Hz")
    if info.channels > 1:
        said.add(f"{info.channels} channels averaged to mono")
    if clf.clip_samples is None:
        return [((audio - audio.mean()) / (audio.std() + 1e-7)).astype(np.float32)]
    seconds = clf.clip_samples / clf.sample_rate
    if len(audio) < clf.clip_samples:
        said.add(f"clips shorter than {seconds:g} s zero-padded to it")
    elif len(audio) > clf.clip_samples:
        said.add(
            f"clips longer than {seconds:g} s cut into {seconds:g} s windows at an equal hop, "
            "their logits averaged"
        )
    return fit_length(audio, clf.clip_samples)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def predict(clf: Classifier, path: str | Path, said: set[str], k: int) -> list[tuple[str, float]]:
    """The top `k` (label, probability) of one file: softmax of its windows' mean logits."""
    logits = clf.logits(read_rows(clf, path, said)).astype(np.float64).mean(axis=0)
    probs = softmax(logits)
    order = np.argsort(-probs)[:k]
    return [(clf.labels[i], float(probs[i])) for i in order]
