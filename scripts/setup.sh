#!/usr/bin/env bash
# Create .venv and install fedac with its test tools. Idempotent: a second call only checks.
# torch is installed first as exactly 2.13.0 (the CPU wheel on our machines); any looser spec with
# no torch present would pull several GB of CUDA packages. Each step says what it does and how long
# it took (pip stays quiet: a first install is minutes of downloads, a second call seconds).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
step() { echo "setup.sh [${SECONDS} s]: $*"; }
if [ ! -x .venv/bin/python ]; then
    step "creating .venv with $PYTHON"
    "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
step "installing torch==2.13.0 (the CPU wheel, about 200 MB on a first install)"
"${PIP[@]}" torch==2.13.0
step "installing fedac (editable) with its test tools and the ssl, peft, hf, tensorboard, mlflow, sweep and export extras"
# peft: model.peft on the speech encoders, tested by tests/models/test_peft.py
# tensorboard, mlflow: the optional trackers (log.tensorboard, log.mlflow), tested by tests/engine/test_trackers.py
# sweep: optuna, for `fedac sweep` (tests/experiments/test_sweep.py)
# export: onnx, onnxscript, onnxruntime for `fedac export` / `fedac predict`, tested by tests/export/
"${PIP[@]}" -e ".[test,ssl,peft,hf,tensorboard,mlflow,sweep,export]"
step "checking that torch and fedac import"
.venv/bin/python -c "import torch, fedac; assert torch.__version__.startswith('2.13.0'), torch.__version__"
# The fused GRU kernel (src/fedac/kernels/gru.cpp, g++ + ninja, about a minute once). If it cannot be
# built, fedac runs the pure-torch GRU (equal to float rounding, slower) and says so, here and in every run.
step "building the fused GRU kernel (once per source and toolchain: about a minute)"
.venv/bin/python -c "import logging; logging.basicConfig(level=logging.INFO, format='%(message)s')
import fedac.kernels as k; print('fedac kernels:', k.status())"
step "done: .venv/bin/fedac run trains the default job"
