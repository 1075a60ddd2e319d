"""FedMMD (algorithms/fedmmd.py): the 5-kernel RBF MMD on a hand case, FedAvg as its lambda = 0
case, the effect of the weight, and the CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch

from fedac.algorithms import build_algorithm
from fedac.algorithms.base import ClientData, Task
from fedac.algorithms.fedmmd import mmd_rbf
from fedac.cli import main
from fedac.config import load_config
from fedac.data.waveform import Padded
from fedac.seeding import torch_generator
from helpers import tiny_run

pytestmark = pytest.mark.usefixtures("one_thread")


def test_mmd_on_a_hand_case():
    # Z = (0, 1, 0, 2): squared distances sum to 22 over 12 off-diagonal pairs -> b = 11/6, / 2^2 =
    # 11/24. The blocks sum to 2K(0) - 2K(1) over 4 entries, K(d) = sum_i exp(-d / (11/24 * 2^i)),
    # K(0) = 5.
    source, target = torch.tensor([[0.0], [1.0]]), torch.tensor([[0.0], [2.0]])
    k1 = sum(math.exp(-1.0 / (11 / 24 * 2**i)) for i in range(5))
    assert float(mmd_rbf(source, target)) == pytest.approx((5 - k1) / 2, rel=1e-6)


def test_mmd_is_zero_for_equal_batches_and_symmetric():
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(6, 4, generator=gen), torch.randn(6, 4, generator=gen) + 1
    assert float(mmd_rbf(a, a)) == pytest.approx(0.0, abs=1e-7)
    assert float(mmd_rbf(a, b)) == pytest.approx(float(mmd_rbf(b, a)), rel=1e-6)
    assert float(mmd_rbf(a, b)) > float(mmd_rbf(a, a + 0.01))


def make(algorithm, **settings):
    settings = {
        "algorithm": algorithm,
        "model.name": "crnn_tiny",
        "train.local_epochs": 2,
        **settings,
    }
    cfg = load_config(overrides=[f"{k}={v}" for k, v in settings.items()])
    return build_algorithm(cfg, Task(8, 5, ["c0"], [[4] * 5]))


def data():
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(20, 8, 10, generator=gen), torch.randint(0, 5, (20,), generator=gen)
    return ClientData("c0", x, y, x[:0], y[:0])


def update(algo, payload):
    torch.manual_seed(3)  # dropout masks, as the engine seeds them per client
    return algo.client_update(payload, None, data(), 1, torch_generator(0, "b")).upload


def test_weight_zero_is_fedavg_and_the_weight_changes_the_update():
    payload = make("fedavg").init_server()["params"]
    fedavg = update(make("fedavg"), payload)
    zero = update(make("fedmmd", **{"fedmmd.weight": 0}), payload)
    assert all(torch.equal(fedavg[k], zero[k]) for k in fedavg)
    mmd = update(make("fedmmd", **{"fedmmd.weight": 10.0}), payload)
    assert not torch.allclose(fedavg["head.weight"], mmd["head.weight"])
    torch.manual_seed(3)
    metrics = (
        make("fedmmd").client_update(payload, None, data(), 1, torch_generator(0, "b")).metrics
    )
    assert metrics["mmd"] > 0 and metrics["steps"] == 4  # 2 epochs of ceil(20 / 16) batches


def test_weight_zero_is_fedavg_on_an_ssl_encoder_with_a_head_norm():
    """An SSL model standardises its pooled vector before the head (`model.head_norm`): FedMMD's
    cross-entropy reaches the logits through models/base.py `classify`, so lambda = 0 still trains
    what FedAvg trains (the head alone would skip the norm)."""
    settings = {"model.name": "w2v2_tiny", "model.head_norm": "true", "model.dropout": 0.0}
    task = Task(64, 4, ["c0"], [[5] * 4])

    def ssl(algorithm, **more):
        cfg = load_config(
            overrides=[
                f"{k}={v}"
                for k, v in {
                    "algorithm": algorithm,
                    **settings,
                    "train.local_epochs": 1,
                    **more,
                }.items()
            ]
        )
        return build_algorithm(cfg, task)

    gen = torch.Generator().manual_seed(1)
    x = Padded(torch.randn(20, 30, 64, generator=gen), torch.randint(10, 31, (20,), generator=gen))
    y = torch.randint(0, 4, (20,), generator=gen)
    client = ClientData("c0", x, y, x[:0], y[:0])
    payload = ssl("fedavg").init_server()["params"]

    def trained(algo):
        torch.manual_seed(3)
        return algo.client_update(payload, None, client, 1, torch_generator(0, "b")).upload

    fedavg, zero = trained(ssl("fedavg")), trained(ssl("fedmmd", **{"fedmmd.weight": 0}))
    assert any(k.startswith("norm.") for k in fedavg)
    assert all(torch.equal(fedavg[k], zero[k]) for k in fedavg)


def test_fedac_run_fedmmd(gsc_root, tmp_path):
    args = [
        "run",
        "--algorithm",
        "fedmmd",
        "--rounds",
        "1",
        "--out",
        str(tmp_path / "run"),
        "--quiet",
    ]
    for key, value in tiny_run(gsc_root, None).items():  # the session's FEDAC_HOME cache
        args += ["--set", f"{key}={value}"]
    assert main(args) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["algorithm"] == "fedmmd" and 0 <= results["final"]["accuracy"] <= 1
