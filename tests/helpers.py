"""Small builders shared by several test modules (tests/ is on sys.path, see conftest.py)."""

from __future__ import annotations

import math
import os
import signal
import threading
from contextlib import contextmanager

import pytest


def tiny_run(root, cache) -> dict:
    """Settings of a tiny, fast run on a test GSC tree: crnn_tiny, half the clients a round,
    evaluation and a checkpoint every round. Keys are `--set` / load_config override names."""
    return {
        "data.root": root,
        "data.cache_dir": cache,
        "model.name": "crnn_tiny",
        "train.fraction": 0.5,
        "train.eval_every": 1,
        "train.checkpoint_every": 1,
    }


#: The dispositions a foreground `python -m pytest` in a terminal starts with. A background job of a
#: shell without job control (`cmd &` or `nohup cmd &` in a script, `bash -c 'cmd &'`) starts with
#: SIGINT ignored, and Python then installs no KeyboardInterrupt handler: tests that rely on Ctrl-C
#: would inherit that.
SIGNAL_DEFAULTS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}


@contextmanager
def terminal_process_state():
    """SIGNAL_DEFAULTS inside the block (in the main thread, where signal.signal works); after it
    the signal handlers, the working directory and torch's thread count (runs set it to
    runtime.threads) as they were before. conftest.py wraps every test in it."""
    import torch

    cwd, threads = os.getcwd(), torch.get_num_threads()
    main = threading.current_thread() is threading.main_thread()
    previous = (
        {sig: signal.signal(sig, handler) for sig, handler in SIGNAL_DEFAULTS.items()}
        if main
        else {}
    )
    try:
        yield
    finally:
        for sig, handler in previous.items():
            if handler is not None:  # (None: set outside Python, cannot be reinstalled from here)
                signal.signal(sig, handler)
        os.chdir(cwd)
        torch.set_num_threads(threads)


@contextmanager
def no_generation():
    """Inside the block any rendering of synthetic audio fails, so a call that returns proves it
    reused its cache (a count of work done, where a wall-time limit would only guess)."""
    from fedac.data import layout

    def rendered(*args, **kwargs):
        raise AssertionError(
            "the generator rendered audio again instead of reusing its cached output"
        )

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(layout, "run_tasks", rendered)
        yield


#: Tests that compare with numbers written elsewhere apply these settings to the runs they make:
#: FEDAC_TEST_COMPUTE="runtime.threads=2,runtime.gru_kernel=fused". tests/test_portability.py
#: sets it to rerun them under other kernel choices; unset, runs keep the settings they were
#: written with.
COMPUTE_ENV = "FEDAC_TEST_COMPUTE"


def compute_overrides() -> dict[str, str]:
    """$FEDAC_TEST_COMPUTE as {"runtime.threads": "2", ...}. Only settings documented to leave a
    run's numbers unchanged to float rounding (experiments/compare.py HOW_TO_COMPUTE) are accepted,
    so a variant can change how a run computes, never what."""
    from fedac.experiments.compare import HOW_TO_COMPUTE

    pairs = [
        item.split("=", 1) for item in os.environ.get(COMPUTE_ENV, "").split(",") if item.strip()
    ]
    allowed = set(HOW_TO_COMPUTE)
    for pair in pairs:
        if len(pair) != 2 or pair[0].strip() not in allowed:
            raise ValueError(
                f"{COMPUTE_ENV}: {'='.join(pair)!r} is not KEY=VALUE with KEY one of "
                f"{sorted(allowed)}"
            )
    return {key.strip(): value.strip() for key, value in pairs}


def numbers_differ(actual, expected, rel: float, path: str = "") -> list[str]:
    """Where `actual` differs from `expected` (nested dicts and lists of JSON values): keys, lengths
    and every non-float value exactly, floats to `rel` relative (math.isclose, abs_tol 1e-12 for
    zeros). Empty when they agree."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        if set(actual) != set(expected):
            return [f"{path or '.'}: keys {sorted(actual)} != {sorted(expected)}"]
        return [
            line
            for key in expected
            for line in numbers_differ(actual[key], expected[key], rel, f"{path}.{key}")
        ]
    if isinstance(expected, list) and isinstance(actual, list):
        if len(actual) != len(expected):
            return [f"{path}: {len(actual)} items != {len(expected)}"]
        return [
            line
            for i, (a, e) in enumerate(zip(actual, expected))
            for line in numbers_differ(a, e, rel, f"{path}[{i}]")
        ]
    if (
        isinstance(expected, float)
        and isinstance(actual, (int, float))
        and not isinstance(actual, bool)
    ):
        same = math.isclose(actual, expected, rel_tol=rel, abs_tol=1e-12) or (
            math.isnan(actual) and math.isnan(expected)
        )
    else:
        same = type(actual) is type(expected) and actual == expected
    return [] if same else [f"{path}: {actual!r} != {expected!r}"]
