"""Config -> resident federated tensors: every client's training and held-out windows, val and test.

Features are computed once (and cached on disk), normalised, and gathered into contiguous tensors
per client, so rounds never touch the disk, build DataLoaders or copy models.

A clip that cannot be decoded stops the build with an AudioError naming it (data.on_bad_file=error),
or with data.on_bad_file=skip is left out before anything is computed; the simulator lists such
files in the run directory's bad_files.txt (`record_bad_files`).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from fedac.algorithms import algorithm_class
from fedac.config import Config
from fedac.data.augment import AugmentedWindows, noise_bank
from fedac.data.corrupt import corrupt_training_labels
from fedac.data.features import (
    FeatureExtractor,
    FeatureSet,
    clip_waveforms,
    features_of,
    resolve_features,
    screen_manifest,
)
from fedac.data.layout import shorten
from fedac.data.manifest import Manifest
from fedac.data.partition import ClientSplit, holdout_split, partition
from fedac.data.registry import dataset_spec, load_manifest
from fedac.engine.manifest import usable_manifest
from fedac.engine.waveform import build_waveform_data
from fedac.errors import ConfigError, DatasetError
from fedac.models.ssl import is_ssl_model
from fedac.training.device import resolve_device
from fedac.training.types import (  # noqa: F401
    ClientData,
    EvalSplit,
    FederatedData,
    Task,
    class_labels,
    model_input,
    normalize,
)

log = logging.getLogger(__name__)
BAD_FILES = "bad_files.txt"


def record_bad_files(run_dir: str | Path, data: FederatedData) -> None:
    """`<run_dir>/bad_files.txt`, one `path<TAB>reason` line per file the run left out, and a
    warning saying so; no list (and none left from an earlier build) when every file decoded."""
    path = Path(run_dir) / BAD_FILES
    if not data.bad_files:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(f"{file}\t{reason}\n" for file, reason in sorted(data.bad_files.items()))
    )
    log.warning(
        "data.on_bad_file=skip: %d audio file(s) cannot be decoded and are left out of the run; "
        "the list is in %s",
        len(data.bad_files),
        path,
    )


def _rows_by_clip(feats: FeatureSet, num_clips: int) -> list[torch.Tensor]:
    order = torch.argsort(feats.clip_index, stable=True)
    counts = torch.bincount(feats.clip_index, minlength=num_clips).tolist()
    return list(order.split(counts))


def _gather(
    x: torch.Tensor, rows_of: list[torch.Tensor], clips: list[int], labels: list[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Windows of `clips` with their label and their position in `clips`."""
    # the windows' device (the host while data is built; the zero-shot driver's device)
    device = x.device
    if not clips:
        return (
            x.new_zeros((0, *x.shape[1:])),
            torch.zeros(0, dtype=torch.long, device=device),
            torch.zeros(0, dtype=torch.long, device=device),
        )
    rows = [rows_of[c] for c in clips]
    position = torch.cat(
        [torch.full((len(r),), i, dtype=torch.long, device=device) for i, r in enumerate(rows)]
    )
    window_labels = torch.tensor(labels, dtype=torch.long, device=device)[position]
    return x[torch.cat(rows).to(device)], window_labels, position


def _eval_split(x, rows_of, manifest: Manifest, split: str) -> EvalSplit:
    clips = manifest.split_indices(split)
    if not clips:
        raise DatasetError(f"dataset {manifest.name} at {manifest.root} has no '{split}' clips")
    labels = [manifest.clips[c].label for c in clips]
    wx, _, position = _gather(x, rows_of, clips, labels)
    return EvalSplit(wx, position, torch.tensor(labels, dtype=torch.long))


def _client_data(
    x: torch.Tensor, rows_of: list[torch.Tensor], split: ClientSplit, labels: list[int]
) -> ClientData:
    tx, ty, _ = _gather(x, rows_of, split.train, [labels[c] for c in split.train])
    hx, hy, _ = _gather(x, rows_of, split.holdout, [labels[c] for c in split.holdout])
    return ClientData(split.name, tx, ty, hx, hy)


def warn_long_clips(manifest: Manifest, rows_of: list[torch.Tensor], clip_seconds: float) -> None:
    """One warning naming the clips longer than the model input (more than one window;
    data/audio.py's `fit_length`) and saying how they are cut; a dataset of official clips knows its
    lengths, a user's may not."""
    long = [(len(rows), manifest.clips[i].path) for i, rows in enumerate(rows_of) if len(rows) > 1]
    if not long:
        return

    def shown(path: str) -> Path | str:
        return (
            Path(path).relative_to(manifest.root)
            if Path(path).is_relative_to(manifest.root)
            else path
        )

    names = [
        f"{shown(path)} ({n} windows)"
        for n, path in sorted(long, key=lambda item: (-item[0], item[1]))
    ]
    log.warning(
        "%s %s: %d clip(s) are longer than features.clip_seconds=%g s: %s. Each is cut into "
        "ceil(length / %g s) windows of %g s at an equal hop (the last ending at the clip's end); "
        "every window trains as one example with the clip's label, and a validation or test clip's "
        "windows are averaged into one prediction. Trim the clips to the sound, or set "
        "features.clip_seconds to their length",
        manifest.name,
        manifest.root,
        len(long),
        clip_seconds,
        shorten(names, 3),
        clip_seconds,
        clip_seconds,
    )


def default_partition(cfg: Config) -> str:
    """The partition when data.partition is unset: pooled for centralised algorithms, else the
    dataset's."""
    return (
        "pooled"
        if algorithm_class(cfg.algorithm).centralised
        else dataset_spec(cfg.dataset).default_partition
    )


def feature_device(cfg: Config, device: torch.device | None) -> torch.device:
    """Where features are computed: the run's device (its runtime's, training/runtime.py), or, for a
    caller with no runtime (tests, `fedac compare`), `runtime.device` resolved here. The cache keeps
    a GPU's features apart from the CPU's."""
    return device if device is not None else resolve_device(cfg.runtime.device)


def build_federated_data(
    cfg: Config, progress: bool = True, device: torch.device | None = None
) -> FederatedData:
    if is_ssl_model(cfg.model.name):  # SSL encoders read waveforms, not MFCC windows
        return build_waveform_data(cfg, progress, default_partition(cfg))
    manifest, bad = usable_manifest(cfg, progress)
    if manifest.kind != "classification":
        raise ConfigError(
            f"dataset {cfg.dataset} is a {manifest.kind} task, which needs an SSL encoder: "
            "--set model.name=w2v2_tiny (or w2v2_s, w2v2_m, w2v2_base); "
            f"model.name={cfg.model.name} is a classifier"
        )
    device = feature_device(cfg, device)
    feats = features_of(manifest, cfg, progress, device)
    x = model_input(feats.features, cfg)
    rows_of = _rows_by_clip(feats, len(manifest.clips))
    # a user's own clips (audiofolder, hf): any length
    if dataset_spec(cfg.dataset).synthesizer is None:
        warn_long_clips(manifest, rows_of, resolve_features(cfg.features).clip_seconds)
    splits = partition(manifest, cfg.data, cfg.seed, default_partition(cfg))
    # One label per clip: training clips drawn through their client's transition matrix, every other
    # clip (local hold-outs included) keeps its true label.
    labels = corrupt_training_labels(manifest, splits, cfg.data.label_error, cfg.seed).tolist()
    clients = [_client_data(x, rows_of, split, labels) for split in splits]
    empty = [c.name for c in clients if c.num_samples == 0]
    if empty:
        log.warning(
            "%d clients hold no training windows and are skipped when sampled: %s",
            len(empty),
            empty[:5],
        )
    task = Task(
        int(x.shape[1]),
        manifest.num_classes,
        [c.name for c in clients],
        [
            torch.bincount(
                class_labels(c.y, "build_federated_data"), minlength=manifest.num_classes
            ).tolist()
            for c in clients
        ],
    )
    if cfg.features.augment:
        if not algorithm_class(cfg.algorithm).augmentable:
            raise ConfigError(
                f"features.augment draws new windows for every training batch, which algorithm "
                f"{cfg.algorithm} does not train on; set features.augment=false"
            )
        clients = [_augmented(c, split, manifest, cfg) for c, split in zip(clients, splits)]
    extra = {}
    if cfg.features.test_augment:  # the clean test set beside the augmented one (clean_* results)
        clean = features_of(
            manifest, cfg, progress, device, replace(cfg.features, test_augment=False)
        )
        extra["clean"] = _eval_split(
            model_input(clean.features, cfg),
            _rows_by_clip(clean, len(manifest.clips)),
            manifest,
            "test",
        )
    return FederatedData(
        task,
        manifest,
        clients,
        _eval_split(x, rows_of, manifest, "val"),
        _eval_split(x, rows_of, manifest, "test"),
        extra,
        bad,
    )


def _augmented(
    client: ClientData, split: ClientSplit, manifest: Manifest, cfg: Config
) -> ClientData:
    """`features.augment`: the client's training windows as waveforms, augmented afresh at every
    batch."""
    if not split.train:
        return client
    fcfg = resolve_features(cfg.features)
    waves = [
        w for i in split.train for w in clip_waveforms(manifest, i, fcfg, cfg.data.snr_db, cfg.seed)
    ]
    x = AugmentedWindows(
        torch.from_numpy(np.stack(waves)),
        FeatureExtractor(fcfg),
        lambda f: model_input(f, cfg),
        noise_bank(manifest.root, fcfg.sample_rate),
    )
    return replace(client, x=x)


def build_eval_data(
    cfg: Config, progress: bool = True, device: torch.device | None = None
) -> FederatedData:
    """Only the validation and test splits of the dataset at data.root, and no clients: what a
    Flower server needs when its clients are devices holding their own audio. Training clips are
    never decoded."""
    full = load_manifest(cfg, progress)
    manifest = Manifest(
        full.name, full.root, full.classes, [c for c in full.clips if c.split in ("val", "test")]
    )
    manifest, bad = screen_manifest(manifest, cfg.data.on_bad_file, cfg.data.cache_dir, progress)
    feats = features_of(manifest, cfg, progress, feature_device(cfg, device))
    x = model_input(feats.features, cfg)
    rows_of = _rows_by_clip(feats, len(manifest.clips))
    task = Task(int(x.shape[1]), manifest.num_classes, [])
    return FederatedData(
        task,
        manifest,
        [],
        _eval_split(x, rows_of, manifest, "val"),
        _eval_split(x, rows_of, manifest, "test"),
        bad_files=bad,
    )


def build_device_client(
    cfg: Config,
    manifest: Manifest,
    name: str,
    progress: bool = False,
    device: torch.device | None = None,
) -> ClientData:
    """One device's client from a manifest of its own clips (all of it the client's; see
    data/devices.py), built as `build_federated_data` builds that client: features cached under
    data.cache_dir, the local hold-out drawn by `holdout_split` over the clips in manifest order,
    training labels corrupted by the client's transition matrix when data.label_error > 0."""
    feats = features_of(manifest, cfg, progress, feature_device(cfg, device))
    x = model_input(feats.features, cfg)
    rows_of = _rows_by_clip(feats, len(manifest.clips))
    split = holdout_split(name, list(range(len(manifest.clips))), cfg.data.local_holdout, cfg.seed)
    labels = corrupt_training_labels(manifest, [split], cfg.data.label_error, cfg.seed).tolist()
    return _client_data(x, rows_of, split, labels)
