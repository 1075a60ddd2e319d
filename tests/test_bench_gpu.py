"""benchmarks/bench_gpu.py end to end on the CPU (its cheapest workload, quick) and its argument checks."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_gpu.py"


def run(*args, env=None):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})}, timeout=600)


@pytest.mark.slow
def test_quick_cpu_run_writes_the_report_to_out(tmp_path):
    done = run("--device", "cpu", "--quick", "--only", "gsc,gru", env={"OUT": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "bench_gpu.json").read_text())
    assert {"card", "torch", "cuda", "matmul_peak_tflops", "workloads", "targets", "quick"} <= set(report)
    assert report["device"] == "cpu" and report["card"].startswith("CPU") and report["errors"] == [] and report["finished"]
    assert report["matmul_peak_tflops"]["fp32"] > 0 and "tf32" not in report["matmul_peak_tflops"]  # CUDA only
    assert list(report["workloads"]) == ["gsc", "gru"]
    gru = report["workloads"]["gru"]  # the recurrence each way the device runs it: torch's, and the plain per-client GRU
    assert set(gru["paths"]) == {"torch", "plain"} and gru["fastest"] in gru["s_per_layer"]
    assert gru["s_per_layer"]["plain"] == pytest.approx(gru["paths"]["plain"]["s_per_round"] / 5)
    paths = report["workloads"]["gsc"]["paths"]
    assert set(paths) == {"fedac", "plain"}  # on the CPU, fedac is fedac's CPU default: no fedac_cpu path
    for name, result in paths.items():
        assert result["s_per_round"] > 0 and result["samples_per_s"] > 0 and result["tflop_per_s"] > 0
        assert result["peak_gpu_mb"] is None  # CUDA only
    # the same clients each round on both paths, so the same samples
    assert paths["fedac"]["samples_per_round"] == paths["plain"]["samples_per_round"]
    assert paths["fedac"]["speedup_vs_plain"] == pytest.approx(paths["plain"]["s_per_round"] / paths["fedac"]["s_per_round"])
    targets = {t["target"]: t for t in report["targets"]}
    assert set(targets) == {"gsc round", "gsc vs plain"}
    assert all(not t["decides"] and not t["on_gpu"] and not t["at_target_scale"] for t in targets.values())
    assert targets["gsc round"]["pass"] == (paths["fedac"]["s_per_round"] <= 0.3)
    assert done.stdout.rstrip().splitlines()[-1].startswith("wall ")  # the table comes last
    assert "gsc | fedac |" in done.stdout


def test_bad_arguments_are_refused_with_exit_2():
    done = run("--only", "gsc,nope", "--device", "cpu")
    assert done.returncode == 2 and "unknown workload(s) nope" in done.stderr
    done = run("--device", "tpu")
    assert done.returncode == 2 and "--device tpu" in done.stderr
