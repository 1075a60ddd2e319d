"""Every benchmark script still imports after the package's modules move (a moved module otherwise
breaks a benchmark only when someone next runs it), and bench_impressions' baseline, the code of an
old commit read from git, still loads against today's package."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py"))


def load(path: Path):
    """The script as a module (its `if __name__ == "__main__"` block does not run)."""
    spec = importlib.util.spec_from_file_location(f"bench_script_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: What loading a script adds to sys.modules under names that could shadow another test's: the
#: scripts themselves, the baseline, and the aliases it sets for moved fedac modules.
OWN = ("bench_script_", "zeroshot_before", "fedac.algorithms.local", "fedac.kmedoids")


@pytest.fixture
def own_modules(monkeypatch):
    """The scripts import their siblings by name (benchmarks/ on the path for the test); what the
    test loads under its own names leaves with it (C extensions it imported stay: they cannot be
    imported twice)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    yield
    for name in [n for n in sys.modules if n.startswith(OWN)]:
        del sys.modules[name]


@pytest.mark.usefixtures("own_modules")
@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.stem)
def test_every_benchmark_script_imports(path):
    if path.stem == "flower_apps":
        pytest.importorskip("flwr")
    load(path)


@pytest.mark.usefixtures("own_modules")
def test_the_impressions_baseline_loads_from_git():
    bench = load(BENCHMARKS / "bench_impressions.py")
    known = subprocess.run(
        ["git", "cat-file", "-e", f"{bench.BASELINE}^{{commit}}"],
        cwd=BENCHMARKS.parent,
        capture_output=True,
    )
    if known.returncode:
        pytest.skip(f"commit {bench.BASELINE} is not in this clone's history (a shallow clone)")
    module = bench.baseline_module()
    assert callable(module.synthesize_impressions) and callable(module.dirichlet_targets)
