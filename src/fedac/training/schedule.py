"""Which clients train together: cutting one architecture's clients into cohort chunks
(training/stacking.py).

A chunk trains its clients as one stacked computation, step by step; the clients still training at a
step are padded to the step's widest batch. What a chunk costs is therefore about

    CHUNK_ROWS + sum over its steps of (STEP_ROWS + active clients x width)

in units of one padded sample's forward and backward pass (the fixed costs: stacking and unstacking
parameters once per chunk, dispatching one stacked step). Clients are sorted by size (largest first)
and cut into consecutive chunks by a dynamic program that minimises the summed cost: a cut is made
where the padding it saves (clients of fewer steps, or smaller last batches, than their neighbours)
outweighs a chunk's fixed costs. With several cohort workers each chunk is also kept under an equal
share of the round's work, so that the worker threads, taking the costliest chunks first, finish
together: the long tail of a round (a few clients with many more steps than the rest) no longer sits
in one chunk of 16 that sets the round's time while the other core idles.
"""

from __future__ import annotations

from collections.abc import Sequence

STEP_ROWS = 4.0
"""Fixed cost of one stacked step in padded rows: a FedMLAC step (CRNN-Base + CRNN-Lite, batch 16)
of one client took about 1.2x its per-client time at 16 clients, i.e. ~0.2 x 16 rows (fused GRU)."""
CHUNK_ROWS = 8.0
"""Fixed cost of one chunk in padded rows (broadcasting, stacking and unstacking parameters)."""
SHARES_PER_WORKER = 2
"""With W workers a chunk holds at most 1 / (W x this) of the round's work (or one client, if more),
so the costliest-first queue can even out the workers' finishing times."""


def batch_sizes(samples: int, batch_size: int, epochs: int) -> list[int]:
    """A client's batch size at each of its steps (`local.batch_indices` keeps each epoch's last
    partial batch)."""
    full, rest = divmod(samples, batch_size)
    return ([batch_size] * full + ([rest] if rest else [])) * epochs


def step_sizes(samples: int, cfg) -> list[int]:
    """A client's batch size at each step of one local update under `cfg` (a TrainConfig): epochs
    (`batch_sizes`), or `local_steps` steps of a loader reshuffled whenever it runs out
    (`local.cycling_batches`)."""
    if cfg.local_steps <= 0:
        return batch_sizes(samples, cfg.batch_size, cfg.local_epochs)
    one_pass = batch_sizes(samples, cfg.batch_size, 1)
    if not one_pass:
        return []
    return (one_pass * -(-cfg.local_steps // len(one_pass)))[: cfg.local_steps]


def split_by_cost(
    sizes: Sequence[int], batch_size: int, epochs: int, max_clients: int, workers: int
) -> list[tuple[range, float]]:
    """Consecutive ranges of `sizes` (sample counts, sorted largest first) as chunks of at most
    `max_clients` clients, minimising the summed cost (module docstring) under the per-chunk share;
    each with its modelled cost."""
    n = len(sizes)
    if n == 0:
        return []
    steps = [batch_sizes(s, batch_size, epochs) for s in sizes]
    alone = [CHUNK_ROWS + sum(STEP_ROWS + b for b in bs) for bs in steps]
    share = (
        max(max(alone), sum(alone) / (workers * SHARES_PER_WORKER)) if workers > 1 else float("inf")
    )
    best = [0.0] + [float("inf")] * n
    cut = [0] * (n + 1)
    cost_of = [0.0] * (n + 1)  # the cost of the last chunk of the best plan up to each client
    # push form: extend a chunk from `start`, keeping its step widths incrementally
    for start in range(n):
        widths: list[int] = []
        active: list[int] = []
        for stop in range(start + 1, min(n, start + max_clients) + 1):
            # clients are sorted, so never more steps than the first
            for s, b in enumerate(steps[stop - 1]):
                if s == len(widths):
                    widths.append(b)
                    active.append(1)
                else:
                    widths[s] = max(widths[s], b)
                    active[s] += 1
            cost = CHUNK_ROWS + sum(STEP_ROWS + a * w for a, w in zip(active, widths))
            if cost > share and stop - start > 1:
                break  # costs only grow with more clients
            if best[start] + cost < best[stop]:
                best[stop], cut[stop], cost_of[stop] = best[start] + cost, start, cost
    ranges = []
    stop = n
    while stop > 0:
        ranges.append((range(cut[stop], stop), cost_of[stop]))
        stop = cut[stop]
    return ranges[::-1]
