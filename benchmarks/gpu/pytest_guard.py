"""pytest for a lent machine (benchmarks/gpu/check.sh): a per-test time limit, tracebacks when the
whole run is stopped, and test modules that cannot import an optional package reported apart from
failures.

    python -X faulthandler benchmarks/gpu/pytest_guard.py [pytest arguments] [--test-timeout S]
        [--optional-imports soundfile,flwr,...] [--skipped-file PATH]

- `--test-timeout S`: a test still running after S seconds fails with a traceback of where it was
  (SIGALRM, raised when Python code next runs) and the run goes on; pass `-o
  faulthandler_timeout=S2` too, S2 a few seconds over S, so a test stuck inside C code (a CUDA call,
  a lock), which the alarm cannot interrupt, still dumps every thread's stack. Not S2 = S:
  faulthandler's dump of a thread that is unwinding the alarm's exception can crash the process.
  pytest-timeout does this better, but the machine's image may lack it and this needs nothing but
  pytest.
- SIGINT raises KeyboardInterrupt even when the parent started this process with SIGINT ignored (a
  shell's background job): `timeout -s INT` then makes pytest print the interrupted test's traceback
  and the summary.
- A test module whose collection fails with `ModuleNotFoundError` of one of the optional packages is
  reported as skipped (not as an error), so the exit code says whether everything that could run
  passed; any other collection error stays an error. Modules that skip themselves while importing
  (`pytest.importorskip` at the top) are listed with them: "skipped for missing imports: ..." at the
  end, and in `--skipped-file`.
"""

from __future__ import annotations

import os
import re
import signal
import sys

import pytest

OPTIONAL = (
    "soundfile",
    "espeakng_loader",
    "jiwer",
    "opacus",
    "flwr",
    "cryptography",
    "datasets",
    "transformers",
    "ray",
    "pyarrow",
    "triton",
)
"""Packages a test module may lack on a lent machine's image (fedac's extras and the wheels check.sh
installs)."""
MISSING = re.compile(r"No module named '([\w.]+)'")


class TestTimeout(Exception):
    """A test ran past --test-timeout."""


def pytest_addoption(parser):
    group = parser.getgroup("pytest_guard", "benchmarks/gpu/pytest_guard.py")
    group.addoption(
        "--test-timeout",
        type=float,
        default=0.0,
        help="seconds a test may run before it fails (0: none)",
    )
    group.addoption(
        "--optional-imports",
        default=",".join(OPTIONAL),
        help="comma list of packages whose absence skips a test module instead of failing it",
    )
    group.addoption(
        "--skipped-file", default=None, help="write the modules skipped for missing imports here"
    )


def pytest_configure(config):
    config._guard_skipped = {}  # module path: reason


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if not isinstance(collector, pytest.Module) or report.passed:
        return
    optional = {
        name.strip()
        for name in collector.config.getoption("optional_imports").split(",")
        if name.strip()
    }
    text = str(report.longrepr)
    if report.failed:
        found = MISSING.search(text)
        if not found or found.group(1).split(".")[0] not in optional:
            return  # a real collection error
        reason = f"missing import {found.group(1)}"
        report.outcome, report.longrepr = "skipped", (str(collector.path), 0, reason)
    else:  # skipped while importing: pytest.importorskip or pytest.skip(allow_module_level=True)
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else text
        reason = reason.removeprefix("Skipped: ")
    collector.config._guard_skipped[collector.nodeid] = reason


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    limit = item.config.getoption("test_timeout")
    if not limit or not hasattr(signal, "SIGALRM"):
        yield
        return

    def expired(signum, frame):
        raise TestTimeout(f"{item.nodeid} ran past --test-timeout {limit:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    skipped = config._guard_skipped
    line = "skipped for missing imports: " + (
        ", ".join(f"{k} ({v})" for k, v in skipped.items()) or "none"
    )
    terminalreporter.write_line(line)
    if config.getoption("skipped_file"):
        with open(config.getoption("skipped_file"), "w") as f:
            f.write("".join(f"{k}\t{v}\n" for k, v in skipped.items()))


def main(argv: list[str]) -> int:
    # undo an inherited SIG_IGN (see the docstring)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.path.insert(0, os.getcwd())  # as `python -m pytest` does
    return int(pytest.main(argv, plugins=[sys.modules[__name__]]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
