"""Helpers shared by the official-layout loaders and the stand-in generators that write those
layouts.

Loaders: root / file checks whose DatasetError says what is missing, where it was looked for and
where the dataset comes from, and the `data.test_fold` choice.

Generators (`synth.speech_commands`, `synth.emotions`, `synth.urban`): the `.fedac_complete` marker
protocol: a complete generation with the same parameters is reused as is, an interrupted one is
removed and redone, and a folder the generator did not write is never deleted. Plus 16 kHz int16 WAV
writing and a worker pool whose results do not depend on scheduling.
"""

from __future__ import annotations

import csv
import io
import json
import multiprocessing
import shutil
import sys
import wave
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from fedac.data.manifest import Clip, Manifest
from fedac.errors import ConfigError, DatasetError
from fedac.seeding import numpy_rng

MARKER = ".fedac_complete"
IN_PROGRESS = ".fedac_incomplete"
SAMPLE_RATE = 16000


# --------------------------------------------------------------------------- loaders


def require_dir(path: Path, what: str, source: str) -> Path:
    if not path.is_dir():
        raise DatasetError(f"{what}: folder {path} does not exist. {source}")
    return path


def require_file(path: Path, what: str, source: str) -> Path:
    if not path.is_file():
        raise DatasetError(f"{what}: file {path} does not exist. {source}")
    return path


def read_text(path: Path) -> str:
    """A metadata file's text; bytes that are not UTF-8 raise DatasetError naming the file and
    line."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DatasetError(
            f"{path} line {line} is not UTF-8 text (byte {data[exc.start : exc.start + 1]!r}); "
            "fix or remove that line, or restore the file from the official archive"
        ) from None


def csv_rows(
    path: Path, required: Sequence[str], hint: str
) -> tuple[list[str], Iterator[tuple[str, int, dict]]]:
    """A metadata CSV's header and its rows as (where, line number, {column: stripped field}): the
    header must name every `required` column (`hint` says what it should hold), blank lines are
    skipped and a line with another number of fields is an error naming its file and line. A
    spreadsheet's BOM is dropped."""
    handle = io.StringIO(read_text(path), newline="")
    reader = csv.reader(handle)
    header = [h.strip().lstrip("\ufeff") for h in next(reader, [])]
    missing = [c for c in required if c not in header]
    if missing:
        raise DatasetError(
            f"{path} line 1: header lacks column(s) {', '.join(missing)} (found "
            f"{','.join(header) or 'nothing'}); {hint}"
        )

    def rows() -> Iterator[tuple[str, int, dict]]:
        for fields in reader:
            where = f"{path} line {reader.line_num}"
            if not any(f.strip() for f in fields):
                continue
            if len(fields) != len(header):
                raise DatasetError(
                    f"{where}: {len(fields)} fields, expected {len(header)} ({','.join(header)})"
                )
            yield where, reader.line_num, dict(zip(header, (f.strip() for f in fields)))

    return header, rows()


def reject_broken_link(path: Path) -> Path:
    """A listed file that is a broken or looping symbolic link raises DatasetError naming it."""
    if path.is_symlink() and not path.exists():
        raise DatasetError(
            f"{path} is a broken link or a symlink loop; remove it or point it at the audio file"
        )
    return path


def choose_fold(value: str | None, default: str, choices: Sequence[str], dataset: str) -> str:
    """`data.test_fold` (or the dataset default) checked against the dataset's folds."""
    fold = default if value is None else str(value).strip()
    if fold not in choices:
        raise ConfigError(
            f"data.test_fold={value!r} is not a {dataset} fold; choose one of {', '.join(choices)}"
        )
    return fold


def shorten(names: Sequence[str], limit: int = 5) -> str:
    """'a, b, c ... (12 in all)' for error messages that would otherwise list thousands of files."""
    head = ", ".join(names[:limit])
    return head if len(names) <= limit else f"{head} ... ({len(names)} in all)"


# --------------------------------------------------------------------------- user datasets
# (audiofolder, hf)

HELD_OUT = 0.1
"""Share of clients (or clips) drawn for validation, and again for test, when a user dataset has no
such split."""
SPLIT_NAMES = {"train": "train", "validation": "val", "val": "val", "test": "test"}
"""A user's split names -> manifest splits."""


def held_out_splits(keys: list[str], what: str, where: str, remedy: str) -> dict[str, str]:
    """key (client id or clip path) -> split: a seeded HELD_OUT share each for test and validation
    (at least one key each, and one left to train). The corpus's seed is fixed (0): run seeds vary
    training, never which clips are tested."""
    keys = sorted(keys)
    if len(keys) < 3:
        raise DatasetError(
            f"{where}: {len(keys)} {what} cannot be split into train, validation and test; {remedy}"
        )
    order = numpy_rng(0, "audiofolder-split").permutation(len(keys))
    n = max(1, round(HELD_OUT * len(keys)))
    n = min(n, (len(keys) - 1) // 2)
    splits = {keys[k]: "train" for k in order[2 * n :]}
    splits.update({keys[k]: "test" for k in order[:n]})
    splits.update({keys[k]: "val" for k in order[n : 2 * n]})
    return splits


def dealt_clients(splits: list[str], num_clients: int) -> list[str]:
    """Client ids for clips that have none: training clips dealt round-robin in a seeded order over
    num_clients (an IID partition under the natural scheme); held-out clips belong to no client."""
    train = [i for i, split in enumerate(splits) if split == "train"]
    clients = [""] * len(splits)
    for k, index in enumerate(numpy_rng(0, "audiofolder-clients").permutation(train)):
        clients[index] = f"client{k % num_clients:03d}"
    return clients


MIN_DEALT_CLIPS = 40
"""Training clips per dealt client at the least when data.num_clients is left at its default: after
data.local_holdout=0.2, two batches of train.batch_size=16 per local epoch and 8 held-out clips."""


def dealt_client_count(train_clips: int, num_clients: int) -> int:
    """Clients to deal `train_clips` over when data.num_clients was not set: one per MIN_DEALT_CLIPS
    clips, at least 2 and at most `num_clients` (the default 50 from 2000 training clips on)."""
    return max(2, min(num_clients, train_clips // MIN_DEALT_CLIPS))


def redeal(manifest: Manifest, num_clients: int) -> Manifest:
    """A dealt manifest (`Manifest.dealt`) dealt again over `num_clients`: the clients
    `user_manifest` would have dealt with that count."""
    clients = dealt_clients([clip.split for clip in manifest.clips], num_clients)
    return replace(
        manifest,
        clips=[replace(clip, client=client) for clip, client in zip(manifest.clips, clients)],
    )


def case_twins(labels: Iterable[str]) -> list[list[str]]:
    """Groups of labels that differ only in case (Yes, yes): each group is as many classes."""
    groups: dict[str, list[str]] = {}
    for label in sorted(set(labels)):
        groups.setdefault(label.casefold(), []).append(label)
    return [group for group in groups.values() if len(group) > 1]


def user_manifest(
    name: str,
    where: str,
    root: str,
    classes: list[str],
    rows: list[tuple[str, str, str | None, str | None]],
    has_clients: bool,
    cfg,
    why_no_split: str,
    remedy: str,
) -> tuple[Manifest, list[str]]:
    """A user dataset's (path, label, client, split) rows -> Manifest, and notes on what was chosen
    for the user (the caller warns with them). A split of None is train; validation and test, when
    no row has them, are drawn from the training keys (clients when `has_clients`, else clips) by
    `held_out_splits`. Without clients, training clips are dealt over `cfg.num_clients`
    (`dealt_clients`) and the manifest is marked `dealt` (registry.load_manifest may deal them again
    over fewer clients, and says how many); a training row with an empty client among clients is
    given a seeded training client."""
    paths = [path for path, _, _, _ in rows]
    splits = [split or "train" for _, _, _, split in rows]
    clients = [client or "" for _, _, client, _ in rows]
    has_clients = has_clients and any(clients)
    notes = []
    missing = [s for s in ("val", "test") if s not in splits]
    if "train" not in splits:
        raise DatasetError(f"{where}: no clip is in the train split; {remedy}")
    if missing:
        keys = {
            i: (clients[i] or paths[i]) if has_clients else paths[i]
            for i, s in enumerate(splits)
            if s == "train"
        }
        of_key = held_out_splits(
            list(set(keys.values())), "clients" if has_clients else "clips", where, remedy
        )
        for i, key in keys.items():
            # a split the data has keeps its clips; only the missing ones are drawn
            if of_key[key] in missing:
                splits[i] = of_key[key]
        drawn = " / ".join(f"{HELD_OUT:.0%} {'validation' if m == 'val' else m}" for m in missing)
        notes.append(
            f"seeded {drawn} split drawn {'client-disjoint' if has_clients else 'over clips'} "
            f"({why_no_split})"
        )
    if not has_clients:
        clients = dealt_clients(splits, cfg.num_clients)
    else:
        orphans = [i for i, (c, s) in enumerate(zip(clients, splits)) if not c and s == "train"]
        if orphans:
            owners = sorted({c for c, s in zip(clients, splits) if c and s == "train"})
            for i, k in zip(
                orphans, numpy_rng(0, "orphan-clients").integers(len(owners), size=len(orphans))
            ):
                clients[i] = owners[k]
            notes.append(
                f"{len(orphans)} training clip(s) without a client given to seeded training clients"
            )
    index = {label: k for k, label in enumerate(classes)}
    clips = [
        Clip(path, index[label], client, split)
        for path, (_, label, _, _), client, split in zip(paths, rows, clients, splits)
    ]
    return Manifest(name, root, list(classes), clips, dealt=not has_clients), notes


# --------------------------------------------------------------------------- generators


def cached_stats(out: Path, params: dict, owned: Iterable[str]) -> dict | None:
    """Stats of a finished generation in `out` with exactly `params`, else None after clearing
    `owned`.

    `owned` names the top-level entries the generator writes. If some exist without a marker (and
    without an in-progress note from an interrupted run), they are someone else's data: refuse.
    """
    owned = list(owned)
    stats = finished_stats(out, params, owned)
    if stats is None:
        start(out, params, owned)
    return stats


def finished_stats(
    out: Path, params: dict, guard: Iterable[str], what: str | None = None
) -> dict | None:
    """Stats of a finished generation in `out` with exactly `params`, else None; touches nothing.

    Raises FileExistsError when an entry named in `guard` exists with neither a marker nor an
    in-progress note: someone else's data. `what` describes those entries in the message (default:
    "holds <their names> that fedac did not generate"). A generator that must check its arguments
    between this test and clearing the folder calls this and then `start`, else `cached_stats`.
    """
    guard = list(guard)
    marker = out / MARKER
    if marker.is_file():
        try:
            done = json.loads(marker.read_text())
        except ValueError:
            done = {}
        if all(done.get(k) == v for k, v in params.items()) and "stats" in done:
            return dict(done["stats"], cached=True)
    elif not (out / IN_PROGRESS).exists() and any((out / name).exists() for name in guard):
        if what is None:
            what = (
                f"holds {', '.join(n for n in guard if (out / n).exists())} that fedac did not "
                "generate"
            )
        raise FileExistsError(
            f"{out} {what}; refusing to delete them (pick an empty or new directory)"
        )
    return None


def start(out: Path, params: dict, owned: Iterable[str]) -> None:
    """Note that a generation is in progress, then remove `owned` and the marker of an earlier
    one."""
    out.mkdir(parents=True, exist_ok=True)
    (out / IN_PROGRESS).write_text(json.dumps(params))
    for name in [*owned, MARKER]:
        path = out / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def finish(out: Path, params: dict, stats: dict) -> None:
    """Write the marker last: its presence means every file of the generation is complete."""
    (out / MARKER).write_text(
        json.dumps({**params, "stats": stats}, indent=2, sort_keys=True) + "\n"
    )
    (out / IN_PROGRESS).unlink()


def write_wav(path: Path, x: np.ndarray, sample_rate: int = SAMPLE_RATE) -> None:
    """float audio in [-1, 1] (frames or frames x channels) -> 16-bit PCM WAV (clipped, rounded).

    The stdlib writer: the same bytes as soundfile's, but soundfile fsyncs every file, which makes
    writing thousands of short clips up to 10x slower.
    """
    pcm = np.round(np.clip(x, -1.0, 32767 / 32768) * 32768).astype("<i2")
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1 if pcm.ndim == 1 else pcm.shape[1])
        f.setsampwidth(2)
        f.setframerate(sample_rate)
        f.writeframes(np.ascontiguousarray(pcm).tobytes())


def run_tasks(fn: Callable, tasks: list, workers: int, desc: str, progress: bool) -> list:
    """[fn(t) for t in tasks] on `workers` processes, results in task order, with a progress bar.

    `fn` must be a module-level function and every result must depend only on its task (not on the
    worker or what it ran before).

    Fork on Linux, spawn elsewhere. Spawned workers re-import the caller's __main__: called from a
    piped script (`<stdin>` cannot be re-read) or one without an `if __name__ == "__main__"` guard
    they crash, and the pool replaces them forever (a hang). Forked workers start at once and
    re-import nothing; forking after torch started its threads is safe here because the workers
    run only numpy / scipy and their own espeak-ng copy, never torch or another parent thread. The
    pool is created before the progress bar so no monitor thread of a bar exists at fork time.
    """
    from fedac.progress import bar as progress_bar

    results: list = [None] * len(tasks)
    pool = None
    if workers > 1 and len(tasks) > 1:
        method = "fork" if sys.platform.startswith("linux") else "spawn"
        pool = multiprocessing.get_context(method).Pool(processes=min(int(workers), len(tasks)))
    try:
        with progress_bar(total=len(tasks), desc=desc, unit="task", disable=not progress) as bar:
            if pool:
                for index, result in pool.imap_unordered(
                    _indexed, [(fn, i, t) for i, t in enumerate(tasks)]
                ):
                    results[index] = result
                    bar.update()
                pool.close()  # let the workers exit normally (their cleanup runs)
                pool.join()
            else:
                for index, task in enumerate(tasks):
                    results[index] = fn(task)
                    bar.update()
    finally:
        if pool:
            pool.terminate()
    return results


def _indexed(job: tuple) -> tuple:
    fn, index, task = job
    return index, fn(task)
