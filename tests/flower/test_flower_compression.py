"""Compressed uploads through the Flower app (compression.*): each node sends the wire form of its
update (rules/compression.py `encode`, its error-feedback residual kept in the node's context), the
strategy decodes it, and the run ends where the simulator's does, with the same byte counts; what a
deployment cannot carry is refused at start."""

from __future__ import annotations

import csv

import pytest
import torch

pytest.importorskip(
    "flwr", reason="flwr is not installed (pip install 'flwr>=1.41,<1.42'); Flower tests skipped"
)

# (dataset and task_identity are fixtures; task_identity gives the messages a ServerApp's identity)
from test_flower import dataset, nodes_for, run_config, run_local  # noqa: F401,E402
from test_flower_robust import task_identity  # noqa: F401,E402

from fedac.config import load_config  # noqa: E402
from fedac.engine.simulator import Simulator  # noqa: E402
from fedac.errors import ConfigError  # noqa: E402
from fedac.flower import clientapp  # noqa: E402
from fedac.flower.settings import fedac_config  # noqa: E402
from fedac.rules.compression import WIRE  # noqa: E402
from fedac.settings.compatibility import Deployment, check  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def upload_bytes(run_dir) -> list[float]:
    with open(run_dir / "metrics.csv") as handle:
        return [float(row["upload_bytes"]) for row in csv.DictReader(handle)]


@pytest.mark.parametrize(
    "sets",
    [
        "compression.method=topk;compression.ratio=0.1",
        "compression.method=qsgd;compression.levels=4;compression.error_feedback=false",
        "compression.method=int8",
    ],
)
def test_nodes_send_the_compressed_form_and_the_run_equals_the_simulator(
    dataset, tmp_path, monkeypatch, sets
):
    sent = []
    real = clientapp.compressed
    monkeypatch.setattr(clientapp, "compressed", lambda *args: sent.append(real(*args)) or sent[-1])
    settings = {
        "algorithm": "fedavg",
        "rounds": 2,
        "poll-interval": 0.01,
        "num_clients": 3,
        "min-nodes": 3,
    }
    settings["fedac-set"] = (
        run_config(dataset, "x", num_clients=3)["fedac-set"] + ";train.eval_every=1;" + sets
    )
    results, grid, config = run_local(dataset, tmp_path, nodes_for(3), **settings)
    sim = Simulator(fedac_config(config), tmp_path / "sim", progress=False)
    expected = sim.run()
    # every node sent bytes, not its model
    assert len(sent) == 6
    for wire in sent:
        compressed = {k: v for k, v in wire.items() if k.startswith(WIRE)}
        assert compressed and all(v.dtype == torch.uint8 for v in compressed.values())
    flower_params = torch.load(tmp_path / "run" / "server_state.pt")["params"]
    for name, value in sim.state.server["params"].items():
        torch.testing.assert_close(flower_params[name], value, rtol=0, atol=1e-5, msg=name)
    assert results["final"]["accuracy"] == pytest.approx(expected["final"]["accuracy"], abs=1e-6)
    # the bytes the nodes sent are the bytes the simulator counts
    assert upload_bytes(tmp_path / "run") == upload_bytes(tmp_path / "sim")
    feedback = "error_feedback=false" not in sets
    kept = [c for c in grid.contexts.values() if clientapp.RESIDUAL in c.state.array_records]
    assert len(kept) == (3 if feedback else 0)  # each node keeps its own residual


@pytest.mark.parametrize(
    "sets, strategy, message",
    [
        (["dp.mode=client"], "fedac", "dp.mode=client clips each update before it is compressed"),
        (["attack.kind=scale", "attack.fraction=0.5"], "fedac", "poisons an upload before"),
        ([], "flower", "needs the fedac strategy"),
        (["compression.download=true"], "fedac", "the ServerApp sends the broadcast dense"),
    ],
)
def test_what_a_deployment_cannot_compress_is_refused(sets, strategy, message):
    # int8, not topk, for the broadcast: a sparsifier cannot compress a model anywhere
    method = "int8" if "compression.download=true" in sets else "topk"
    cfg = load_config(overrides=[f"compression.method={method}", *sets])
    with pytest.raises(ConfigError, match=message):
        check(cfg, Deployment(strategy=strategy))


@pytest.mark.parametrize(
    "method, message",
    [
        ("topk", "masked sparse updates do not add up under SecAgg"),
        ("randk", "masked sparse updates do not add up under SecAgg"),
        ("int8", "at its own scale or norm, which SecAgg"),
        ("bf16", "at its own scale or norm, which SecAgg"),
    ],
)
def test_secagg_refuses_compressed_uploads(method, message):
    from types import SimpleNamespace

    from fedac.flower.secagg import refuse_unsupported

    settings = SimpleNamespace(strategy="fedac", data_mode="full")
    refuse_unsupported(load_config(), settings)  # (the same settings without compression pass)
    with pytest.raises(ConfigError, match=message):
        refuse_unsupported(load_config(overrides=[f"compression.method={method}"]), settings)
