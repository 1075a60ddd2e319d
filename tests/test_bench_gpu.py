"""benchmarks/bench_gpu.py end to end on the CPU (its cheapest workload, quick) and its argument
checks."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_gpu.py"


def run(*args, env=None):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        timeout=600,
    )


@pytest.mark.slow
def test_quick_cpu_run_writes_the_report_to_out(tmp_path):
    done = run("--device", "cpu", "--quick", "--only", "gsc,gru", env={"OUT": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "bench_gpu.json").read_text())
    assert {"card", "torch", "cuda", "matmul_peak_tflops", "workloads", "targets", "quick"} <= set(
        report
    )
    assert (
        report["device"] == "cpu"
        and report["card"].startswith("CPU")
        and report["errors"] == []
        and report["finished"]
    )
    # CUDA only
    assert report["matmul_peak_tflops"]["fp32"] > 0 and "tf32" not in report["matmul_peak_tflops"]
    assert list(report["workloads"]) == ["gsc", "gru"]
    # the recurrence each way the device runs it: torch's, and the plain per-client GRU
    gru = report["workloads"]["gru"]
    assert set(gru["paths"]) == {"torch", "plain"} and gru["fastest"] in gru["s_per_layer"]
    assert gru["s_per_layer"]["plain"] == pytest.approx(gru["paths"]["plain"]["s_per_round"] / 5)
    paths = report["workloads"]["gsc"]["paths"]
    # on the CPU, fedac is fedac's CPU default: no fedac_cpu path
    assert set(paths) == {"fedac", "plain"}
    for result in paths.values():
        assert (
            result["s_per_round"] > 0 and result["samples_per_s"] > 0 and result["tflop_per_s"] > 0
        )
        assert result["peak_gpu_mb"] is None  # CUDA only
    # the same clients each round on both paths, so the same samples
    assert paths["fedac"]["samples_per_round"] == paths["plain"]["samples_per_round"]
    assert paths["fedac"]["speedup_vs_plain"] == pytest.approx(
        paths["plain"]["s_per_round"] / paths["fedac"]["s_per_round"]
    )
    targets = {t["target"]: t for t in report["targets"]}
    assert set(targets) == {"gsc round", "gsc vs plain"}
    assert all(
        not t["decides"] and not t["on_gpu"] and not t["at_target_scale"] for t in targets.values()
    )
    assert targets["gsc round"]["pass"] == (paths["fedac"]["s_per_round"] <= 0.3)
    assert done.stdout.rstrip().splitlines()[-1].startswith("wall ")  # the table comes last
    assert "gsc | fedac |" in done.stdout


def test_bad_arguments_are_refused_with_exit_2():
    done = run("--only", "gsc,nope", "--device", "cpu")
    assert done.returncode == 2 and "unknown workload(s) nope" in done.stderr
    done = run("--device", "tpu")
    assert done.returncode == 2 and "--device tpu" in done.stderr


# --- benchmarks/gpu: bench_gpu.py's incremental report, pytest_guard.py, check.sh's dry run -------

GPU = ROOT / "benchmarks" / "gpu"


def bench_module(name="bench_gpu"):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    return __import__(name)


def test_run_paths_saves_the_report_after_every_path_and_keeps_only_the_asked_paths():
    import argparse

    import torch

    timing = bench_module("gpu_timing")
    seconds = {"plain": 0.02, "fedac": 0.005, "other": 0.001}

    def path(name):  # a path whose round sleeps a known time, over 10 samples
        return lambda: ((lambda r: __import__("time").sleep(seconds[name])), (lambda r: 10))

    node, saved = {}, []
    args = argparse.Namespace(
        device=torch.device("cpu"),
        quick=True,
        paths={"fedac", "plain"},
        peaks={"fp32": 1.0},
        peaks_cpu={"fp32": 1.0},
        precision="fp32",
        started=0.0,
        save=lambda: saved.append({k: dict(v) for k, v in node.items()}),
    )
    out = timing.run_paths(
        args,
        {"fedac": path("fedac"), "other": path("other"), "plain": path("plain")},
        None,
        into=node,
    )
    assert out is node and list(node) == ["fedac", "plain"]  # "other" is not among --paths
    # written after each path, as measured
    assert [list(s) for s in saved] == [["fedac"], ["fedac", "plain"]]
    assert "speedup_vs_plain" not in saved[0]["fedac"]  # no plain yet
    assert node["fedac"]["speedup_vs_plain"] == pytest.approx(
        node["plain"]["s_per_round"] / node["fedac"]["s_per_round"]
    )
    # 20 ms against 5 ms, a loaded machine's jitter aside
    assert node["fedac"]["speedup_vs_plain"] > 1.5
    assert 0 < node["fedac"]["measured_after_s"] <= node["plain"]["measured_after_s"]


def test_gsc_line_reports_fedac_then_the_ratio_and_the_targets():
    bench = bench_module()
    report = {
        "card": "NVIDIA H100",
        "workloads": {"gsc": {"clients": 2618, "per_round": 524, "paths": {}}},
        "targets": [],
    }
    assert bench.gsc_line(report) is None  # nothing measured yet
    paths = report["workloads"]["gsc"]["paths"]
    paths["fedac"] = {"s_per_round": 0.25, "measured_after_s": 40.0}
    line = bench.gsc_line(report)
    assert "fedac 0.2500 s" in line and "vs plain -x" in line and "fedac measured 40 s" in line
    paths["plain"] = {"s_per_round": 3.0, "measured_after_s": 70.0}
    paths["fedac"]["speedup_vs_plain"] = 12.0
    report["targets"] = [
        bench.target("gsc round", "", 0.25, True, True, True),
        bench.target("gsc vs plain", "", 12.0, True, True, True),
    ]
    line = bench.gsc_line(report)
    assert line.startswith(
        "gsc on NVIDIA H100 (2618 clients, 524 a round): fedac 0.2500 s, plain 3.0000 s a round"
    )
    assert (
        "12.00x" in line
        and "<= 0.3 s PASS, >= 10x PASS (deciding)" in line
        and "plain measured 70 s" in line
    )


def guard(tmp_path, *args, **kwargs):
    return subprocess.run(
        [sys.executable, str(GPU / "pytest_guard.py"), "-q", "-p", "no:cacheprovider", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        **kwargs,
    )


def test_guard_skips_missing_optional_imports_keeps_other_errors_and_fails_a_hung_test(tmp_path):
    (tmp_path / "test_optional.py").write_text(
        "import nosuch_optional_pkg\n\ndef test_a():\n    pass\n"
    )
    (tmp_path / "test_itself.py").write_text(
        "import pytest\npytest.importorskip('nosuch_other', reason='other is "
        "absent')\n\ndef test_b():\n    pass\n"
    )
    (tmp_path / "test_ok.py").write_text(
        "import signal, time\n\ndef test_ok():\n    pass\n\ndef test_hung():\n    "
        "time.sleep(60)\n\ndef test_stuck():  # as if in C code: the alarm waits until the test "
        "unblocks it\n    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})\n    "
        "time.sleep(6)\n    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})\n"
    )
    common = [
        "--continue-on-collection-errors",
        "--optional-imports",
        "nosuch_optional_pkg",
        "--skipped-file",
        "skipped.txt",
    ]
    # faulthandler 3 s after the alarm, as check.sh sets it 10 s after: time for the hung test to
    # end first
    done = guard(tmp_path, *common, "--test-timeout", "1", "-o", "faulthandler_timeout=4")
    assert done.returncode == 1, done.stdout + done.stderr  # both failed, with where they were
    assert (
        "test_ok.py::test_hung ran past --test-timeout 1 s" in done.stdout
        and "time.sleep(60)" in done.stdout
    )
    assert "test_ok.py::test_stuck ran past --test-timeout 1 s" in done.stdout
    # faulthandler's dump of every thread: for the stuck test only (the hung one had failed at 1 s)
    assert done.stderr.count("Timeout (0:00:04)!") == 1 and "in test_stuck" in done.stderr
    assert "2 failed, 1 passed, 2 skipped" in done.stdout
    assert (
        "skipped for missing imports: test_itself.py (other is absent), test_optional.py (missing "
        "import nosuch_optional_pkg)"
    ) in done.stdout  # in collection order
    assert (tmp_path / "skipped.txt").read_text().splitlines() == [
        "test_itself.py\tother is absent",
        "test_optional.py\tmissing import nosuch_optional_pkg",
    ]
    # everything that can run passes: exit 0; a package not named optional stays a collection error
    assert guard(tmp_path, *common, "-k", "not hung").returncode == 0
    (tmp_path / "test_broken.py").write_text("import nosuch_required_pkg\n")
    done = guard(tmp_path, *common, "-k", "not hung")
    assert (
        done.returncode == 1
        and "ERROR test_broken.py" in done.stdout
        and "nosuch_required_pkg" not in (tmp_path / "skipped.txt").read_text()
    )


def test_guard_prints_the_traceback_and_summary_on_sigint_even_when_started_ignoring_it(tmp_path):
    (tmp_path / "test_slow.py").write_text(
        "import pathlib, time\n\ndef test_fast():\n    pass\n\ndef test_slow():\n"
        "    pathlib.Path('started').touch()\n    time.sleep(60)\n"
    )
    # started by a parent that ignores SIGINT (a shell's background job), then sent SIGINT as
    # `timeout -s INT` sends it when check.sh stops a section
    proc = subprocess.Popen(
        [sys.executable, str(GPU / "pytest_guard.py"), "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        deadline = time.monotonic() + 60
        while (
            not (tmp_path / "started").exists()
            and time.monotonic() < deadline
            and proc.poll() is None
        ):
            time.sleep(0.1)
        # the marker exists before touch() returns: give the test a second to reach its sleep
        # (a SIGINT inside touch() ends in pathlib.py, not at test_slow.py:8; seen once in CI)
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=30)[0]
    finally:
        proc.kill()
    assert proc.returncode == 2, out  # pytest's "interrupted"
    assert "KeyboardInterrupt" in out and "test_slow.py:8" in out and "1 passed" in out


def test_check_setup_installs_each_missing_package_on_its_own_and_falls_back_to_pythonpath(
    tmp_path,
):
    """check.sh's set-up on an image lacking soundfile, jiwer, opacus and fedac, with a pip that
    fails jiwer and the editable install of fedac (an old setuptools): the other packages still
    install, fedac runs from src/. No real pip runs: the python it is given records its pip calls
    and hides the packages (sys.modules[name] = None makes them unimportable and unfindable)."""
    (tmp_path / "hide").mkdir()
    (tmp_path / "hide" / "sitecustomize.py").write_text(
        "import os, sys\nfor name in os.environ['HIDE'].split(','):\n    sys.modules[name] = None\n"
    )
    python = tmp_path / "python"
    python.write_text(f"""#!/usr/bin/env bash
if [ "$1" = -m ] && [ "$2" = pip ]; then
    echo "${{*:3}}" >> {tmp_path}/pip-calls
    case "$*" in *jiwer*|*" -e ."*) echo "ERROR: failed on purpose"; exit 1 ;; esac
    exit 0
fi
exec {sys.executable} "$@"
""")
    python.chmod(0o755)
    (tmp_path / "wheels").mkdir()
    env = {
        **os.environ,
        "OUT": str(tmp_path / "out"),
        "PYTHON": str(python),
        "WHEELS": str(tmp_path / "wheels"),
        "PYTHONPATH": str(tmp_path / "hide"),
        "HIDE": "soundfile,jiwer,opacus,fedac",
    }
    done = subprocess.run(
        ["bash", str(GPU / "check.sh"), "setup"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    calls = (tmp_path / "pip-calls").read_text().splitlines()
    # one pip call each
    assert [c.split()[-1] for c in calls] == ["soundfile", "jiwer", "opacus", "."]
    assert all("--no-index" in c for c in calls) and "--no-deps" in calls[2] and "-e ." in calls[3]
    out = done.stdout
    assert (
        "installed soundfile" in out
        and "could not install jiwer" in out
        and "failed on purpose" in out
    )
    assert "installed opacus" in out and "using PYTHONPATH=src" in out
    # (hidden still; a real pip would have installed)
    assert "still missing: soundfile jiwer opacus fedac" in out
    assert "exit codes: setup 0" in out


def installed() -> set[tuple[str, str]]:
    from importlib.metadata import distributions

    return {(d.metadata["Name"], d.version) for d in distributions()}


#: check.sh's dry-run section limits (gsc, kws, profile, tests) on an idle machine, and the set-up's
DRY_LIMITS_S = 170 + 150 + 60 + 110 + 60


def calibration() -> float:
    """benchmarks/gpu/calibrate.py's factor: how much slower this machine is now than the idle one
    the dry run's limits were set on."""
    sys.path.insert(0, str(GPU))
    try:
        return __import__("calibrate").factor()
    finally:
        sys.path.remove(str(GPU))


@pytest.mark.slow
def test_check_dry_run_writes_the_gsc_number_first_then_the_rest_and_installs_nothing(tmp_path):
    """Independent of the machine's load: the dry run's section limits, and this test's own, scale
    with a calibration measured now (a loaded machine gets proportionally longer), so a section
    fails only when it takes longer than its work would on an idle machine times that factor
    (a hang still does)."""
    before = installed()
    scale = calibration()
    done = subprocess.run(
        ["bash", str(GPU / "check.sh"), "--dry-run"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={
            **os.environ,
            "OUT": str(tmp_path),
            "PYTHON": sys.executable,
            "DRY_SCALE": f"{scale:.2f}",
        },
        timeout=DRY_LIMITS_S * scale + 60,
    )
    log = done.stdout
    assert done.returncode == 0, log[-4000:] + done.stderr[-2000:]
    assert (
        "still missing: nothing" in log
        and not (tmp_path / "pip.log").exists()
        and installed() == before
    )
    # the sections in order, the GSC number printed as soon as its section ends
    starts = [log.index(f"== {name} (") for name in ("gsc", "kws", "profile", "tests")]
    assert starts == sorted(starts) and starts[0] < log.index("== GSC: gsc on CPU") < starts[1]
    assert "exit codes: gsc 0, kws 0, profile 0, tests 0" in log
    assert f"time limits x {scale:.2f}" in log
    line = (tmp_path / "gsc.txt").read_text()
    assert line.startswith("gsc on CPU") and "fedac vs plain" in line and line.count("\n") == 1
    gsc = json.loads((tmp_path / "bench_gsc.json").read_text())
    assert list(gsc["workloads"]) == ["gsc"] and list(gsc["workloads"]["gsc"]["paths"]) == [
        "fedac",
        "plain",
    ]
    assert gsc["finished"] and gsc["errors"] == []
    kws = json.loads((tmp_path / "kws_check.json").read_text())
    assert list(kws["networks"]) == ["dscnn", "mhattrnn"]
    for row in kws["networks"].values():
        paths = row["paths"]
        # the stacked form and fedac's per-client loop agree (float rounding, which BatchNorm
        # amplifies: 2.8e-3 under PyTorch's AVX2 kernels, ATEN_CPU_CAPABILITY=avx2), each timed
        assert paths["stacked"]["s"] > 0 and "error" not in paths["sequential"], paths
        assert paths["sequential"]["vs_stacked"]["params_max_rel_diff"] < 5e-3
        assert row["stacked_vs_sequential"] > 0
    profile = json.loads((tmp_path / "profile.json").read_text())
    assert list(profile["profiles"]) == ["gsc", "kws_dscnn"]
    assert profile["profiles"]["gsc"][0]["op"] and (tmp_path / "profile_kws_dscnn.txt").exists()
    tests = (tmp_path / "tests.log").read_text()
    assert (
        "skipped for missing imports: none" in tests
        and " passed" in tests
        and "failed" not in tests
    )
