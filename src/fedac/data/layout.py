"""Helpers shared by the official-layout loaders and the stand-in generators that write those layouts.

Loaders: root / file checks whose DatasetError says what is missing, where it was looked for and
where the dataset comes from, and the `data.test_fold` choice.

Generators: the `.fedac_complete` marker protocol (the same one `synth.speech_commands` follows): a
complete generation with the same parameters is reused as is, an interrupted one is removed and
redone, and a folder the generator did not write is never deleted. Plus 16 kHz int16 WAV writing and
a spawn-based worker pool whose results do not depend on scheduling.
"""

from __future__ import annotations

import json
import multiprocessing
import shutil
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import soundfile as sf

from fedac.errors import ConfigError, DatasetError

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


# --------------------------------------------------------------------------- generators


def cached_stats(out: Path, params: dict, owned: Iterable[str]) -> dict | None:
    """Stats of a finished generation in `out` with exactly `params`, else None after clearing `owned`.

    `owned` names the top-level entries the generator writes. If some exist without a marker (and
    without an in-progress note from an interrupted run), they are someone else's data: refuse.
    """
    owned = list(owned)
    marker = out / MARKER
    if marker.is_file():
        try:
            done = json.loads(marker.read_text())
        except ValueError:
            done = {}
        if all(done.get(k) == v for k, v in params.items()) and "stats" in done:
            return dict(done["stats"], cached=True)
    elif not (out / IN_PROGRESS).exists() and any((out / name).exists() for name in owned):
        raise FileExistsError(
            f"{out} holds {', '.join(n for n in owned if (out / n).exists())} that fedac did not "
            "generate; refusing to delete them (pick an empty or new directory)"
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / IN_PROGRESS).write_text(json.dumps(params))
    for name in [*owned, MARKER]:
        path = out / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    return None


def finish(out: Path, params: dict, stats: dict) -> None:
    """Write the marker last: its presence means every file of the generation is complete."""
    (out / MARKER).write_text(json.dumps({**params, "stats": stats}, indent=2, sort_keys=True) + "\n")
    (out / IN_PROGRESS).unlink()


def write_wav(path: Path, x: np.ndarray, sample_rate: int = SAMPLE_RATE) -> None:
    """float audio in [-1, 1] -> 16-bit PCM WAV (clipped, rounded)."""
    pcm = np.round(np.clip(x, -1.0, 32767 / 32768) * 32768).astype(np.int16)
    sf.write(path, pcm, sample_rate, subtype="PCM_16", format="WAV")


def run_tasks(fn: Callable, tasks: list, workers: int, desc: str, progress: bool) -> list:
    """[fn(t) for t in tasks] on `workers` spawn processes, results in task order, with a progress bar.

    Spawn, not fork: forking after torch started its thread pool can deadlock. `fn` must be a
    module-level function and every result must depend only on its task (not on the worker).
    """
    from tqdm import tqdm

    results: list = [None] * len(tasks)
    with tqdm(total=len(tasks), desc=desc, unit="task", disable=not progress) as bar:
        if workers > 1 and len(tasks) > 1:
            ctx = multiprocessing.get_context("spawn")
            with ctx.Pool(processes=min(int(workers), len(tasks))) as pool:
                for index, result in pool.imap_unordered(_indexed, [(fn, i, t) for i, t in enumerate(tasks)]):
                    results[index] = result
                    bar.update()
        else:
            for index, task in enumerate(tasks):
                results[index] = fn(task)
                bar.update()
    return results


def _indexed(job: tuple) -> tuple:
    fn, index, task = job
    return index, fn(task)
