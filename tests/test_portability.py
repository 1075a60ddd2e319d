"""The suite holds on any machine and from any shell.

Tests that compare with numbers written on another machine hold under other kernel choices on this
one.

Those numbers are only reproducible to float rounding away from the machine, thread count and
kernels that wrote them, so such a test states a tolerance (tests/engine/test_old_runs.py REL). Each
variant here reruns them in a fresh pytest with one kernel choice changed: a test that passes only
with the writer's kernels (a bit-exact comparison with a stored number) fails here, on any machine.
Bit-exact comparisons stay where both sides run in one process (resume against an uninterrupted
run).

Tests set the process state they need instead of inheriting it: conftest.py runs each one inside
helpers.terminal_process_state (a foreground pytest's signal handlers; cwd and thread count
restored).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import COMPUTE_ENV, terminal_process_state

REPO = Path(__file__).parents[1]
#: Every test that compares with numbers computed elsewhere: the old code's runs
#: (tests/data/old_runs) and a published value (Opacus' accountant).
NUMERIC = [
    "tests/engine/test_old_runs.py",
    "tests/rules/test_privacy.py::test_accountant_matches_the_published_value",
]
#: One kernel choice changed each (the environment of the rerun), with code that checks it takes
#: effect here.
VARIANTS = {
    # torch's generic kernels instead of its AVX2 / AVX-512 ones (torch reads it once, at import)
    "aten-default": (
        {"ATEN_CPU_CAPABILITY": "default"},
        "import torch; c = torch.backends.cpu.get_cpu_capability(); assert c == 'DEFAULT', c",
    ),
    # 2 intra-op threads instead of the 1 the runs were written with: other reduction splits
    "two-threads": ({COMPUTE_ENV: "runtime.threads=2"}, None),
    # the fused C++ GRU recurrence instead of the pure-torch one the runs were written with
    "fused-gru": (
        {COMPUTE_ENV: "runtime.gru_kernel=fused"},
        "from fedac.kernels import set_gru_kernel; set_gru_kernel('fused')",
    ),
}


def variant_env(changes: dict[str, str]) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in (COMPUTE_ENV, "ATEN_CPU_CAPABILITY")
    }
    return {**env, **changes}


@pytest.mark.slow
@pytest.mark.parametrize("name", VARIANTS)
def test_numeric_tests_hold_under_another_kernel_choice(name, tmp_path):
    changes, probe = VARIANTS[name]
    env = variant_env(changes)
    if probe:
        check = subprocess.run(
            [sys.executable, "-c", probe],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if check.returncode and name == "fused-gru":
            pytest.skip(
                f"the fused GRU is not available here: {check.stderr.strip().splitlines()[-1:]}"
            )
        assert check.returncode == 0, check.stderr
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--basetemp={tmp_path / 'tmp'}",
            *NUMERIC,
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"{name} {changes}:\n{proc.stdout[-4000:]}{proc.stderr[-2000:]}"
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]


def state() -> tuple:
    return (
        os.getcwd(),
        torch.get_num_threads(),
        signal.getsignal(signal.SIGINT),
        signal.getsignal(signal.SIGTERM),
    )


def test_each_test_starts_with_a_terminals_signal_handlers_and_leaves_no_state_behind(tmp_path):
    before = state()
    assert before[2:] == (signal.default_int_handler, signal.SIG_DFL)  # conftest.py's process_state
    with terminal_process_state():
        # what a background job inherits, and what a test may change
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.chdir(tmp_path)
        torch.set_num_threads(before[1] + 1)
        with terminal_process_state():
            assert state()[2:] == (signal.default_int_handler, signal.SIG_DFL)
        assert state() == (str(tmp_path), before[1] + 1, signal.SIG_IGN, signal.SIG_IGN)
    assert state() == before
