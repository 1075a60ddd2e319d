"""How far the default run's figures move with the CPU's kernel choices:
docs/results/default-run/spread.json.

The default `fedac run` is exact per machine (same CPU, same thread count, same kernels: rerunning
repeats every number), not across machines: MKL, oneDNN and ATen pick other kernels on other CPUs,
each rounds differently, and 50 rounds of SGD carry a difference in the last bit of one step into a
different final model. This script measures that spread here, the way another machine would see it:
it reruns the default run from an empty cache under each kernel choice one process can be given, and
records each final figure.

    .venv/bin/python scripts/default_run_spread.py  # every variant: ~6 runs of the default run
    .venv/bin/python scripts/default_run_spread.py --only base,gru_torch --rounds 2 --dest
    /tmp/spread

Variants (each a fresh FEDAC_HOME sharing one copy of the synthetic audio, which no torch kernel
writes, so the features are recomputed under the variant's kernels too):
- base: as shipped (`fedac run`, no settings);
- aten_avx2 / aten_default: ATEN_CPU_CAPABILITY=avx2 / default (torch's vector kernels of another
  CPU generation; the fused GRU follows the capability);
- threads2: `runtime.threads=2 runtime.cohort_workers=1` (torch's intra-op threads split reductions
  otherwise);
- gru_torch: `runtime.gru_kernel=torch` (the pure-torch GRU recurrence instead of the fused C++
  kernel).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VARIANTS: dict[str, tuple[dict[str, str], list[str]]] = {
    "base": ({}, []),
    "aten_avx2": ({"ATEN_CPU_CAPABILITY": "avx2"}, []),
    "aten_default": ({"ATEN_CPU_CAPABILITY": "default"}, []),
    "threads2": ({}, ["--set", "runtime.threads=2", "--set", "runtime.cohort_workers=1"]),
    "gru_torch": ({}, ["--set", "runtime.gru_kernel=torch"]),
}
FIGURES = ("accuracy", "macro_f1")


def cpu_model() -> str:
    """The CPU's model name as lscpu / /proc/cpuinfo give it (else the platform's processor
    string)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run_variant(name: str, fedac: str, extra: list[str], audio: Path) -> dict:
    env_extra, settings = VARIANTS[name]
    with tempfile.TemporaryDirectory() as work:
        home = Path(work) / "home"
        home.mkdir()
        (home / "synthetic").symlink_to(audio, target_is_directory=True)
        env = {**os.environ, **env_extra, "FEDAC_HOME": str(home)}
        command = [fedac, "run", "--quiet", "--out", str(Path(work) / "run"), *settings, *extra]
        print(
            f"== {name}: {' '.join(f'{k}={v}' for k, v in env_extra.items())} "
            f"{' '.join(command[1:])}",
            flush=True,
        )
        subprocess.run(command, env=env, check=True, cwd=ROOT)
        results = json.loads((Path(work) / "run" / "results.json").read_text())
    shown = (
        " ".join(f"{key}={value}" for key, value in env_extra.items()) + " " if env_extra else ""
    )
    row = {
        "command": f"{shown}fedac run {' '.join(settings + extra)}".strip(),
        "env": env_extra,
        "settings": settings,
        "wall_seconds": results["wall_seconds"],
        "code_version": results.get("code_version"),
    }
    row.update({key: results["final"][key] for key in FIGURES})
    print(f"   {name}: " + ", ".join(f"{key} {row[key]:.2%}" for key in FIGURES), flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(VARIANTS), help="comma-separated variants")
    parser.add_argument("--dest", default=str(ROOT / "docs/results/default-run/spread.json"))
    parser.add_argument("--fedac", default=str(ROOT / ".venv/bin/fedac"))
    args, extra = parser.parse_known_args(argv)
    names = args.only.split(",")
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    with tempfile.TemporaryDirectory() as shared:
        audio = Path(shared) / "synthetic"
        audio.mkdir()  # filled by the first variant's run, read by the others
        rows = {name: run_variant(name, args.fedac, extra, audio) for name in names}
    summary = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "extra_arguments": extra,
        "variants": rows,
    }
    for key in FIGURES:
        values = [row[key] for row in rows.values()]
        summary[f"{key}_min"], summary[f"{key}_max"] = min(values), max(values)
        summary[f"{key}_range"] = max(values) - min(values)
        summary[f"{key}_std"] = statistics.pstdev(values)
    Path(args.dest).parent.mkdir(parents=True, exist_ok=True)
    Path(args.dest).write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"wrote {args.dest}: accuracy {summary['accuracy_min']:.2%} to "
        f"{summary['accuracy_max']:.2%} over {len(rows)} variants"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
