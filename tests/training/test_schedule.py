"""Chunk planning (training/schedule.py, training/stacking.py `plan_chunks`): every client once, in
consecutive size order, cut where padding costs more than a chunk, and balanced over workers."""

from __future__ import annotations

import pytest
from test_cohort import make_clients

from fedac.config import load_config
from fedac.training.schedule import CHUNK_ROWS, STEP_ROWS, batch_sizes, split_by_cost
from fedac.training.stacking import plan_chunks

# one round of the paper schedule on the Speech Commands stand-in (48 clients, a long tail)
PAPER_ROUND = [
    139,
    86,
    83,
    79,
    78,
    55,
    44,
    32,
    32,
    32,
    29,
    26,
    25,
    24,
    24,
    24,
    22,
    22,
    20,
    20,
    19,
    19,
    19,
    18,
    17,
    17,
    17,
    17,
    17,
    16,
    16,
    16,
    16,
    16,
    16,
    15,
    13,
    13,
    12,
    12,
    12,
    12,
    9,
    9,
    8,
    8,
    7,
    6,
]


def cost(sizes, bs=16, epochs=1):
    """The module's cost model, written out directly over the padded schedule."""
    steps = [batch_sizes(n, bs, epochs) for n in sizes]
    total = CHUNK_ROWS
    for s in range(max(len(b) for b in steps)):
        live = [b[s] for b in steps if len(b) > s]
        total += STEP_ROWS + len(live) * max(live)
    return total


def test_batch_sizes_follow_batch_indices():
    assert batch_sizes(37, 16, 1) == [16, 16, 5]
    assert batch_sizes(32, 16, 2) == [16, 16, 16, 16]
    assert batch_sizes(5, 16, 2) == [5, 5]


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_split_by_cost_covers_every_client_once_in_order_within_the_chunk_limit(workers):
    ranges = split_by_cost(PAPER_ROUND, 16, 1, 16, workers)
    assert [i for r, _ in ranges for i in r] == list(range(len(PAPER_ROUND)))
    assert all(1 <= len(r) <= 16 for r, _ in ranges)
    for r, c in ranges:
        assert c == pytest.approx(cost([PAPER_ROUND[i] for i in r]))


def test_one_worker_cuts_only_where_padding_costs_more_than_a_chunk():
    assert len(split_by_cost([40] * 10, 16, 1, 16, 1)) == 1  # equal clients: one chunk
    # four 3-step clients and twelve 1-step clients of 5 samples: apart, the small ones are not
    # padded to 16
    ranges = split_by_cost([48] * 4 + [5] * 12, 16, 1, 16, 1)
    assert [len(r) for r, _ in ranges] == [4, 12]
    assert sum(c for _, c in ranges) < cost([48] * 4 + [5] * 12)
    assert sorted(len(r) for r, _ in split_by_cost([40] * 40, 16, 1, 16, 1)) == [8, 16, 16]


def test_workers_get_even_shares_and_the_long_tail_is_split():
    one = split_by_cost(PAPER_ROUND, 16, 1, 16, 1)
    two = split_by_cost(PAPER_ROUND, 16, 1, 16, 2)
    # costliest first on two workers (what run_chunks does): both finish within 15 % of an even
    # split
    loads = [0.0, 0.0]
    for c in sorted((c for _, c in two), reverse=True):
        loads[loads.index(min(loads))] += c
    assert max(loads) <= 1.15 * sum(loads) / 2
    # one worker keeps the largest clients (the long tail) in one big chunk; two split it
    assert max(c for _, c in two) < 0.7 * max(c for _, c in one)


def test_plan_chunks_yields_costliest_first_with_every_position_once():
    clients = make_clients([37, 16, 5, 23, 40, 9, 70, 3])
    cfg = load_config(
        overrides=["train.batch_size=16", "train.local_epochs=1", "train.cohort_workers=2"]
    ).train
    chunks = list(plan_chunks(clients, list(range(10, 18)), cfg, round_idx=1, seed=0))
    assert sorted(p for c in chunks for p in c.positions) == list(range(10, 18))
    costs = [cost([d.num_samples for d in c.datas]) for c in chunks]
    assert costs == sorted(costs, reverse=True) and len(chunks) > 1
    for c in chunks:  # each chunk sorted largest first, so active clients stay a prefix
        sizes = [d.num_samples for d in c.datas]
        assert sizes == sorted(sizes, reverse=True)
