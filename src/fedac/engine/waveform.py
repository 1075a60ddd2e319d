"""Config -> resident federated data for SSL encoders (model.name=w2v2_*): the waveform path.

Every clip is read whole (no 1 s windows), resampled to 16 kHz, noised as the feature path does
(`data.snr_db`) and normalised per utterance. With the CNN frozen (`model.freeze_cnn`, the default)
each clip goes through it once and its frames (T, C) are what the clients hold, cached on disk under
$FEDAC_HOME/ssl-frames keyed by the files (size, mtime), the audio settings and a hash of the CNN's
weights; otherwise the clients hold the waveforms. Either way a client's clips are one `Padded`
batch with their lengths, and a CTC task's targets are `Padded` character ids.

The frozen CNN is the one of the model every client starts from: the checkpoint's at
`model.encoder_path`, else the named size drawn with the global model's seed (`global-init`).

Splits: train (partitioned into clients), val (model selection), test, and every other split name of
the manifest as an extra test split reported as `<split>_<metric>` (LibriSpeech's test_other). A
manifest with speaker-verification trials (VoxCeleb1) adds the extra split `asv`, scored by EER on
the cosine of the model's pooled embeddings.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor

import torch

from fedac.algorithms import ALGORITHMS, algorithm_class
from fedac.config import Config
from fedac.data.corrupt import corrupt_training_labels
from fedac.data.features import cache_root
from fedac.data.manifest import SPLITS, Clip, Manifest
from fedac.data.partition import partition
from fedac.data.registry import dataset_spec
from fedac.data.text import encode
from fedac.data.waveform import Padded, load_waveform
from fedac.engine.manifest import usable_manifest
from fedac.errors import ConfigError, DatasetError
from fedac.models.ssl import build_encoder, cnn_fingerprint, cnn_frames
from fedac.progress import bar as progress_bar
from fedac.seeding import derive_seed
from fedac.training.types import ClientData, EvalSplit, FederatedData, Task

log = logging.getLogger(__name__)
# 2: truncated WAV files are rejected; a version-1 cache may hold a cut file's frames
CACHE_VERSION = 2


def frozen_cnn(cfg: Config) -> torch.nn.Module:
    """The CNN feature encoder the global model starts from (see the module docstring)."""
    with torch.random.fork_rng():
        torch.manual_seed(derive_seed(cfg.seed, "global-init"))
        return build_encoder(
            cfg.model.name, cfg.model.encoder_path, cfg.model.dropout
        ).feature_extractor


def cnn_workers() -> int:
    """Threads that compute CNN frames side by side: the cores left over by torch's intra-op
    threads (`runtime.threads`, 1 by default), at most 8. Each thread runs whole clips, so no
    thread waits on another's barrier when the machine is busy."""
    return max(1, min(8, (os.cpu_count() or 1) // max(1, torch.get_num_threads())))


def _fingerprint(clips: list[Clip], cfg: Config, cnn_key: str) -> str:
    digest = hashlib.sha256()
    head = {
        "v": CACHE_VERSION,
        "rate": cfg.features.sample_rate,
        "snr_db": cfg.data.snr_db,
        "noise_seed": cfg.seed if cfg.data.snr_db < 100 else None,
        "cnn": cnn_key,
    }
    digest.update(json.dumps(head, sort_keys=True).encode())
    for clip in clips:
        stat = os.stat(clip.path)
        digest.update(
            f"{clip.path}|{clip.offset}|{clip.duration}|{stat.st_size}|{stat.st_mtime_ns}\n".encode()
        )
    return digest.hexdigest()[:24]


def clip_inputs(
    clips: list[Clip], cfg: Config, cnn: torch.nn.Module | None, name: str, progress: bool = True
) -> list[torch.Tensor]:
    """Each clip's model input: CNN frames (T, C) in float16 when `cnn` is given (cached), else its
    float32 waveform (S,)."""

    def waveform(clip: Clip) -> torch.Tensor:
        return torch.from_numpy(
            load_waveform(clip, cfg.features.sample_rate, cfg.data.snr_db, cfg.seed)
        )

    if cnn is None:
        return [
            waveform(clip)
            for clip in progress_bar(
                clips, desc=f"waveforms {name}", unit="clip", disable=not progress
            )
        ]
    path = (
        cache_root(cfg.data.cache_dir)
        / "ssl-frames"
        / f"{name}-{_fingerprint(clips, cfg, cnn_fingerprint(cnn))}.pt"
    )
    if path.is_file():
        stored = torch.load(path, weights_only=True)
        return list(stored["frames"].split(stored["lengths"].tolist()))
    # One clip at a time: padding would change the CNN's group normalisation of shorter clips (and
    # a batch of equal clips changes the last convolution's rounding). Clips on CNN_WORKERS threads
    # instead: each clip's arithmetic is the same, and torch releases the GIL in its kernels.
    cnn.eval()
    with ThreadPoolExecutor(max_workers=cnn_workers()) as pool:
        frames = list(
            progress_bar(
                pool.map(lambda clip: cnn_frames(cnn, waveform(clip)).to(torch.float16), clips),
                total=len(clips),
                desc=f"CNN frames {name}",
                unit="clip",
                disable=not progress,
            )
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    lengths = torch.tensor([len(f) for f in frames], dtype=torch.long)
    torch.save({"frames": torch.cat(frames) if frames else torch.zeros(0), "lengths": lengths}, tmp)
    os.replace(tmp, path)
    return frames


def _targets(manifest: Manifest, indices: list[int], labels: list[int]):
    if manifest.kind == "ctc":
        return Padded.stack(
            [torch.tensor(encode(manifest.clips[i].text), dtype=torch.long) for i in indices],
            dtype=torch.long,
        )
    return torch.tensor([labels[i] for i in indices], dtype=torch.long)


def _eval_split(
    manifest: Manifest, inputs: list[torch.Tensor], split: str, empty_shape
) -> EvalSplit:
    clips = manifest.split_indices(split)
    if not clips:
        raise DatasetError(f"dataset {manifest.name} at {manifest.root} has no '{split}' clips")
    x = Padded.stack([inputs[i] for i in clips], empty_shape)
    labels = torch.tensor([manifest.clips[i].label for i in clips], dtype=torch.long)
    texts = [manifest.clips[i].text for i in clips] if manifest.kind == "ctc" else None
    return EvalSplit(x, torch.arange(len(clips)), labels, kind=manifest.kind, texts=texts)


def _trial_split(manifest: Manifest, cfg: Config, cnn, empty_shape, progress: bool) -> EvalSplit:
    paths = sorted({p for a, b, _ in manifest.trials for p in (a, b)})
    position = {p: i for i, p in enumerate(paths)}
    inputs = clip_inputs(
        [Clip(p, 0, "", "trial") for p in paths], cfg, cnn, f"{manifest.name}-trials", progress
    )
    trials = torch.tensor(
        [(position[a], position[b], target) for a, b, target in manifest.trials], dtype=torch.long
    )
    return EvalSplit(
        Padded.stack(inputs, empty_shape),
        torch.arange(len(paths)),
        torch.zeros(len(paths), dtype=torch.long),
        kind="verification",
        trials=trials,
    )


def encoder_algorithms() -> list[str]:
    """The registered algorithms that train an SSL encoder on waveforms: neither personalized (their
    client models read features) nor in need of a feature network (`trains_ssl_encoders`), nor
    streaming (the zero-shot driver builds its own data)."""
    able = []
    for name in ALGORITHMS:
        try:
            cls = algorithm_class(name)
        except ConfigError:  # (a plug-in that does not load is named when it is chosen)
            continue
        if cls.trains_ssl_encoders and not cls.personalized and not cls.streaming:
            able.append(name)
    return able


def build_waveform_data(
    cfg: Config, progress: bool = True, scheme: str | None = None
) -> FederatedData:
    """The federation of an SSL encoder's run: every client's waveforms (or cached CNN frames) and
    targets. `scheme`: the partition when data.partition is unset (engine/data.py
    `default_partition`: pooled for centralised algorithms); by default the dataset's."""
    cls = algorithm_class(cfg.algorithm)
    if cls.personalized or not cls.trains_ssl_encoders:
        why = (
            "keeps CRNN client models, which read MFCC windows"
            if cls.personalized
            else "trains a feature network (crnn_*, dscnn, mhattrnn, resnet15, kwt, ...)"
        )
        raise ConfigError(
            f"algorithm '{cfg.algorithm}' {why}, not the waveforms of model.name="
            f"{cfg.model.name}; with SSL encoders use {', '.join(encoder_algorithms())}"
        )
    manifest, bad = usable_manifest(cfg, progress)
    cnn = frozen_cnn(cfg) if cfg.model.freeze_cnn else None
    inputs = clip_inputs(manifest.clips, cfg, cnn, manifest.name, progress)
    empty_shape = tuple(inputs[0].shape[1:]) if inputs else ()
    splits = partition(
        manifest, cfg.data, cfg.seed, scheme or dataset_spec(cfg.dataset).default_partition
    )
    labels = corrupt_training_labels(manifest, splits, cfg.data.label_error, cfg.seed).tolist()
    clients = []
    for split in splits:
        train_x, holdout_x = (
            Padded.stack([inputs[i] for i in rows], empty_shape)
            for rows in (split.train, split.holdout)
        )
        clients.append(
            ClientData(
                split.name,
                train_x,
                _targets(manifest, split.train, labels),
                holdout_x,
                _targets(manifest, split.holdout, labels),
            )
        )
    empty = [c.name for c in clients if c.num_samples == 0]
    if empty:
        log.warning(
            "%d clients hold no training clips and are skipped when sampled: %s",
            len(empty),
            empty[:5],
        )
    extra = {
        name: _eval_split(manifest, inputs, name, empty_shape)
        for name in sorted({c.split for c in manifest.clips} - set(SPLITS))
    }
    if manifest.trials:
        extra["asv"] = _trial_split(manifest, cfg, cnn, empty_shape, progress)
    num_features = int(empty_shape[0]) if empty_shape else 1
    task = Task(num_features, manifest.num_classes, [c.name for c in clients], kind=manifest.kind)
    return FederatedData(
        task,
        manifest,
        clients,
        _eval_split(manifest, inputs, "val", empty_shape),
        _eval_split(manifest, inputs, "test", empty_shape),
        extra_test=extra,
        bad_files=bad,
    )
