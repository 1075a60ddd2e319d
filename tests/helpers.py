"""Small builders shared by several test modules (tests/ is on sys.path, see conftest.py)."""

from __future__ import annotations


def tiny_run(root, cache) -> dict:
    """Settings of a tiny, fast run on a test GSC tree: crnn_tiny, half the clients a round,
    evaluation and a checkpoint every round. Keys are `--set` / load_config override names."""
    return {
        "data.root": root, "data.cache_dir": cache, "model.name": "crnn_tiny", "train.fraction": 0.5,
        "train.eval_every": 1, "train.checkpoint_every": 1,
    }
