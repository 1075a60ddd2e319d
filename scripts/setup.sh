#!/usr/bin/env bash
# Create .venv and install fedac with its test tools. Idempotent: a second call only checks.
# torch is installed first as exactly 2.13.0 (the CPU wheel on our machines); any looser spec with
# no torch present would pull several GB of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
"${PIP[@]}" torch==2.13.0
# tensorboard, mlflow: the optional trackers (log.tensorboard, log.mlflow), tested by tests/engine/test_trackers.py
"${PIP[@]}" -e ".[test,ssl,hf,tensorboard,mlflow]"
.venv/bin/python -c "import torch, fedac; assert torch.__version__.startswith('2.13.0'), torch.__version__"
# The fused GRU kernel (src/fedac/kernels/gru.cpp, g++ + ninja, about a minute once). If it cannot be
# built, fedac runs the pure-torch GRU (equal to float rounding, slower) and says so, here and in every run.
.venv/bin/python -c "import logging; logging.basicConfig(level=logging.INFO, format='%(message)s')
import fedac.kernels as k; print('fedac kernels:', k.status())"
