"""How a GPU's memory is shared: how many clients one stacked chunk holds (`runtime.cohort_chunk`;
0, the default, is auto), and whether the clients' data and models stay on the device
(`runtime.client_memory`).

On the CPU, auto is 16 clients and training/schedule.py's cost model cuts the chunks: the stacked
step's tensors then stay in cache, and 16 was the fastest size measured on two cores
(benchmarks/README.md). A GPU wants the opposite: a stacked step costs about the same launches
whether it holds 16 clients or 500, so the fewer chunks a round has, the faster it runs. There auto
packs as many clients into a chunk as fit in the free memory:

1. The first chunk of an architecture is a probe of `PROBE_CLIENTS` clients (the round's largest, so
   the widest batches and most data). The CUDA allocator's peak over its construction and training,
   less what was allocated before, divided by its clients, is the memory one client of a chunk
   needs: its data copy, stacked parameters, gradients, momentum, one step's activations and its
   upload.
2. Every later chunk takes as many clients as `MEMORY_FRACTION` of the memory free at that moment
   allows (the CUDA driver's free memory plus what torch's caching allocator holds unused), so the
   round's earlier uploads, which stay on the device, are counted as they accumulate. Over several
   devices (`runtime.devices`) a chunk takes at most an equal share of the round's clients per
   device, so every device gets one.

The measurement is kept for the run, per architecture (the probe runs once, in the first round).
Chunking does not change the numbers (every client's computation in a stacked step is its own), so
the size is chosen on speed and memory alone. A fixed `runtime.cohort_chunk` > 0 is honoured
everywhere.

`client_home`: the federation's client data and personalized models (FedMLAC keeps one model per
client: 2,618 at GSC scale) stay resident on the GPU when they fit in `RESIDENT_FRACTION` of its
free memory, else they live in page-locked host memory and each round copies its cohort in and the
updated models out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch

CPU_CHUNK = 16
"""Auto's chunk on the CPU (the size measured fastest on two cores: benchmarks/README.md)."""
PROBE_CLIENTS = 8
"""Clients in the chunk whose memory is measured on a GPU (large enough to average over, small
enough to fit on any card that holds the run)."""
MEMORY_FRACTION = 0.8
"""Share of the free GPU memory a chunk may take: the rest absorbs the allocator's fragmentation and
the memory a chunk's peak briefly exceeds its average per client."""


RESIDENT_FRACTION = 0.5
"""Share of the free GPU memory the clients' data and models may take resident (the rest: the
chunks)."""


class MemoryGauge(Protocol):
    """What packing reads of a device's memory, in bytes (the CUDA allocator's counters; tests fake
    it)."""

    def free(self) -> int:
        """Memory a new allocation can still take."""

    def begin(self) -> int:
        """Start a peak measurement; returns the memory allocated now."""

    def peak(self) -> int:
        """The most memory allocated at once since `begin`."""


class CudaGauge:
    def __init__(self, device: torch.device):
        self.device = device

    def free(self) -> int:
        driver_free, _ = torch.cuda.mem_get_info(self.device)
        cached = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
        return int(driver_free + cached)

    def begin(self) -> int:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        return int(torch.cuda.memory_allocated(self.device))

    def peak(self) -> int:
        torch.cuda.synchronize(self.device)
        return int(torch.cuda.max_memory_allocated(self.device))


class Packing:
    """One run's chunk sizing on one device: `runtime.cohort_chunk` and, for auto on a GPU, the
    memory per client measured by each architecture's probe chunk."""

    def __init__(
        self, chunk: int, device: torch.device, gauge: MemoryGauge | None = None, spread: int = 1
    ):
        self.chunk = chunk
        self.device = device
        #: Devices the chunks are spread over (`runtime.devices`): a round's clients are shared out
        #: among them.
        self.spread = spread
        self.gauge = (
            gauge if gauge is not None else (CudaGauge(device) if device.type == "cuda" else None)
        )
        #: Measured bytes per client of a chunk, per architecture (kept for the run).
        self.bytes_per_client: dict[str, float] = {}
        #: Clients in each chunk the last `by_memory` call yielded (what benchmarks and tests read).
        self.last_sizes: list[int] = []

    @property
    def by_memory(self) -> bool:
        """True when chunks are sized from the device's free memory (auto on a GPU)."""
        return self.chunk == 0 and self.gauge is not None

    @property
    def fixed_chunk(self) -> int:
        """The cost model's cap on clients per chunk (a fixed setting, or auto's CPU size)."""
        return self.chunk if self.chunk > 0 else CPU_CHUNK

    def probing(self, key: str) -> bool:
        """True while architecture `key`'s next chunk is the probe (its memory not measured yet)."""
        return self.by_memory and key not in self.bytes_per_client

    def capacity(self, key: str) -> int:
        """Clients of architecture `key` the next chunk can hold, from the memory free now."""
        assert self.gauge is not None
        return max(1, int(self.gauge.free() * MEMORY_FRACTION / self.bytes_per_client[key]))

    def chunks(
        self, order: Sequence[int], key: str, build: Callable[[list[int]], Any]
    ) -> Iterator[Any]:
        """`build(clients)` for consecutive slices of `order` (largest clients first), each as large
        as the memory allows; the first slice of an unmeasured architecture is the probe. A
        generator: the caller trains each chunk before asking for the next, so the probe's peak
        covers its training."""
        assert self.gauge is not None
        self.last_sizes = []
        start, share = 0, 0
        while start < len(order):
            if key not in self.bytes_per_client:
                picked = list(order[start : start + PROBE_CLIENTS])
                before = self.gauge.begin()
                yield build(picked)
                self.bytes_per_client[key] = max(1.0, (self.gauge.peak() - before) / len(picked))
            else:
                # each device an equal part
                share = share or -(-(len(order) - start) // self.spread)
                picked = list(order[start : start + min(share, self.capacity(key))])
                yield build(picked)
            self.last_sizes.append(len(picked))
            start += len(picked)


def client_home(
    setting: str,
    device: torch.device,
    resident_bytes: Callable[[], int],
    gauge: MemoryGauge | None = None,
) -> torch.device:
    """Where clients' data and personalized models live between rounds (`runtime.client_memory`):
    `device`, or the host. auto asks `resident_bytes()` (the data and every client's model) only on
    a GPU."""
    if setting == "device" or device.type == "cpu":
        return device
    if setting == "host":
        return torch.device("cpu")
    gauge = gauge if gauge is not None else CudaGauge(device)
    return device if resident_bytes() <= gauge.free() * RESIDENT_FRACTION else torch.device("cpu")
