"""Audio that lives on one device, and `fedac data split-devices`, which makes such folders from a
dataset.

A Flower SuperNode in device mode (docs/flower.md) trains from a folder of its own labelled clips.
The folder's layout (node-config `data-layout`):

  csv       a CSV with columns `file,label` (default `<root>/labels.csv`; `file` relative to the
            root). The row order is the clip order, over which the local hold-out is drawn
            (`split-devices` writes the rows in the order of the dataset's manifest, so a device
            draws the simulator's hold-out).
  folders   `<root>/<label>/<file>.wav`, clips in sorted path order.
  official  the official layout of the run's dataset, restricted to the files present: Speech
            Commands `<word>/<file>.wav` (the 12-class task maps the other words to `_unknown_`;
            background noise is not cut into `_silence_` slices on a device: list such slices in a
            CSV), CREMA-D `AudioWAV/<actor>_<sentence>_<emotion>_<level>.wav`, UrbanSound8K
            `audio/fold<k>/<fsID>-<classID>-<occurrence>-<slice>.wav`. File names are parsed with
            the dataset loaders' own patterns. IEMOCAP has no per-file labels in its layout: use
            csv.
  auto      (default) csv when the CSV exists, else official when the dataset's official folders are
            there, else folders.

The run's label set comes from the server (it sends the class names with every message). A file
whose label the run does not know is skipped and counted by label; a file that cannot be decoded is
skipped and named. Both go into the `DeviceReport`, which the node sends to the server, so nothing
crashes on a device's odd files. Every file is decoded once to check it (features.undecodable, the
check data.on_bad_file=skip uses too); the verdict is cached under the feature cache, keyed by the
file's path, size and modification time.
"""

from __future__ import annotations

import csv
import json
import logging
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import soundfile as sf

from fedac.config import Config
from fedac.data import cremad, gsc, urbansound8k
from fedac.data.features import screen_manifest, undecodable
from fedac.data.layout import cached_stats, finish, shorten
from fedac.data.manifest import Clip, Manifest
from fedac.data.partition import partition
from fedac.data.registry import dataset_spec, load_manifest
from fedac.errors import ConfigError, DatasetError

log = logging.getLogger(__name__)

LABELS_CSV = "labels.csv"
DEVICE_INFO = "device.json"
LAYOUTS = ("auto", "csv", "folders", "official")
UNPARSED = "(unparsed file name)"


@dataclass
class DeviceReport:
    """What a device's folder held besides the clips it trains on."""

    files: int = 0
    """Audio files listed or found."""
    unknown: Counter = field(default_factory=Counter)
    """Label -> files skipped because the run does not know that label."""
    corrupt: list[str] = field(default_factory=list)
    """Files skipped because they cannot be decoded ('path: reason')."""
    missing: list[str] = field(default_factory=list)
    """CSV rows whose file does not exist."""

    def summary(self) -> str:
        parts = []
        if self.unknown:
            labels = ", ".join(f"{label} ({n})" for label, n in sorted(self.unknown.items()))
            parts.append(
                f"{sum(self.unknown.values())} file(s) with labels the run does not know: {labels}"
            )
        if self.corrupt:
            parts.append(f"{len(self.corrupt)} unreadable file(s): {shorten(self.corrupt, 3)}")
        if self.missing:
            parts.append(
                f"{len(self.missing)} listed file(s) that do not exist: {shorten(self.missing, 3)}"
            )
        return "; ".join(parts)


# --------------------------------------------------------------------------- reading a device's
# folder


def _official_entries(root: Path, dataset: str, classes: list[str]) -> list[tuple[Path, str]]:
    """(file, label name) of the official-layout files present, named by the dataset loader's
    patterns."""
    entries: list[tuple[Path, str]] = []
    if dataset == "speech_commands":
        # The label is the word folder; words outside the task's classes are `_unknown_` (12-class
        # task). Other folders keep their name as label, so they are reported as labels the run does
        # not know.
        for path, word in _folder_entries(root):
            unknown = word in gsc.WORDS_35 and word not in classes and gsc.UNKNOWN in classes
            entries.append((path, gsc.UNKNOWN if unknown else word))
    elif dataset == "cremad":
        for path in sorted((root / "AudioWAV").glob("*.wav")):
            match = cremad.FILENAME.match(path.name)
            entries.append((path, match["emotion"] if match else UNPARSED))
    elif dataset == "urbansound8k":
        for path in sorted((root / "audio").glob("fold*/*.wav")):
            parts = path.stem.split("-")
            known = (
                len(parts) == 4 and parts[1].isdigit() and int(parts[1]) < len(urbansound8k.CLASSES)
            )
            entries.append((path, urbansound8k.CLASSES[int(parts[1])] if known else UNPARSED))
    else:
        raise ConfigError(
            f"data-layout=official is not available for dataset '{dataset}' on a device (its "
            f"labels are not in its file names): write a {LABELS_CSV} with columns file,label and "
            "use data-layout=csv"
        )
    return entries


def _has_official_layout(root: Path, dataset: str) -> bool:
    if dataset == "speech_commands":
        return any((root / word).is_dir() for word in gsc.WORDS_35)
    return (root / {"cremad": "AudioWAV", "urbansound8k": "audio"}.get(dataset, "\0")).is_dir()


def _csv_entries(root: Path, table: Path, report: DeviceReport) -> list[tuple[Path, str]]:
    if not table.is_file():
        raise DatasetError(
            f"label table {table} does not exist: write one with columns file,label "
            f"(file relative to {root}), or start the node with data-layout=folders"
        )
    with open(table, newline="") as handle:
        reader = csv.DictReader(handle)
        if not {"file", "label"} <= set(reader.fieldnames or []):
            raise DatasetError(
                f"{table} must have the columns file,label (it has {reader.fieldnames}); "
                "add a header row 'file,label'"
            )
        entries = []
        for row in reader:
            path = root / str(row["file"]).strip()
            if not path.is_file():
                report.missing.append(str(path))
                continue
            entries.append((path, str(row["label"]).strip()))
    return entries


def _folder_entries(root: Path) -> list[tuple[Path, str]]:
    return [
        (path, path.parent.name)
        for path in sorted(root.glob("*/*.wav"))
        if not path.parent.name.startswith(".")
    ]


def read_device(
    root: str | Path,
    cfg: Config,
    classes: list[str],
    client: str,
    layout: str = "auto",
    labels_csv: str | None = None,
) -> tuple[Manifest, DeviceReport]:
    """The device's usable clips as a Manifest (every clip its own client's training data, labels
    indexed in `classes`, the run's label set) and a report of what was skipped."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DatasetError(f"device data folder {root} (node-config data-root) does not exist")
    if layout not in LAYOUTS:
        raise ConfigError(
            f"node-config data-layout must be one of {', '.join(LAYOUTS)}, got {layout!r}"
        )
    table = Path(labels_csv).expanduser() if labels_csv else root / LABELS_CSV
    if layout == "auto":
        layout = (
            "csv"
            if table.is_file()
            else ("official" if _has_official_layout(root, cfg.dataset) else "folders")
        )
    report = DeviceReport()
    if layout == "csv":
        entries = _csv_entries(root, table, report)
    elif layout == "official":
        entries = _official_entries(root, cfg.dataset, classes)
    else:
        entries = _folder_entries(root)
    report.files = len(entries) + len(report.missing)
    index = {name: i for i, name in enumerate(classes)}
    known = []
    for path, label in entries:
        if label in index:
            known.append((path, index[label]))
        else:
            report.unknown[label] += 1
    bad = undecodable([path for path, _ in known], cfg.data.cache_dir)
    report.corrupt = [f"{path}: {reason}" for path, reason in bad.items()]
    clips = [
        Clip(str(path), label, client, "train", group=str(path))
        for path, label in known
        if str(path) not in bad
    ]
    if report.summary():
        log.warning("device %s (%s): skipped %s", client, root, report.summary())
    if not clips:
        raise DatasetError(
            f"device {client}: {root} holds no usable clip (layout {layout}, {report.files} "
            f"file(s); {report.summary() or 'none found'}). Put clips as <label>/<file>.wav or "
            f"list them in {table.name}, with labels of the run: {', '.join(classes)}"
        )
    return Manifest(f"device-{cfg.dataset}", str(root), list(classes), clips), report


# --------------------------------------------------------------------------- split-devices


def _device_name(clip: Clip, label: str, taken: set[str]) -> str:
    """`<label>/<file>`, prefixed with the source folder (and the slice offset) when two clips would
    collide."""
    path = Path(clip.path)
    stem = path.stem if not clip.duration else f"{path.stem}_{clip.offset:g}s"
    name = f"{label}/{stem}{path.suffix}"
    if name in taken:
        name = f"{label}/{path.parent.name}_{stem}{path.suffix}"
    taken.add(name)
    return name


def _copy_clip(clip: Clip, dest: Path) -> None:
    """The file as it is, or the slice [offset, offset + duration) of it in its own format."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if not clip.offset and clip.duration is None:
        shutil.copyfile(clip.path, dest)
        return
    info = sf.info(clip.path)
    start = int(round(clip.offset * info.samplerate))
    stop = None if clip.duration is None else start + int(round(clip.duration * info.samplerate))
    data, rate = sf.read(clip.path, start=start, stop=stop, always_2d=True, dtype="float64")
    sf.write(dest, data, rate, subtype=info.subtype)


def split_devices(cfg: Config, out: str | Path, progress: bool = True) -> dict:
    """One folder per client of the run's partition, `<out>/<client>/<label>/<file>` with a
    `labels.csv` (rows in manifest order, true labels: label errors are drawn on the device at run
    time, as in the simulator) and a `device.json` naming the client. Clips of validation and test
    stay off the devices."""
    from fedac.progress import bar as progress_bar

    spec = dataset_spec(cfg.dataset)
    # data.on_bad_file=skip leaves the same clips out as `fedac run`, so the devices get the
    # simulator's partition
    manifest, bad = screen_manifest(
        load_manifest(cfg, progress), cfg.data.on_bad_file, cfg.data.cache_dir, progress
    )
    if bad:
        log.warning(
            "split-devices: left out %d audio file(s) that cannot be decoded "
            "(data.on_bad_file=skip): %s",
            len(bad),
            shorten(sorted(bad), 3),
        )
    splits = partition(manifest, cfg.data, cfg.seed, spec.default_partition)
    out = Path(out)
    params = {
        "dataset": manifest.name,
        "root": str(Path(manifest.root).resolve()),
        "seed": cfg.seed,
        "task": cfg.data.task,
        "partition": cfg.data.partition or spec.default_partition,
        "num_clients": cfg.data.num_clients,
        "alpha": cfg.data.alpha,
        "max_clients": cfg.data.max_clients,
        "test_fold": cfg.data.test_fold,
        "min_client_size": cfg.data.min_client_size,
        "group_by_source": cfg.data.group_by_source,
    }
    if bad:  # (only then: folders written before this setting existed stay valid)
        params["bad_files"] = sorted(bad)
    names = [split.name for split in splits]
    try:
        stats = cached_stats(out, params, names)
    except FileExistsError as exc:
        raise DatasetError(f"split-devices --out: {exc}") from None
    if stats is not None:
        return stats
    for split in progress_bar(splits, desc="split-devices", unit="client", disable=not progress):
        folder = out / split.name
        rows: list[tuple[str, str]] = []
        taken: set[str] = set()
        for index in sorted(split.train + split.holdout):
            clip = manifest.clips[index]
            label = manifest.classes[clip.label]
            name = _device_name(clip, label, taken)
            _copy_clip(clip, folder / name)
            rows.append((name, label))
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / LABELS_CSV, "w", newline="") as handle:
            writer = csv.writer(handle, lineterminator="\n")
            writer.writerow(["file", "label"])
            writer.writerows(rows)
        (folder / DEVICE_INFO).write_text(
            json.dumps(
                {"client": split.name, "dataset": cfg.dataset, "clips": len(rows), **params},
                indent=2,
            )
            + "\n"
        )
    sizes = [len(s.train) + len(s.holdout) for s in splits]
    stats = {
        "clients": len(splits),
        "clips": sum(sizes),
        "min_clips": min(sizes),
        "max_clips": max(sizes),
    }
    finish(out, params, stats)
    return stats


def device_client_name(root: str | Path) -> str | None:
    """The client a `split-devices` folder was cut for (its device.json), else None."""
    info = Path(root).expanduser() / DEVICE_INFO
    if not info.is_file():
        return None
    try:
        return str(json.loads(info.read_text())["client"])
    except (ValueError, KeyError):
        raise DatasetError(
            f"{info} is not a split-devices description (no 'client'); delete it or "
            "name the client with node-config client=NAME"
        ) from None
