"""Compiled kernels: the fused stacked GRU recurrence (gru.cpp) used by models/stacked.py.

Built with torch.utils.cpp_extension (g++ and ninja) into `_build/<key>/` here, where the key hashes
everything that shapes the compile command (the source, flags, compiler, torch, Python headers and the
ninja binary): scripts/setup.sh builds it, and a process that finds no build for its key compiles it on
first use (about a minute) and says so. The ninja is always the pip package's (a dependency), never
whichever one PATH finds first: two ninjas read each other's build logs as "command line changed" and
rebuilt the same checkout back and forth (about two minutes each way). Where it cannot be built (no
compiler, a CPU without AVX2), the pure-torch GRU of models/stacked.py runs instead, and a warning says
so. `train.gru_kernel` chooses: auto (fused when it builds), fused (fail if it does not), torch (never
build or use it), and on a GPU triton, the recurrence of gru_triton.py (auto's choice there when Triton
imports).

The kernels and the pure-torch recurrence do the same math but not in the same instructions (Sleef
vector exp / tanh and fused multiply-adds against torch's own ops), so they agree to float rounding per
step, not bit for bit: tests/test_gru_kernel.py checks outputs to 1e-6 and gradients to 1e-5 (absolute
and relative) against the pure-torch recurrence and nn.GRU. Over a long run those per-step differences
grow like any rounding change: on one machine the default run's final test accuracy was 63.53% with
the fused kernel and 64.01% with train.gru_kernel=torch (0.48 points), so a long run's final metrics
move with the kernel choice by that order, and bit-identical reruns need the same choice and the same
build (AVX-512 and AVX2 builds differ in rounding too).

Belongs here: compiled kernels and their build, in the models layer (models/stacked.py calls them,
engine/runtime.py chooses the mode). Must not be here: a model, a training step or anything that
changes what is computed (each kernel has a pure-torch reference it equals to float rounding), and no
import of fedac.training or any layer above.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sysconfig
import threading
from pathlib import Path
from types import ModuleType

import torch

from fedac.errors import ConfigError

log = logging.getLogger(__name__)

GRU_KERNEL_MODES = ("auto", "fused", "torch", "triton")
_SOURCE = Path(__file__).with_name("gru.cpp")
_CAPABILITIES = ("AVX2", "AVX512")  # gru.cpp is compiled for AVX2; AVX-512 CPUs run AVX2 code too
_lock = threading.Lock()
_state: dict = {"mode": "auto", "module": None, "error": None, "tried": False, "triton": None, "triton_error": None,
                "warned_cpu_triton": False}


# CPU_CAPABILITY_AVX2 selects ATen's AVX2 Vectorized<float> (and its Sleef exp / tanh, as torch's kernels)
_CFLAGS = ["-O3", "-mavx2", "-mfma", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"]


def _ninja_bin_dir() -> str:
    import ninja  # the pip package: one ninja for every process, whatever PATH holds

    return ninja.BIN_DIR


def build_key() -> str:
    """A short hash of what determines the compiled kernel and ninja's view of its command line."""
    parts = [_SOURCE.read_bytes(), " ".join(_CFLAGS).encode(), os.environ.get("CXX", "c++").encode(),
             torch.__version__.encode(), sysconfig.get_paths()["include"].encode(), _ninja_bin_dir().encode()]
    digest = hashlib.sha256()
    for part in parts:
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()[:12]


def build_dir() -> Path:
    """Next to the sources (an editable install: built once by scripts/setup.sh, whatever FEDAC_HOME a
    process sets), else under $FEDAC_HOME where the package directory is read-only; one folder per key."""
    tag = f"torch-{torch.__version__.replace('+', '_')}-{build_key()}"
    local = Path(__file__).parent / "_build"
    if os.access(local if local.exists() else local.parent, os.W_OK):
        return local / tag
    return Path(os.environ.get("FEDAC_HOME") or Path.home() / ".cache" / "fedac") / "kernels" / tag


def _build(verbose: bool = False) -> ModuleType:
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in _CAPABILITIES:
        raise RuntimeError(f"the fused GRU needs AVX2; torch reports CPU capability {capability}")
    from torch.utils.cpp_extension import load

    bin_dir = _ninja_bin_dir()
    if os.environ.get("PATH", "").split(os.pathsep)[0] != bin_dir:
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    directory = build_dir()
    directory.mkdir(parents=True, exist_ok=True)
    if not (directory / "fedac_gru.so").exists():  # a folder per key: a present .so is never rebuilt
        log.warning("building the fused GRU kernel in %s (once per source and toolchain, about a minute)", directory)
    return load("fedac_gru", [str(_SOURCE)], build_directory=str(directory), verbose=verbose, extra_cflags=_CFLAGS)


def set_gru_kernel(mode: str) -> None:
    """Process-wide choice of the stacked GRU's recurrence (`train.gru_kernel`)."""
    if mode not in GRU_KERNEL_MODES:
        raise ConfigError(f"train.gru_kernel must be one of {', '.join(GRU_KERNEL_MODES)}, got {mode!r}")
    _state["mode"] = mode
    if mode == "fused" and fused_gru() is None:
        raise ConfigError(f"train.gru_kernel=fused, but the fused GRU kernel did not build: {_state['error']}")
    if mode == "triton" and _triton() is None:
        raise ConfigError(f"train.gru_kernel=triton, but Triton is not usable here: {_state['triton_error']} "
                          "(it ships with CUDA builds of torch: pip install triton)")


def _triton() -> ModuleType | None:
    """kernels/gru_triton.py, or None where Triton does not import (the reason kept for the message)."""
    if _state["triton"] is None and _state["triton_error"] is None:
        try:
            from fedac.kernels import gru_triton

            _state["triton"] = gru_triton
        except Exception as exc:  # not installed, or no backend: the pure-torch recurrence
            _state["triton_error"] = f"{type(exc).__name__}: {str(exc).strip()[-300:]}"
    return _state["triton"]


def recurrence_kernel(device_type: str) -> ModuleType | None:
    """The kernel module (`forward`, `backward`) that runs the stacked GRU's recurrence on a device type, or
    None for models/stacked.py's pure-torch one. The CPU: the fused C++ kernel (auto, fused). A GPU: the
    Triton kernel (auto when Triton imports, triton). triton on the CPU runs Triton's interpreter, which
    only TRITON_INTERPRET=1 enables (tests); otherwise the CPU keeps its own choice and says so once, so a
    run on CPU tensors with train.gru_kernel=triton is never silently timed as the GPU kernel."""
    mode = _state["mode"]
    if mode == "torch":
        return None
    if device_type == "cpu":
        if mode == "triton" and os.environ.get("TRITON_INTERPRET") == "1":
            return _triton()
        if mode == "triton" and not _state["warned_cpu_triton"]:
            _state["warned_cpu_triton"] = True
            log.warning("train.gru_kernel=triton runs on a GPU; these CPU tensors use the CPU's own GRU "
                        "recurrence (%s); TRITON_INTERPRET=1 runs the Triton kernel in its (slow) interpreter",
                        "fused" if fused_gru() is not None else "pure torch")
        return fused_gru()
    if device_type == "cuda" and mode in ("auto", "triton"):
        return _triton()
    return None


def fused_gru() -> ModuleType | None:
    """The compiled kernel module, or None when the mode is torch or it cannot be built (warned once)."""
    if _state["mode"] == "torch":
        return None
    if not _state["tried"]:
        with _lock:
            if not _state["tried"]:
                try:
                    _state["module"] = _build()
                except Exception as exc:  # any build failure means the pure-torch path, never a failed run
                    _state["error"] = f"{type(exc).__name__}: {str(exc).strip()[-500:]}"
                    log.warning("fused GRU kernel unavailable, using the pure-torch GRU (slower): %s",
                                _state["error"])
                _state["tried"] = True
    return _state["module"]


def status() -> dict:
    """What this process runs: the mode, whether the fused kernel is in use, and why not."""
    module = fused_gru()
    return {"gru_kernel": _state["mode"], "fused_gru": module is not None, "build_dir": str(build_dir()),
            "error": _state["error"]}
