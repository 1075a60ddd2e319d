"""Small builders shared by several test modules (tests/ is on sys.path, see conftest.py)."""

from __future__ import annotations

from contextlib import contextmanager

import pytest


def tiny_run(root, cache) -> dict:
    """Settings of a tiny, fast run on a test GSC tree: crnn_tiny, half the clients a round,
    evaluation and a checkpoint every round. Keys are `--set` / load_config override names."""
    return {
        "data.root": root, "data.cache_dir": cache, "model.name": "crnn_tiny", "train.fraction": 0.5,
        "train.eval_every": 1, "train.checkpoint_every": 1,
    }


@contextmanager
def no_generation():
    """Inside the block any rendering of synthetic audio fails, so a call that returns proves it reused
    its cache (a count of work done, where a wall-time limit would only guess)."""
    from fedac.data import layout

    def rendered(*args, **kwargs):
        raise AssertionError("the generator rendered audio again instead of reusing its cached output")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(layout, "run_tasks", rendered)
        yield
