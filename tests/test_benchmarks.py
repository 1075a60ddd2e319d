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
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))  # (the scripts import their siblings by name)
    spec = importlib.util.spec_from_file_location(f"bench_script_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.usefixtures("own_modules")
@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.stem)
def test_every_benchmark_script_imports(path):
    if path.stem == "flower_apps":
        pytest.importorskip("flwr")
    load(path)


@pytest.fixture
def own_modules():
    """The modules a test loads (and the aliases the baseline adds) leave with it."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]


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
