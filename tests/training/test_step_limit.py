"""A client's step limit (the virtual clock's partial work, `ClientData.step_limit`): on the stacked
and the sequential path the update is the client's first s local steps of its own batch order, as a
plain loop of s SGD steps computes it."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from algorithm_harness import LR, batches, build, call, clients, max_diff, sgd_step
from fedac.algorithms.fedavg import FedAvg
from fedac.engine.execution import run_clients

pytestmark = pytest.mark.usefixtures("one_thread")


def plain_steps(algo, payload: dict, client, steps: int) -> dict:
    """`steps` SGD steps of cross-entropy from `payload` on the client's first batches (round
    1)."""
    model = algo.scratch_model(algo.cfg.model.name)
    params = {n: v.detach() for n, v in payload.items()}
    for idx in list(batches(algo, client, 1))[:steps]:
        live = {n: v.clone().requires_grad_(True) for n, v in params.items()}
        loss = F.cross_entropy(call(model, live, client.x[idx]), client.y[idx])
        grads = dict(zip(live, torch.autograd.grad(loss, list(live.values()))))
        params = sgd_step(params, grads, LR)
    return params


@pytest.mark.parametrize("execution", ["cohort", "sequential"])
def test_a_step_limit_trains_the_first_steps_only(execution):
    algo = build(FedAvg, "crnn_tiny", execution)
    data = clients()  # 11, 7 and 4 clips: 6, 4 and 2 steps of 4 over two epochs
    limited = [replace(data[0], step_limit=2), data[1], replace(data[2], step_limit=1)]
    payload = algo.broadcast(algo.init_server())
    results = run_clients(algo, payload, [None] * 3, limited, 1, algo.cfg.seed)
    # (float32 rounding of a few steps; the stacked CRNN is hand-written)
    assert max_diff(results[0].upload, plain_steps(algo, payload, data[0], 2)) <= 1e-5
    assert max_diff(results[1].upload, plain_steps(algo, payload, data[1], 4)) <= 1e-5
    assert max_diff(results[2].upload, plain_steps(algo, payload, data[2], 1)) <= 1e-5
    full = run_clients(algo, payload, [None], [data[0]], 1, algo.cfg.seed)[0]
    assert max_diff(full.upload, results[0].upload) > 1e-4  # the limit cut real work
