"""Which code produced a result: `code_version()`, recorded in every results.json
(report.write_results).

- `fedac`: the package version.
- `source_sha256`: a SHA-256 of the training code, the package files that can change a run's
  numbers: every module, the GRU kernel's C++ and the shipped encoder's config.json / pretrain.json
  (the latter records its weights' sha256, so the 11 MB weights themselves need not be read).
  `NOT_TRAINING` lists the modules left out. Two results with the same hash were made by the same
  training code, whatever the commit; `fedac report` compares a quoted result's hash with the
  current one (experiments/figures.py).
- `git_commit`: HEAD when the package is a tracked folder of a git checkout, else null (an installed
  wheel, no git); `git_dirty`: whether the training code then differed from that commit.

Computing the hash reads ~1 MB and imports nothing heavy (no torch): a few milliseconds.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from fnmatch import fnmatchcase
from pathlib import Path

from fedac import __version__

PACKAGE = Path(__file__).resolve().parent

#: Package modules that cannot change a trained number, so editing them leaves every result current.
#: Everything else counts, including the paper tables' specs and commands (experiments/): their
#: presets and protocols choose the settings that they train.
NOT_TRAINING = {
    "cli.py": (
        "parses the command line into load_config (config.py holds every default) and prints tables"
    ),
    "engine/report.py": (
        "writes what a run computed (metrics.csv, results.json, lpa.jsonl, curves.png) and formats "
        "it"
    ),
    "experiments/figures.py": (
        "reads committed results back and checks the documents that quote them"
    ),
    "version.py": "this record of the code itself",
}

#: The training code (fnmatch patterns of paths relative to the package; `*` spans folders): every
#: module, the kernel's source and the shipped encoder's records.
TRAINING_PATTERNS = ("*.py", "kernels/*.cpp", "models/pretrained/*/*.json")

#: Build outputs and caches inside the package, never sources.
SKIPPED_FOLDERS = {"__pycache__", "_build"}


def is_training(rel: str) -> bool:
    """Whether a path relative to the package is training code."""
    return (
        rel not in NOT_TRAINING
        and not SKIPPED_FOLDERS & set(rel.split("/")[:-1])
        and any(fnmatchcase(rel, pattern) for pattern in TRAINING_PATTERNS)
    )


def training_files(root: Path = PACKAGE) -> list[str]:
    """The training code's paths relative to `root`, sorted (POSIX separators on every system)."""
    found = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [name for name in subfolders if name not in SKIPPED_FOLDERS]
        rel_folder = Path(folder).relative_to(root).as_posix()
        found += [name if rel_folder == "." else f"{rel_folder}/{name}" for name in files]
    return sorted(rel for rel in found if is_training(rel))


def source_sha256(root: Path = PACKAGE) -> str:
    """SHA-256 over each training file's relative path, length and bytes, in sorted order."""
    digest = hashlib.sha256()
    for rel in training_files(root):
        # a Windows checkout hashes the same
        data = (root / rel).read_bytes().replace(b"\r\n", b"\n")
        digest.update(f"{rel}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def git_state(root: Path = PACKAGE) -> tuple[str | None, bool | None]:
    """(HEAD, whether the training code has uncommitted changes) of the checkout holding `root`, or
    (None, None) when there is none: no git, not a repository, or a package folder git does not
    track (an install inside some repository's ignored virtualenv would otherwise report that
    repository)."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=True
        ).stdout

    try:
        git("ls-files", "--error-unmatch", "__init__.py")
        commit, prefix = (git("rev-parse", "HEAD", "--show-prefix").splitlines() + [""])[:2]
        status = git("status", "--porcelain", "-z", "--untracked-files=all", "--", ".")
    except (OSError, subprocess.SubprocessError):
        return None, None
    # Porcelain paths are relative to the repository's top; `prefix` is the package's folder there.
    fields, changed = iter(status.split("\0")), []
    for field in fields:
        if field:
            changed.append(field[3:])
            if "R" in field[:2] or "C" in field[:2]:
                changed.append(next(fields, ""))  # a rename's or copy's source path follows
    dirty = any(path.startswith(prefix) and is_training(path[len(prefix) :]) for path in changed)
    return commit.strip(), dirty


def code_version(root: Path = PACKAGE) -> dict:
    """What results.json records as `code_version`."""
    commit, dirty = git_state(root)
    return {
        "fedac": __version__,
        "source_sha256": source_sha256(root),
        "git_commit": commit,
        "git_dirty": dirty,
    }
