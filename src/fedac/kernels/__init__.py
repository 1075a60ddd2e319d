"""Compiled kernels: the fused stacked GRU recurrence (gru.cpp) used by models/stacked.py.

Built with torch.utils.cpp_extension (g++ and ninja) into `_build/<key>/` here, where the key hashes
everything that shapes the compile command (the source and its path, flags, compiler, torch, Python
headers and the ninja binary): scripts/setup.sh builds it, and a process that finds no build for its
key compiles it on first use (about a minute) and says so. The ninja is always the pip package's (a
dependency), never whichever one PATH finds first: two ninjas read each other's build logs as
"command line changed" and rebuilt the same checkout back and forth (about two minutes each way). It
is built for the vector width torch's own kernels use on this CPU (`cpu_capability()`): AVX-512
where torch reports AVX512, else AVX2, each build in its own key folder; ATEN_CPU_CAPABILITY=avx2
(torch's switch) or FEDAC_GRU_CAPABILITY=avx2 (this kernel's alone) select the AVX2 build on an
AVX-512 CPU. Where it cannot be built (no compiler, a CPU without AVX2,
ATEN_CPU_CAPABILITY=default), the pure-torch GRU of models/stacked.py runs instead, and a warning
says so. `runtime.gru_kernel` chooses: auto (fused when it builds), fused (fail if it does not),
torch (never build or use it), and on a GPU triton, the recurrence of gru_triton.py (auto's choice
there when Triton imports).

The kernels and the pure-torch recurrence do the same math but not in the same instructions (Sleef
vector exp / tanh and fused multiply-adds against torch's own ops), so they agree to float rounding
per step, not bit for bit: tests/models/test_gru_kernel.py checks outputs to 1e-6 and gradients to
1e-5 (absolute and relative) against the pure-torch recurrence and nn.GRU. Over a long run those
per-step differences grow like any rounding change: on one machine the default run's final test
accuracy was 63.53% with the fused kernel and 64.01% with runtime.gru_kernel=torch (0.48 points), so
a long run's final metrics move with the kernel choice by that order, and bit-identical reruns need
the same choice. The AVX2 and AVX-512 builds run the same per-element code and agree bit for bit
(tested), so the build does not move a run; the ATen matmuls around the kernel may still round
differently from machine to machine.

Belongs here: compiled kernels and their build, in the models layer (models/stacked.py calls them,
training/runtime.py chooses the mode). Must not be here: a model, a training step or anything that
changes what is computed (each kernel has a pure-torch reference it equals to float rounding), and
no import of fedac.training or any layer above.
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
_lock = threading.Lock()
_state: dict = {
    "mode": "auto",
    "module": None,
    "error": None,
    "tried": False,
    "triton": None,
    "triton_error": None,
    "warned_cpu_triton": False,
    "capability": None,
}

# One build per vector width, compiled as torch compiles its own kernels for that CPU capability:
# the CPU_CAPABILITY_* macro picks ATen's Vectorized<float> (vec256: 8 lanes, vec512: 16) and its
# Sleef exp / tanh, and the -m flags let g++ emit those instructions. An AVX2-only build on an
# AVX-512 CPU ran the gate passes at half width while torch's own ops ran AVX-512
# (docs/performance.md).
CAPABILITY_FLAGS = {
    "AVX2": ["-mavx2", "-mfma", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"],
    "AVX512": [
        "-mavx512f",
        "-mavx512bw",
        "-mavx512vl",
        "-mavx512dq",
        "-mfma",
        "-DCPU_CAPABILITY=AVX512",
        "-DCPU_CAPABILITY_AVX512",
    ],
}
CAPABILITY_ENV = "FEDAC_GRU_CAPABILITY"
"""Forces a narrower build than the CPU's (`avx2` on an AVX-512 CPU, to time the two builds against
each other: benchmarks/bench_paper.py); it can never exceed what torch reports."""


def cpu_capability() -> str:
    """The build this process uses: torch's CPU capability
    (`torch.backends.cpu.get_cpu_capability()`, which honours ATEN_CPU_CAPABILITY=avx2|default),
    lowered to AVX2 by FEDAC_GRU_CAPABILITY=avx2. DEFAULT (no AVX2) has no build: the pure-torch GRU
    runs."""
    torch_capability = torch.backends.cpu.get_cpu_capability()
    forced = os.environ.get(CAPABILITY_ENV, "").strip().upper()
    if not forced:
        return torch_capability
    order = ["DEFAULT", *CAPABILITY_FLAGS]
    if forced not in order:
        raise ConfigError(
            f"{CAPABILITY_ENV}={forced.lower()}: expected one of "
            f"{', '.join(c.lower() for c in order)} (or unset: torch's own, {torch_capability})"
        )
    if torch_capability not in order or order.index(forced) <= order.index(torch_capability):
        return forced
    return torch_capability  # asking for more than the CPU (or ATEN_CPU_CAPABILITY) allows: torch's


def _cflags(capability: str) -> list[str]:
    if capability not in CAPABILITY_FLAGS:
        raise RuntimeError(
            f"the fused GRU needs AVX2 or AVX-512; torch reports CPU capability {capability} "
            f"(ATEN_CPU_CAPABILITY or {CAPABILITY_ENV} may have forced it)"
        )
    return ["-O3", *CAPABILITY_FLAGS[capability]]


def _ninja_bin_dir() -> str:
    import ninja  # the pip package: one ninja for every process, whatever PATH holds

    return ninja.BIN_DIR


def build_key(capability: str | None = None) -> str:
    """A short hash of what determines the compiled kernel and ninja's view of its command line,
    the source's path included: ninja's build file names it, so two checkouts sharing one build
    folder (a git worktree linking the main one's) would otherwise rebuild it in turn."""
    flags = " ".join(_cflags(capability or cpu_capability()))
    parts = [
        str(_SOURCE.resolve()).encode(),
        _SOURCE.read_bytes(),
        flags.encode(),
        os.environ.get("CXX", "c++").encode(),
        torch.__version__.encode(),
        sysconfig.get_paths()["include"].encode(),
        _ninja_bin_dir().encode(),
    ]
    digest = hashlib.sha256()
    for part in parts:
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()[:12]


def build_dir(capability: str | None = None) -> Path:
    """Next to the sources (an editable install: built once by scripts/setup.sh, whatever FEDAC_HOME
    a process sets), else under $FEDAC_HOME where the package directory is read-only; one folder per
    key."""
    tag = f"torch-{torch.__version__.replace('+', '_')}-{build_key(capability)}"
    local = Path(__file__).parent / "_build"
    if os.access(local if local.exists() else local.parent, os.W_OK):
        return local / tag
    return Path(os.environ.get("FEDAC_HOME") or Path.home() / ".cache" / "fedac") / "kernels" / tag


def module_name(capability: str) -> str:
    """The extension's name per build (fedac_gru_avx512, fedac_gru_avx2), so both load in one
    process."""
    return f"fedac_gru_{capability.lower()}"


def _build(verbose: bool = False, capability: str | None = None) -> ModuleType:
    """Compile (once per key) and load the kernel for `capability` (default: `cpu_capability()`)."""
    capability = capability or cpu_capability()
    flags = _cflags(capability)
    from torch.utils.cpp_extension import load

    bin_dir = _ninja_bin_dir()
    if os.environ.get("PATH", "").split(os.pathsep)[0] != bin_dir:
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    directory = build_dir(capability)
    directory.mkdir(parents=True, exist_ok=True)
    name = module_name(capability)
    if not (directory / f"{name}.so").exists():  # a folder per key: a present .so is never rebuilt
        log.warning(
            "building the fused GRU kernel (%s) in %s (once per source and toolchain, about a "
            "minute)",
            capability,
            directory,
        )
    return load(
        name, [str(_SOURCE)], build_directory=str(directory), verbose=verbose, extra_cflags=flags
    )


def set_gru_kernel(mode: str) -> None:
    """Process-wide choice of the stacked GRU's recurrence (`runtime.gru_kernel`)."""
    if mode not in GRU_KERNEL_MODES:
        raise ConfigError(
            f"runtime.gru_kernel must be one of {', '.join(GRU_KERNEL_MODES)}, got {mode!r}"
        )
    _state["mode"] = mode
    if mode == "fused" and fused_gru() is None:
        raise ConfigError(
            f"runtime.gru_kernel=fused, but the fused GRU kernel did not build: {_state['error']}"
        )
    if mode == "triton" and _triton() is None:
        raise ConfigError(
            f"runtime.gru_kernel=triton, but Triton is not usable here: {_state['triton_error']} "
            "(it ships with CUDA builds of torch: pip install triton)"
        )


def _triton() -> ModuleType | None:
    """kernels/gru_triton.py, or None where Triton does not import (the reason kept for the
    message)."""
    if _state["triton"] is None and _state["triton_error"] is None:
        try:
            from fedac.kernels import gru_triton

            _state["triton"] = gru_triton
        except Exception as exc:  # not installed, or no backend: the pure-torch recurrence
            _state["triton_error"] = f"{type(exc).__name__}: {str(exc).strip()[-300:]}"
    return _state["triton"]


def recurrence_kernel(device_type: str) -> ModuleType | None:
    """The kernel module (`forward`, `backward`) that runs the stacked GRU's recurrence on a device
    type, or None for models/stacked.py's pure-torch one. The CPU: the fused C++ kernel (auto,
    fused). A GPU: the Triton kernel (auto when Triton imports, triton). triton on the CPU runs
    Triton's interpreter, which only TRITON_INTERPRET=1 enables (tests); otherwise the CPU keeps its
    own choice and says so once, so a run on CPU tensors with runtime.gru_kernel=triton is never
    silently timed as the GPU kernel."""
    mode = _state["mode"]
    if mode == "torch":
        return None
    if device_type == "cpu":
        if mode == "triton" and os.environ.get("TRITON_INTERPRET") == "1":
            return _triton()
        if mode == "triton" and not _state["warned_cpu_triton"]:
            _state["warned_cpu_triton"] = True
            log.warning(
                "runtime.gru_kernel=triton runs on a GPU; these CPU tensors use the CPU's own GRU "
                "recurrence (%s); TRITON_INTERPRET=1 runs the Triton kernel in its (slow) "
                "interpreter",
                "fused" if fused_gru() is not None else "pure torch",
            )
        return fused_gru()
    if device_type == "cuda" and mode in ("auto", "triton"):
        return _triton()
    return None


def fused_gru() -> ModuleType | None:
    """The compiled kernel module, or None when the mode is torch or it cannot be built (warned
    once)."""
    if _state["mode"] == "torch":
        return None
    if not _state["tried"]:
        with _lock:
            if not _state["tried"]:
                try:
                    _state["capability"] = cpu_capability()
                    _state["module"] = _build()
                # any build failure means the pure-torch path, never a failed run
                except Exception as exc:
                    _state["error"] = f"{type(exc).__name__}: {str(exc).strip()[-500:]}"
                    log.warning(
                        "fused GRU kernel unavailable, using the pure-torch GRU (slower): %s",
                        _state["error"],
                    )
                _state["tried"] = True
    return _state["module"]


def status() -> dict:
    """What this process runs: the mode, whether the fused kernel is in use, and why not."""
    module = fused_gru()
    capability = _state["capability"] if module is not None else None
    return {
        "gru_kernel": _state["mode"],
        "fused_gru": module is not None,
        "capability": capability,
        "build_dir": str(build_dir(capability)) if capability else None,
        "error": _state["error"],
    }
