"""One run's runtime: where and how it computes, resolved once from the `runtime` settings and
passed down.

`Runtime` holds the device (`runtime.device`), the devices the stacked path spreads over
(`runtime.devices`), the arithmetic (`runtime.precision`, `runtime.deterministic`), the packing
settings (`runtime.cohort_chunk`, `runtime.client_memory`) and the worker threads
(`runtime.cohort_workers`). A driver (engine/) builds it with `start_runtime`, which also applies
the process-wide settings (torch threads, the allocator, the GRU kernel, then precision and
determinism) in that order, since the auto worker count reads the threads. The driver hands it to
the algorithm and to the data builders, so no layer reads `runtime.device` again. Packing's
measurements per architecture (training/packing.py) and where the clients' data lives
(`client_home`, which needs the data's size) stay outside: they change or are known only later.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
from dataclasses import dataclass

import torch

from fedac.config import RuntimeConfig
from fedac.kernels import set_gru_kernel
from fedac.training.device import (
    autocast,
    check_precision,
    configure_precision,
    device_name,
    resolve_device,
    resolve_devices,
)
from fedac.training.stacking import cohort_workers

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (glibc malloc.h)
_KEEP_LIMIT = 1 << 30


@dataclass(frozen=True)
class Runtime:
    """Where and how one run computes (see the module's docstring)."""

    device: torch.device
    #: Where the stacked path's stacked chunks train (`runtime.devices`; by default `device` alone).
    devices: tuple[torch.device, ...]
    precision: str
    deterministic: bool
    #: `runtime.cohort_chunk` (0: sized by the cost model, or by free memory on a GPU).
    cohort_chunk: int
    #: `runtime.client_memory`: device, host or auto (engine/simulator.py decides auto once the data
    #: is built).
    client_memory: str
    #: Worker threads for a cohort's chunks and a round's reports (`runtime.cohort_workers`, 0
    #: resolved).
    workers: int

    @classmethod
    def resolve(cls, runtime: RuntimeConfig, device: torch.device | None = None) -> Runtime:
        """The runtime the `runtime` settings name, checked (a missing GPU or tf32 on the CPU fails
        here, naming the setting); nothing process-wide changes. `device`: one already resolved (a
        Flower node's)."""
        device = device if device is not None else resolve_device(runtime.device)
        check_precision(runtime.precision, device)
        return cls(
            device,
            tuple(resolve_devices(runtime.devices, device)),
            runtime.precision,
            runtime.deterministic,
            runtime.cohort_chunk,
            runtime.client_memory,
            cohort_workers(runtime, device),
        )

    @property
    def name(self) -> str:
        """What results.json and a run's first line say (`cpu`, `cuda:0 (NVIDIA H100 80GB
        HBM3)`)."""
        return device_name(self.device)

    def autocast(self) -> contextlib.AbstractContextManager:
        """The forward passes' arithmetic on this device (training/device.py `autocast`)."""
        return autocast(self.precision, self.device)


def start_runtime(settings: RuntimeConfig, device: torch.device | None = None) -> Runtime:
    """The process settings (`configure_process`), then the runtime, then its precision and
    determinism applied process-wide: what a driver calls once, before it builds data or models."""
    configure_process(settings)
    runtime = Runtime.resolve(settings, device)
    configure_precision(runtime.precision, runtime.device, runtime.deterministic)
    return runtime


def configure_process(cfg: RuntimeConfig) -> None:
    """`runtime.threads` torch intra-op threads, `runtime.gru_kernel` and, with
    `runtime.keep_freed_memory`, `keep_freed_memory()`."""
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    if cfg.keep_freed_memory:
        keep_freed_memory()
    set_gru_kernel(cfg.gru_kernel)


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to serve blocks up to 1 GiB from its heap and to keep freed memory for
    reuse.

    A training step allocates and frees the same multi-megabyte activation buffers every time. By
    default glibc maps each such block afresh and unmaps it when freed, so every step's buffers
    fault their pages in again and the kernel zeroes them: 0.2-0.3 s of system time in a 3.9 s
    FedMLAC cohort round (500 clients, 100 per round). Keeping the memory made that round 7-9 %
    faster in alternating runs, with the same peak RSS (the working set is reused, not grown).
    Returns False where the C library is not glibc (nothing changes there)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = libc.mallopt if libc is not None else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None:
        log.debug("no glibc mallopt: allocator left as it is")
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _KEEP_LIMIT)) and bool(
        mallopt(_M_TRIM_THRESHOLD, _KEEP_LIMIT)
    )
