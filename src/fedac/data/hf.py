"""A Hugging Face `datasets` folder on disk: ``--dataset hf --set data.root=DIR``.

DIR is what ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` wrote, or a folder of parquet
files (``Dataset.to_parquet``, a Hub snapshot's ``data/train-00000-of-00001.parquet``), split by
file name (``train*`` / ``validation*`` / ``test*``) or by a parent folder of that name; files named
otherwise hold no split. Columns (settings): ``data.audio_column`` (default audio),
``data.label_column`` (label), ``data.speaker_column`` (speaker_id, optional: the natural client).
Labels are a ClassLabel (classes in its order), strings or integers (sorted). Audio is the datasets
Audio feature (``{bytes, path}``) or ``{array, sampling_rate}`` or a local path; bytes are decoded
by soundfile, never fetched.

fedac's pipeline reads files (features, their cache key, `split-devices`), so each clip is written
once into the cache (``<cache>/hf/<key>/clips``; bytes as they are, arrays as float WAV, paths used
where they lie) and checked with `audio.load_audio`, which later decodes and resamples it like every
other loader's clips. The key covers DIR, its arrow / parquet / json files (size, mtime) and the
audio column, so a changed dataset gets new clip files, and thereby a new feature-cache key.

Splits and clients follow audiofolder's rules (`layout.user_manifest`): a dataset without a
validation or test split gets a seeded client-disjoint 10% one, announced by a warning; without a
speaker column training clips are dealt over ``data.num_clients`` (``data.partition=dirichlet`` /
``iid`` still work), fitted to a small dataset when left at its default as audiofolder's
(registry.fit_dealt_clients). Speech Commands as the datasets library writes it (file, audio, label,
is_unknown, speaker_id, utterance_id) thus trains on its own train / validation / test splits,
client = speaker; its ``_silence_`` rows, which have no speaker, are given to seeded training
speakers.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import soundfile as sf

from fedac.config import DataConfig
from fedac.data.audio import REMEDY, load_audio
from fedac.data.layout import SPLIT_NAMES, cached_stats, case_twins, finish, shorten, user_manifest
from fedac.data.manifest import Manifest
from fedac.errors import AudioError, DatasetError

log = logging.getLogger(__name__)

MISSING_PACKAGE = "--dataset hf needs the datasets package: pip install 'fedac[hf]'"
LAYOUT = (
    "expected a folder written by Dataset.save_to_disk / DatasetDict.save_to_disk, or parquet "
    "files (train*.parquet, validation*.parquet, test*.parquet) (see docs/datasets.md, 'Hugging "
    "Face datasets')"
)
FORMAT = 1
"""Version of the clip files written into the cache: bump it when the same rows would be written
otherwise."""
BATCH = 256
_SPLIT_TOKEN = re.compile(r"[A-Za-z]+")


@dataclass
class Part:
    """One table of the dataset: a split of a DatasetDict, a Dataset, or a parquet file."""

    where: str
    """Named in messages with a row index: 'DIR split train' or the parquet file."""
    split: str | None
    """train / val / test, None when the dataset says nothing."""
    columns: list[str]
    features: dict
    """datasets' feature description per column ({'_type': 'ClassLabel', 'names': [...]}, ...)."""
    rows: Callable[[list[str]], Iterator[dict]]
    """The named columns of every row, in order, undecoded."""


def _module(name: str):
    try:
        return __import__(name, fromlist=["_"])
    except ImportError:
        raise DatasetError(MISSING_PACKAGE) from None


def _split(name: str, where: str) -> str:
    if name.lower() not in SPLIT_NAMES:
        raise DatasetError(
            f"{where}: unknown split name {name!r}; name the splits train, validation and test"
        )
    return SPLIT_NAMES[name.lower()]


def _saved_parts(root: Path) -> list[Part]:
    """The splits of a save_to_disk folder (datasets' own reader: it knows every format version)."""
    datasets = _module("datasets")
    try:
        loaded = datasets.load_from_disk(str(root))
    except Exception as exc:  # datasets raises FileNotFoundError, ValueError, its own errors
        raise DatasetError(
            f"hf {root}: datasets cannot load this save_to_disk folder: {exc}"
        ) from None
    tables = loaded.items() if isinstance(loaded, datasets.DatasetDict) else [(None, loaded)]
    parts = []
    for name, table in tables:
        where = f"hf {root}" + ("" if name is None else f" split {name}")

        def rows(columns: list[str], table=table) -> Iterator[dict]:
            for batch in table.select_columns(columns).with_format("arrow").iter(batch_size=BATCH):
                # arrow format: Audio stays {bytes, path}, nothing is decoded
                yield from batch.to_pylist()

        parts.append(
            Part(
                where,
                None if name is None else _split(name, where),
                list(table.column_names),
                table.features.to_dict(),
                rows,
            )
        )
    return parts


def _parquet_split(path: Path, root: Path) -> str | None:
    """The split a parquet file's name (or else a parent folder's) gives, None if none starts with
    one."""
    for name in (path.stem, *reversed(path.relative_to(root).parent.parts)):
        token = _SPLIT_TOKEN.match(name)
        if token and token.group().lower() in SPLIT_NAMES:
            return SPLIT_NAMES[token.group().lower()]
    return None


def _parquet_parts(root: Path, files: list[Path]) -> list[Part]:
    parquet = _module("pyarrow.parquet")
    splits = [_parquet_split(path, root) for path in files]
    if any(splits) and not all(splits):
        odd = files[splits.index(None)]
        name = _SPLIT_TOKEN.match(odd.stem)
        raise DatasetError(
            f"{odd}: unknown split name {name.group() if name else odd.stem!r} while other files "
            "are split by name; name it train*.parquet, validation*.parquet or test*.parquet"
        )
    parts = []
    for path, split in zip(files, splits):
        try:
            schema = parquet.read_schema(path)
        except Exception as exc:  # pyarrow's ArrowInvalid, OSError
            raise DatasetError(f"{path} is not a readable parquet file: {exc}") from None
        meta = (schema.metadata or {}).get(b"huggingface")
        features = json.loads(meta).get("info", {}).get("features", {}) if meta else {}

        def rows(columns: list[str], path=path) -> Iterator[dict]:
            for batch in parquet.ParquetFile(path).iter_batches(batch_size=BATCH, columns=columns):
                yield from batch.to_pylist()

        parts.append(
            Part(
                str(path),
                split,
                list(schema.names),
                features if isinstance(features, dict) else {},
                rows,
            )
        )
    return parts


def _sources(root: Path) -> list[Path]:
    return sorted(
        p
        for p in root.rglob("*")
        if p.is_file()
        and p.suffix in (".arrow", ".parquet", ".json")
        and not any(part.startswith(".") for part in p.relative_to(root).parts)
    )


def read_parts(root: Path) -> list[Part]:
    """The dataset's tables, train first, then validation and test (in file order within a
    split)."""
    if (root / "dataset_dict.json").is_file() or (root / "state.json").is_file():
        parts = _saved_parts(root)
    else:
        files = [p for p in _sources(root) if p.suffix == ".parquet"]
        if not files:
            raise DatasetError(
                f"hf data.root {root} holds no dataset_dict.json, state.json or parquet file; "
                f"{LAYOUT}"
            )
        parts = _parquet_parts(root, files)
    return sorted(parts, key=lambda part: ("train", "val", "test", None).index(part.split))


def _require(part: Part, column: str, setting: str, what: str) -> None:
    if column not in part.columns:
        raise DatasetError(
            f"{part.where}: no {what} column {column!r} (data.{setting}); its columns are "
            f"{', '.join(part.columns)}. Name the right one with --set data.{setting}=COLUMN"
        )


def _label(value, names: list[str] | None, where: str, row: int, column: str) -> str:
    if value is None or value == "":
        raise DatasetError(
            f"{where} row {row}: the label column {column!r} is empty; label or drop the row"
        )
    if names is not None:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < len(names):
            raise DatasetError(
                f"{where} row {row}: label {value!r} is not a class of its ClassLabel "
                f"(0..{len(names) - 1}); -1 means unlabelled: drop such rows"
            )
        return names[value]
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return str(value)
    raise DatasetError(
        f"{where} row {row}: label {value!r} is neither a class name nor a class number"
    )


def _class_names(part: Part, column: str) -> list[str] | None:
    feature = part.features.get(column, {})
    return (
        list(feature["names"])
        if isinstance(feature, dict) and feature.get("_type") == "ClassLabel"
        else None
    )


def _write_clip(value, where: str, row: int, root: Path, dest: Path) -> Path:
    """The file holding one row's audio: dest (+ suffix) written from bytes or an array, or the
    local file a path names. Shape errors raise DatasetError; whether it decodes is checked by the
    caller."""
    if isinstance(value, str):
        value = {"path": value}
    if not isinstance(value, dict):
        raise DatasetError(
            f"{where} row {row}: audio {type(value).__name__} is not an Audio value "
            "({bytes, path} or {array, sampling_rate}) nor a path"
        )
    if value.get("bytes") is not None:
        suffix = Path(value.get("path") or "").suffix.lower()
        if not re.fullmatch(r"\.[a-z0-9]{1,5}", suffix):
            try:
                suffix = "." + sf.info(io.BytesIO(value["bytes"])).format.lower()
            except (sf.LibsndfileError, RuntimeError):
                suffix = ".wav"  # undecodable either way: the check names the row
        path = dest.with_suffix(suffix)
        path.write_bytes(value["bytes"])
        return path
    if value.get("array") is not None:
        rate = value.get("sampling_rate")
        if (
            isinstance(rate, bool)
            or not isinstance(rate, (int, float))
            or not rate > 0
            or rate != int(rate)
        ):
            raise DatasetError(
                f"{where} row {row}: audio array has sampling_rate {rate!r}, not a positive integer"
            )
        try:
            data = np.asarray(value["array"], dtype=np.float32)
        except (TypeError, ValueError):
            raise DatasetError(f"{where} row {row}: audio array is not numbers") from None
        if data.ndim == 2 and data.shape[0] < data.shape[1]:
            data = data.T  # datasets' (channels, samples) -> soundfile's (frames, channels)
        if data.ndim not in (1, 2):
            raise DatasetError(
                f"{where} row {row}: audio array has {data.ndim} dimensions; expected samples "
                "or channels x samples"
            )
        # float WAV: the array's values exactly; written here, not by soundfile (no fsync)
        buffer = io.BytesIO()
        sf.write(buffer, data, int(rate), format="WAV", subtype="FLOAT")
        path = dest.with_suffix(".wav")
        path.write_bytes(buffer.getvalue())
        return path
    if value.get("path"):
        text = str(value["path"])
        if "://" in text:
            raise DatasetError(
                f"{where} row {row}: audio path {text} is a URL; fedac reads local files only"
            )
        path = Path(text).expanduser()
        path = path if path.is_absolute() else root / path
        if not path.is_file():
            raise DatasetError(
                f"{where} row {row}: audio path {text} has no bytes and {path} does not exist"
            )
        return path.absolute()
    raise DatasetError(f"{where} row {row}: audio holds neither bytes, an array nor a path")


def _cache_key(root: Path, cfg: DataConfig) -> str:
    files = [
        [str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns] for p in _sources(root)
    ]
    head = {
        "v": FORMAT,
        "root": str(root.resolve()),
        "audio_column": cfg.audio_column,
        "files": files,
    }
    return hashlib.sha256(json.dumps(head, sort_keys=True).encode()).hexdigest()[:24]


def clip_files(
    parts: list[Part], root: Path, cfg: DataConfig
) -> tuple[list[list[str]], dict[str, str]]:
    """Per part, the file of each row's audio, written once into the cache; and file -> 'where row:
    why' for the rows whose audio cannot be decoded. data.on_bad_file=error stops at the first of
    them."""
    from fedac.data.features import cache_root  # lazy: start-up time (features imports torch)

    out = cache_root(cfg.cache_dir) / "hf" / _cache_key(root, cfg)
    params = {"format": FORMAT, "root": str(root.resolve()), "audio_column": cfg.audio_column}
    out.parent.mkdir(parents=True, exist_ok=True)
    # Runs (and Flower client processes) started together would write one folder at once: one waits.
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = cached_stats(out, params, ["clips"])
        if done is not None:
            files = [
                [p if Path(p).is_absolute() else str(out / p) for p in part]
                for part in done["files"]
            ]
            return files, done["bad"]
        log.info("hf %s: writing each clip once into %s", root, out)
        files, bad = [], {}
        for k, part in enumerate(parts):
            folder = out / "clips" / str(k)
            folder.mkdir(parents=True)
            paths = []
            for row, record in enumerate(part.rows([cfg.audio_column])):
                path = _write_clip(
                    record[cfg.audio_column], part.where, row, root, folder / f"{row:07d}"
                )
                try:
                    load_audio(path, sample_rate=None)
                except AudioError as exc:
                    reason = (
                        f"{part.where} row {row}: its audio cannot be decoded "
                        f"({str(exc).replace('; ' + REMEDY, '')})"
                    )
                    if cfg.on_bad_file == "error":
                        raise DatasetError(
                            f"{reason}; fix or drop the row, or set data.on_bad_file=skip"
                        ) from None
                    bad[str(path)] = reason
                paths.append(str(path))
            files.append(paths)
        stored = [
            [str(Path(p).relative_to(out)) if Path(p).is_relative_to(out) else p for p in part]
            for part in files
        ]
        finish(out, params, {"files": stored, "bad": bad})
    return files, bad


def _check_columns(parts: list[Part], cfg: DataConfig) -> bool:
    """Every part has the audio and label columns, and the speaker column when the user named one
    (the default is optional); returns whether every part has speakers."""
    default_speaker = next(f.default for f in fields(DataConfig) if f.name == "speaker_column")
    for part in parts:
        _require(part, cfg.audio_column, "audio_column", "audio")
        _require(part, cfg.label_column, "label_column", "label")
        # a column the user named must exist; the default is optional
        if cfg.speaker_column != default_speaker:
            _require(part, cfg.speaker_column, "speaker_column", "speaker")
    return all(cfg.speaker_column in part.columns for part in parts)


def _screened_files(parts: list[Part], root: Path, cfg: DataConfig) -> tuple[list[list[str]], dict]:
    """`clip_files`, refusing clips that cannot be decoded under data.on_bad_file=error and saying
    which are left out under skip."""
    files, bad = clip_files(parts, root, cfg)
    if bad and cfg.on_bad_file == "error":  # clips written by an earlier data.on_bad_file=skip run
        raise DatasetError(
            f"{next(iter(bad.values()))}; fix or drop the row, or set data.on_bad_file=skip"
        )
    # left out by features.screen_manifest, which lists the files in the run's bad_files.txt
    if bad:
        log.warning(
            "hf %s: %d row(s) whose audio cannot be decoded are left out (data.on_bad_file=skip): "
            "%s",
            root,
            len(bad),
            shorten([why.split(": its audio")[0] for why in bad.values()], 3),
        )
    return files, bad


def _shared_class_names(parts: list[Part], root: Path, cfg: DataConfig) -> list[str] | None:
    """The label column's ClassLabel names, which every part must share (None without them)."""
    names = [_class_names(part, cfg.label_column) for part in parts]
    for part, other in zip(parts, names):
        if other != names[0]:
            raise DatasetError(
                f"hf {root}: the ClassLabel names of {cfg.label_column!r} differ between "
                f"{parts[0].where} and {part.where}"
            )
    return names[0]


def _manifest_rows(
    parts: list[Part],
    files: list[list[str]],
    names: list[str] | None,
    cfg: DataConfig,
    has_speakers: bool,
) -> list[tuple[str, str, str | None, str | None]]:
    """One (file, label, speaker, split) row per clip, refusing a part that changed since its
    clips were written."""
    rows = []
    columns = [cfg.label_column] + ([cfg.speaker_column] if has_speakers else [])
    for part, part_files in zip(parts, files):
        count = 0
        for row, record in enumerate(part.rows(columns)):
            label = _label(record[cfg.label_column], names, part.where, row, cfg.label_column)
            speaker = record.get(cfg.speaker_column)
            rows.append(
                (
                    part_files[row],
                    label,
                    None if speaker in (None, "") else str(speaker),
                    part.split,
                )
            )
            count += 1
        if count != len(part_files):
            raise DatasetError(
                f"{part.where} changed while it was read ({count} rows, {len(part_files)} clips); "
                "run again"
            )
    return rows


def _ordered_classes(rows: list, names: list[str] | None, root: Path, cfg: DataConfig) -> list[str]:
    """The labels present, in ClassLabel order, else numbers first in numeric order; at least two,
    with a warning for labels that differ only in case."""
    present = {label for _, label, _, _ in rows}
    if names is not None:
        classes = [n for n in names if n in present]
    else:
        classes = sorted(
            present, key=lambda x: (int(x), x) if re.fullmatch(r"-?\d+", x) else (float("inf"), x)
        )
    if len(classes) < 2:
        raise DatasetError(
            f"hf {root} has one label ({', '.join(classes)}); classification needs at least two"
        )
    twins = case_twins(classes)
    if twins:
        log.warning(
            "hf %s: labels %s differ only in case and are separate classes; if they are one word, "
            "give them one spelling in column %r",
            root,
            "; ".join(" / ".join(g) for g in twins),
            cfg.label_column,
        )
    return classes


def load_manifest(root: str | Path, cfg: DataConfig) -> Manifest:
    """The manifest of a Hugging Face datasets folder at `root` (save_to_disk or parquet): one row
    per clip whose audio decodes, the classes, speakers and splits as `cfg` names their columns."""
    root = Path(root).expanduser().absolute()
    if not root.is_dir():
        raise DatasetError(f"hf data.root {root} is not a folder; {LAYOUT}")
    parts = read_parts(root)
    has_speakers = _check_columns(parts, cfg)
    files, _ = _screened_files(parts, root, cfg)
    names = _shared_class_names(parts, root, cfg)
    rows = _manifest_rows(parts, files, names, cfg, has_speakers)
    classes = _ordered_classes(rows, names, root, cfg)
    has_splits = any(part.split for part in parts)
    manifest, notes = user_manifest(
        "hf",
        f"hf {root}",
        str(root),
        classes,
        rows,
        has_speakers,
        cfg,
        "the dataset has no such split" if has_splits else "the dataset has no splits",
        "add clips, or give the dataset train, validation and test splits",
    )
    if notes:
        log.warning(
            "hf %s: %s (see docs/datasets.md, 'Hugging Face datasets')", root, "; ".join(notes)
        )
    return manifest
