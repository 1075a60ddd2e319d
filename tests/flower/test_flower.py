"""fedac on Flower (issue 5): a live SuperLink with SuperNodes on loopback, equivalence with the
simulator, a SuperNode killed mid-run, and fedac's server optimizers against Flower's strategies of
the same name.

The process tests start `flower-superlink`, `flower-supernode` and `flwr run` themselves (by PID,
output in log files printed on failure) and wait for events (a log line, a reply, a process exit),
not for short timeouts a loaded machine could miss; `flower_helpers.PROCESS_WAIT` only guards
against a hang. They are slow (a federation's start-up, training in subprocesses) and skip only when
flwr is not importable; it is a fedac dependency, so CI runs them.
"""

from __future__ import annotations

import json
import math
import os
import re
import time

import pytest
import torch

flwr = pytest.importorskip(
    "flwr", reason="flwr is not installed (pip install 'flwr>=1.41,<1.42'); Flower tests skipped"
)

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict  # noqa: E402

from fedac.algorithms import build_algorithm  # noqa: E402
from fedac.algorithms.base import Task  # noqa: E402
from fedac.config import load_config  # noqa: E402
from fedac.engine.data import build_federated_data  # noqa: E402
from fedac.engine.simulator import (
    Simulator,  # noqa: E402
    sample_cohort,  # noqa: E402
)
from fedac.errors import ConfigError  # noqa: E402
from fedac.flower import transport  # noqa: E402
from fedac.flower.settings import (
    apply_node_settings,
    deployment_settings,
    fedac_config,
    node_settings,
    split_overrides,
)  # noqa: E402,E501
from fedac.flower.strategy import FlowerRunError, flower_adam_lr, flower_strategy  # noqa: E402
from fedac.rules.aggregation import weighted_mean  # noqa: E402
from flower_helpers import (
    PROCESS_WAIT,
    Federation,
    LocalGrid,
    assert_same_metrics,
    read_rows,  # noqa: E402
    use_task_identity,
)
from gsc_fixture import make_gsc_tree  # noqa: E402

NUM_NODES = 3
# A live run's round timeout: a node that has not answered by then is dropped, so it is far above
# what a round takes on a loaded machine (a dead node is reported by the SuperLink's heartbeat check
# instead).
ROUND_TIMEOUT = 600.0


# --- fixtures -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A tiny GSC tree (5 speakers, 1 clip per word) split IID over 3 clients, features cached once
    here so the ServerApp and the ClientApps only read the cache."""
    root = make_gsc_tree(tmp_path_factory.mktemp("flower_gsc"), speakers=5, clips=1)
    cache = tmp_path_factory.mktemp("flower_cache")
    return root, cache


def run_config(dataset, run_dir, num_clients=NUM_NODES, **extra):
    root, cache = dataset
    settings = {
        "data.root": root,
        "data.cache_dir": cache,
        "data.partition": "iid",
        "data.num_clients": num_clients,
        "model.name": "crnn_tiny",
        "model.client_model": "crnn_tiny",
        "fedmlac.plugin_model": "crnn_tiny",
        "train.local_epochs": 1,
        "train.batch_size": 16,
        "train.momentum": 0.0,
        "runtime.threads": 1,
        "train.eval_every": 2,
    }
    config = {
        "algorithm": "fedmlac",
        "rounds": 2,
        "fraction": 1.0,
        "seed": 3,
        "lr": 0.05,
        "fedac-set": ";".join(f"{k}={v}" for k, v in settings.items()),
        "run-dir": str(run_dir),
        "min-nodes": NUM_NODES,
        "round-timeout": ROUND_TIMEOUT,
        "node-wait": PROCESS_WAIT,
        "poll-interval": 0.2,
    }
    config.update(extra)
    return config


@pytest.fixture(scope="module")
def federation(tmp_path_factory, dataset):
    fed = Federation(tmp_path_factory.mktemp("federation"), NUM_NODES)
    # fill the feature cache
    build_federated_data(fedac_config(run_config(dataset, "unused")), progress=False)
    try:
        fed.start()
        yield fed
    finally:
        fed.stop()


@pytest.fixture(scope="module")
def fedmlac_run(federation, dataset, tmp_path_factory):
    """The 2-round FedMLAC deployment run, shared by the deployment and equivalence tests."""
    run_dir = tmp_path_factory.mktemp("flower_run") / "run"
    config = run_config(dataset, run_dir)
    started = time.perf_counter()
    output = federation.run(config, name="flwr-run-fedmlac")
    return {
        "config": config,
        "run_dir": run_dir,
        "output": output,
        "seconds": time.perf_counter() - started,
    }


# --- 1. live deployment ---------------------------------------------------------------------------


@pytest.mark.slow
def test_fedmlac_on_live_superlink_keeps_personalized_state_on_each_node(
    fedmlac_run, federation, dataset, capsys
):
    run_dir = fedmlac_run["run_dir"]
    try:
        results = json.loads((run_dir / "results.json").read_text())
        assert results["rounds"] == 2 and results["algorithm"] == "fedmlac"
        assert results["runtime"]["engine"] == "flower" and not results["runtime"]["dropped"]
        # named, as the simulator names its path
        assert results["execution"].startswith("sequential: ")
        assert {
            "accuracy",
            "personalized_accuracy_mean",
            "personalized_local_accuracy_mean",
        } <= set(results["final"])
        rows = read_rows(run_dir / "metrics.csv")
        assert [row["round"] for row in rows] == ["2"] and float(rows[0]["clients"]) == NUM_NODES
        assert (run_dir / "config.yaml").is_file() and (run_dir / "server_state.pt").is_file()

        log = json.loads((run_dir / "flower_clients.json").read_text())
        # Each partition-id ran on its own SuperNode, the one that registered with that id.
        nodes = {info["partition-id"]: int(node) for node, info in log["nodes"].items()}
        assert nodes == {k: federation.node_id(k) for k in range(NUM_NODES)}
        cfg = fedac_config(fedmlac_run["config"])
        data = build_federated_data(cfg, progress=False)
        algorithm = build_algorithm(cfg, data.task)
        first = {r["client"]: r for r in log["rounds"]["1"]}
        second = {r["client"]: r for r in log["rounds"]["2"]}
        assert sorted(first) == sorted(second) == [c.name for c in data.clients]
        for client in data.clients:
            r1, r2 = first[client.name], second[client.name]
            # Round 1 started from the fresh personalized model the simulator would create ...
            assert r1["state-round"] == 0
            assert r1["state-digest"] == transport.digest(algorithm.init_client_state(client.name))
            # ... and round 2 from exactly the model round 1 left on that node (context.state
            # persisted).
            assert (
                r2["state-round"] == 1
                and r2["state-digest"] == r1["new-state-digest"] != r1["state-digest"]
            )
            assert r1["node"] == r2["node"] == nodes[data.clients.index(client)]
        server_log = (run_dir / "server.log").read_text()
        for client in data.clients:
            assert f"round 2: client {client.name} trained from its state of round 1" in server_log
        # Only the Plug-in reached the server: its state holds the global (crnn_tiny) parameters,
        # nothing else.
        server_state = torch.load(run_dir / "server_state.pt")
        assert set(server_state) == {"params"}
        assert set(server_state["params"]) == set(algorithm.init_server()["params"])
    except AssertionError:
        print(federation.output())
        raise
    with capsys.disabled():
        print(
            "\n[flower] 2-round FedMLAC deployment run (flwr run wall time): "
            f"{fedmlac_run['seconds']:.1f} s"
        )


# --- 2. equivalence with the simulator ------------------------------------------------------------


@pytest.mark.slow
def test_flower_run_matches_the_simulator(fedmlac_run, tmp_path):
    cfg = fedac_config(fedmlac_run["config"])
    sim = Simulator(cfg, tmp_path / "sim", progress=False)
    expected = sim.run()
    flower_params = torch.load(fedmlac_run["run_dir"] / "server_state.pt")["params"]
    sim_params = sim.state.server["params"]
    assert list(flower_params) == list(sim_params)
    for name, value in sim_params.items():
        torch.testing.assert_close(
            flower_params[name], value, rtol=0, atol=1e-5, msg=f"Plug-in parameter {name}"
        )
    # The personalized models too: the nodes reported digests of theirs. Bit for bit, they equal the
    # simulator's sequential path (the ClientApp calls the same `train_client`); the simulator's
    # stacked path reorders float sums, so it is compared to 1e-5 above only through the
    # Plug-in.
    cfg.runtime.execution = "sequential"
    sequential = Simulator(cfg, tmp_path / "sequential", progress=False)
    sequential.run()
    log = json.loads((fedmlac_run["run_dir"] / "flower_clients.json").read_text())
    for report in log["rounds"]["2"]:
        assert report["new-state-digest"] == transport.digest(
            sequential.state.clients[report["client"]]
        )
    flower_results = json.loads((fedmlac_run["run_dir"] / "results.json").read_text())
    for key in (
        "accuracy",
        "macro_f1",
        "personalized_accuracy_mean",
        "personalized_local_accuracy_mean",
    ):
        assert flower_results["final"][key] == pytest.approx(expected["final"][key], abs=1e-6), key
    sim_row, flower_row = (
        read_rows(tmp_path / "sim" / "metrics.csv")[-1],
        read_rows(fedmlac_run["run_dir"] / "metrics.csv")[-1],
    )
    for key in ("clients", "train_loss", "val_accuracy", "local_accuracy", "lpa_trusted_fraction"):
        assert float(flower_row[key]) == pytest.approx(float(sim_row[key]), abs=1e-6), key


# --- 3. a SuperNode dies mid-run ------------------------------------------------------------------


@pytest.mark.slow
def test_run_completes_when_a_supernode_is_killed_mid_run(federation, dataset, tmp_path):
    """Runs on the module's federation after the FedMLAC run (saving a start-up) and kills node 2
    for good: it must stay the last test that uses `federation`."""
    fed, victim = federation, 2
    run_dir = tmp_path / "run"
    # min-nodes 2: the run goes on with two. The round ends on events, not on a timeout: the
    # survivors' replies, and the SuperLink's "node unavailable" error for the killed node once it
    # has missed its heartbeats (Flower: 2 x its 30 s interval). The round timeout (ROUND_TIMEOUT)
    # stays far above both, so a slow survivor on a loaded machine is waited for, never dropped.
    # FedAvg: no personalized models, so no evaluation exchange with the nodes (the test stays
    # short).
    config = run_config(dataset, run_dir, **{"algorithm": "fedavg", "min-nodes": 2})
    try:
        victim_id = fed.node_id(victim)
        proc, _ = fed.submit(config, name="flwr-run-fault")
        server_log = run_dir / "server.log"
        fed.wait_for(
            lambda: server_log.exists() and "round 2: training" in server_log.read_text(),
            PROCESS_WAIT,
            "round 2 to start",
        )
        fed.kill_node(victim)
        proc.wait(timeout=PROCESS_WAIT)
        assert proc.returncode == 0, "flwr run failed"
        results = json.loads((run_dir / "results.json").read_text())
        assert results["rounds"] == 2
        row = read_rows(run_dir / "metrics.csv")[-1]
        assert row["round"] == "2" and float(row["clients"]) == 2 and float(row["dropped"]) == 1
        text = server_log.read_text()
        assert re.search(
            rf"round 2: node {victim_id} \(client client00{victim}, partition-id {victim}\) "
            r"dropped out",
            text,
        )
        assert results["runtime"]["dropped"] == {
            "2": [f"node {victim_id} (client client00{victim}, partition-id {victim})"]
        }
        log = json.loads((run_dir / "flower_clients.json").read_text())
        assert sorted(r["client"] for r in log["rounds"]["1"]) == [
            "client000",
            "client001",
            "client002",
        ]
        assert sorted(r["client"] for r in log["rounds"]["2"]) == ["client000", "client001"]
    except BaseException:
        print(fed.output())
        raise


# --- the ServerApp and ClientApp in one process (LocalGrid: no SuperLink, no processes) -----------


def run_local(dataset, tmp_path, nodes, dead=(), **extra):
    """run_deployment on a LocalGrid whose nodes are ClientApp contexts; returns (results, grid, run
    config)."""
    from fedac.flower import clientapp, serverapp

    config = run_config(dataset, tmp_path / "run", **extra)
    grid = LocalGrid(clientapp.app, nodes, config)
    grid.dead = set(dead)
    cfg = fedac_config(config)
    cfg.out = str(tmp_path / "run")
    (tmp_path / "run").mkdir(parents=True, exist_ok=True)
    results = serverapp.run_deployment(grid, cfg, deployment_settings(config), tmp_path / "run")
    return results, grid, config


def nodes_for(count, num_partitions=None):
    return {
        100 + k: {"partition-id": k, "num-partitions": num_partitions or count}
        for k in range(count)
    }


@pytest.mark.parametrize(
    "algorithm, strategy, extra",
    [
        # personalized; LPA; node-side evaluation
        ("fedmlac", "fedac", {}),
        # fedac's FedAdam through the fedac strategy
        ("fedadam", "fedac", {}),
        ("fedyogi", "flower", {"fraction": 1.0}),  # Flower's own FedYogi
    ],
)
@pytest.mark.slow
def test_in_process_deployment_equals_the_simulator(dataset, tmp_path, algorithm, strategy, extra):
    """Partial participation (fraction 0.5 of 4 clients): the query round identifies the nodes and
    the cohorts are the simulator's, so the global model, the metrics and the personalized results
    agree."""
    settings = {
        "algorithm": algorithm,
        "strategy": strategy,
        "rounds": 3,
        "fraction": 0.5,
        "num_clients": 4,
        "min-nodes": 4,
        "poll-interval": 0.01,
        **extra,
    }
    settings["fedac-set"] = (
        run_config(dataset, "x", num_clients=4)["fedac-set"]
        + ";train.eval_every=1;fedopt.server_lr=0.05"
    )
    results, grid, config = run_local(dataset, tmp_path, nodes_for(4), **settings)
    cfg = fedac_config(config)
    sim = Simulator(cfg, tmp_path / "sim", progress=False)
    expected = sim.run()
    flower_params = torch.load(tmp_path / "run" / "server_state.pt")["params"]
    for name, value in sim.state.server["params"].items():
        torch.testing.assert_close(flower_params[name], value, rtol=0, atol=1e-5, msg=name)
    assert results["final"]["accuracy"] == pytest.approx(expected["final"]["accuracy"], abs=1e-6)
    if strategy == "fedac":
        queries = [m for m in grid.sent if m.metadata.message_type == MessageType.QUERY]
        # each node asked once
        assert sorted(m.metadata.dst_node_id for m in queries) == sorted(grid.contexts)
        log = json.loads((tmp_path / "run" / "flower_clients.json").read_text())
        clients = [c.name for c in sim.data.clients]
        for round_idx in (1, 2, 3):
            assert [r["client"] for r in log["rounds"][str(round_idx)]] == sample_cohort(
                clients, 0.5, cfg.seed, round_idx
            )
        assert_same_metrics(
            tmp_path / "run" / "metrics.csv", tmp_path / "sim" / "metrics.csv", rounds=3
        )
    if algorithm == "fedmlac":
        for key in ("personalized_accuracy_mean", "personalized_local_accuracy_mean"):
            assert results["final"][key] == pytest.approx(expected["final"][key], abs=1e-6), key


def test_one_supernode_per_device_trains_where_its_node_config_says(dataset, tmp_path):
    """Several GPUs beyond one process: one SuperNode per GPU, each with node-config `device`
    (docs/flower.md). Here every node names the test device (cpu in CI, FEDAC_TEST_DEVICE on a GPU
    machine); the nodes train there and the run equals the simulator's."""
    from fedac.flower import clientapp
    from fedac.training.device import resolve_device

    device = os.environ.get("FEDAC_TEST_DEVICE", "cpu")
    nodes = {node: {**config, "device": device} for node, config in nodes_for(3).items()}
    results, grid, config = run_local(dataset, tmp_path, nodes, algorithm="fedavg")
    trained = [
        c for key, c in clientapp._CLIENTS.items() if str(tmp_path / "run") in str(key)
    ] or list(clientapp._CLIENTS.values())
    assert trained and all(c.algorithm.device == resolve_device(device) for c in trained)
    expected = Simulator(fedac_config(config), tmp_path / "sim", progress=False).run()
    assert results["final"]["accuracy"] == pytest.approx(expected["final"]["accuracy"], abs=1e-6)


def test_in_process_dead_node_is_dropped_and_named(dataset, tmp_path, caplog):
    caplog.set_level("WARNING", logger="fedac")
    # A short timeout cannot drop a live node here, however loaded the machine: LocalGrid answers
    # the live nodes in the first poll, which comes before the deadline is checked; it only bounds
    # the dead node's wait.
    results, grid, _ = run_local(
        dataset,
        tmp_path,
        nodes_for(3),
        dead=[102],
        algorithm="fedavg",
        **{"min-nodes": 2, "round-timeout": 0.3, "poll-interval": 0.05},
    )
    assert results["rounds"] == 2 and results["runtime"]["dropped"] == {
        "1": ["node 102"],
        "2": ["node 102"],
    }
    assert "node 102 did not reply to the train message within 0.3 s" in caplog.text
    row = read_rows(tmp_path / "run" / "metrics.csv")[-1]
    assert float(row["clients"]) == 2 and float(row["dropped"]) == 1


def test_in_process_misconfigured_nodes_fail_with_the_reason(dataset, tmp_path):
    # Two SuperNodes with one partition-id (partial participation identifies nodes first).
    nodes = nodes_for(3)
    nodes[102]["partition-id"] = 1
    with pytest.raises(
        FlowerRunError, match=r"both hold client client001 \(partition-id 1\): give every SuperNode"
    ):
        run_local(dataset, tmp_path / "dup", nodes, algorithm="fedavg", fraction=0.5)
    # num-partitions that does not match the config's client count: every node fails, the run says
    # why.
    with pytest.raises(
        FlowerRunError, match="node-config num-partitions=5, but the run's config makes 3 clients"
    ):
        run_local(dataset, tmp_path / "count", nodes_for(3, num_partitions=5), algorithm="fedavg")


def test_nodes_in_one_process_share_one_dataset(dataset, tmp_path):
    """Flower's simulation engine serves many nodes from one process: they must share the
    federation's data (500 nodes each holding the whole dataset would not fit), while each trains
    its own client."""
    from fedac.flower import clientapp

    _, grid, _ = run_local(dataset, tmp_path, nodes_for(3), algorithm="fedavg", rounds=1)
    nodes = [clientapp.node_client(context) for context in grid.contexts.values()]
    assert (
        len({id(node.data) for node in nodes}) == 1
        and len({id(node.algorithm) for node in nodes}) == 1
    )
    assert [node.client.name for node in nodes] == [client.name for client in nodes[0].data.clients]


def test_in_process_nan_updates_are_rejected_as_in_the_simulator(dataset, tmp_path, monkeypatch):
    # Every client uploads Inf weights (lr=inf once did this; the settings' range check now refuses
    # it), on both paths: a Flower node's client_update and the simulator's stacked cohort_update.
    from fedac.algorithms.fedavg import FedAvg

    def poisoned(result):
        result.upload = {
            k: torch.full_like(v, float("inf")) if v.is_floating_point() else v
            for k, v in result.upload.items()
        }
        return result

    one, many = FedAvg.client_update, FedAvg.cohort_update
    monkeypatch.setattr(FedAvg, "client_update", lambda self, *a, **k: poisoned(one(self, *a, **k)))
    monkeypatch.setattr(
        FedAvg, "cohort_update", lambda self, *a, **k: [poisoned(r) for r in many(self, *a, **k)]
    )
    extra = {"algorithm": "fedavg", "rounds": 1}
    results, _, config = run_local(dataset, tmp_path, nodes_for(3), **extra)
    expected = Simulator(fedac_config(config), tmp_path / "sim", progress=False).run()
    row, sim_row = (
        read_rows(tmp_path / "run" / "metrics.csv")[-1],
        read_rows(tmp_path / "sim" / "metrics.csv")[-1],
    )
    assert float(row["rejected"]) == float(sim_row["rejected"]) == 3 and float(row["clients"]) == 0
    assert results["final"]["accuracy"] == pytest.approx(expected["final"]["accuracy"])


# --- 4. fedac's server optimizers vs Flower's strategies ------------------------------------------


@pytest.fixture(autouse=True)
def task_identity(monkeypatch):
    use_task_identity(monkeypatch)


class FakeGrid:
    """Just enough Grid for a strategy's configure_train (node sampling)."""

    def get_node_ids(self):
        return [1, 2, 3]


def replies_for(round_idx, global_params, sizes=(10, 20, 30)):
    """Three client models near the global one (deterministic per round) with their n_k."""
    gen = torch.Generator().manual_seed(100 + round_idx)
    uploads = []
    for n in sizes:
        uploads.append(
            (
                {
                    k: v + 0.1 * torch.randn(v.shape, generator=gen)
                    for k, v in global_params.items()
                },
                n,
            )
        )
    messages = []
    for params, n in uploads:
        content = RecordDict(
            {"arrays": ArrayRecord(params), "metrics": MetricRecord({"num-examples": n})}
        )
        messages.append(Message(content, 0, MessageType.TRAIN))
    return uploads, messages


def run_both(algorithm, rounds=3, lr_for_round=None, **fedopt):
    """(fedac's params, Flower's params) after `rounds` server steps on identical replies."""
    settings = [f"fedopt.{k}={v}" for k, v in fedopt.items()]
    cfg = load_config(None, settings, algorithm=algorithm)
    flower = flower_strategy(cfg, min_available_nodes=3, min_train_nodes=3)
    ours = build_algorithm(cfg, Task(4, 3, ["a", "b", "c"]))
    gen = torch.Generator().manual_seed(7)
    x0 = {"w": torch.randn(4, 3, generator=gen), "b": torch.randn(3, generator=gen)}
    server = {"params": x0, "moments": {"m": {}, "v": {}}}
    arrays = ArrayRecord(x0)
    for t in range(1, rounds + 1):
        uploads, messages = replies_for(t, server["params"])
        list(flower.configure_train(t, arrays, ConfigRecord(), FakeGrid()))
        arrays, _ = flower.aggregate_train(t, messages)
        if lr_for_round is not None:
            ours.cfg.fedopt.server_lr = lr_for_round(t)
        server, _ = ours.server_update(server, uploads, t)
    return server["params"], arrays.to_torch_state_dict()


@pytest.mark.parametrize(
    "algorithm, settings",
    [
        ("fedavg", {}),
        ("fedprox", {}),
        ("fedyogi", {"server_lr": 0.05, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3}),
        # momentum as Reddi et al.: set on Flower's
        ("fedadagrad", {"server_lr": 0.05, "beta1": 0.9, "tau": 1e-3}),
        # ... and Flower's own beta_1 = 0
        ("fedadagrad", {"server_lr": 0.05, "beta1": 0.0, "tau": 1e-2}),
        ("fedavgm", {"momentum": 0.9, "avgm_server_lr": 0.7}),
        # no bias correction to differ
        ("fedadam", {"server_lr": 0.05, "beta1": 0.0, "beta2": 0.0, "tau": 1e-3}),
    ],
)
def test_server_step_equals_flower_strategy(algorithm, settings):
    ours, theirs = run_both(algorithm, **settings)
    for name in ours:
        # Values only: Flower's FedAdam returns float64 arrays under NumPy 2 (its bias-correction
        # factor is a NumPy float64 scalar, which NEP 50 lets promote the float32 model); fedac
        # keeps the model's dtype.
        torch.testing.assert_close(
            theirs[name].to(ours[name].dtype),
            ours[name],
            rtol=1e-5,
            atol=1e-6,
            msg=f"{algorithm} {name}",
        )


def test_flower_fedadam_is_fedac_fedadam_with_bias_corrected_step():
    """Flower's FedAdam multiplies eta by sqrt(1 - beta2^(t+1)) / (1 - beta1^(t+1)); Reddi et al.'s
    Alg. 2 (and fedac) do not. With that step size per round fedac gives Flower's numbers exactly;
    with the plain server_lr it does not."""
    opts = {"server_lr": 0.05, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3}
    ours, theirs = run_both(
        "fedadam", lr_for_round=lambda t: flower_adam_lr(0.05, 0.9, 0.99, t), **opts
    )
    for name in ours:
        torch.testing.assert_close(
            theirs[name].to(ours[name].dtype), ours[name], rtol=1e-5, atol=1e-6
        )
    plain, theirs = run_both("fedadam", **opts)
    assert not torch.allclose(theirs["w"].to(plain["w"].dtype), plain["w"], atol=1e-4)
    assert flower_adam_lr(1.0, 0.9, 0.99, 1) == pytest.approx(math.sqrt(1 - 0.99**2) / (1 - 0.9**2))


def test_weighted_mean_equals_flower_fedavg_aggregate():
    _, messages = replies_for(1, {"w": torch.zeros(5, 2)})
    uploads = [
        (transport.from_records(m.content["arrays"]), int(m.content["metrics"]["num-examples"]))
        for m in messages
    ]
    flower = flower_strategy(load_config(None, algorithm="fedavg"))
    arrays, metrics = flower.aggregate_train(1, messages)
    torch.testing.assert_close(
        arrays.to_torch_state_dict()["w"], weighted_mean(uploads)["w"], rtol=1e-6, atol=1e-7
    )


def test_flower_strategy_refuses_what_it_cannot_reproduce():
    with pytest.raises(ConfigError, match="no built-in strategy for 'fedmlac'"):
        flower_strategy(load_config(None, algorithm="fedmlac"))
    with pytest.raises(ConfigError, match="aggregation.method=lpa needs the fedac strategy"):
        flower_strategy(load_config(None, ["aggregation.method=lpa"], algorithm="fedavg"))
    with pytest.raises(ConfigError, match="aggregation.weighting=uniform needs the fedac strategy"):
        flower_strategy(load_config(None, ["aggregation.weighting=uniform"], algorithm="fedavg"))


# --- transport and settings (no processes) --------------------------------------------------------


def test_transport_round_trips_nested_payloads_exactly():
    payload = {
        "params": {
            "conv.weight": torch.randn(4, 3, 5).transpose(0, 2),
            "n": torch.tensor(7),
            "h": torch.randn(3).half(),
        },
        "known": torch.tensor([True, False, True]),
        "extras": [torch.arange(6).reshape(2, 3), 1.5, float("nan"), None, "text", (1, 2)],
    }
    content = RecordDict()
    transport.put(content, "payload", payload)
    from flwr.common.serde import recorddict_from_proto, recorddict_to_proto

    # as on the wire
    back = transport.get(recorddict_from_proto(recorddict_to_proto(content)), "payload")
    assert transport.digest(back) == transport.digest(payload)
    assert back["params"]["n"].shape == () and back["params"]["h"].dtype == torch.float16
    assert torch.equal(back["params"]["conv.weight"], payload["params"]["conv.weight"])
    assert (
        back["known"].dtype == torch.bool
        and back["extras"][5] == (1, 2)
        and math.isnan(back["extras"][2])
    )
    # A flat state_dict travels under its own keys (what Flower's strategies aggregate), no layout
    # record.
    flat = {"a.weight": torch.ones(2), "b.bias": torch.zeros(1)}
    arrays, layout = transport.to_records(flat)
    assert layout is None and list(arrays) == ["a.weight", "b.bias"]


def test_transport_rejects_what_numpy_cannot_carry():
    with pytest.raises(transport.TransportError, match="tensor 'w' has dtype torch.bfloat16"):
        transport.to_records({"w": torch.ones(2, dtype=torch.bfloat16), "nested": {}})
    with pytest.raises(transport.TransportError, match="payload entry 'x' has type object"):
        transport.to_records({"x": object()})
    with pytest.raises(transport.TransportError, match="message has no record 'arrays'"):
        transport.get(RecordDict(), "arrays")


def test_run_config_maps_onto_fedac_settings():
    cfg = fedac_config(
        {
            "algorithm": "fedavg",
            "rounds": 4,
            "fraction": 0.5,
            "lr": "",
            "seed": 9,
            "fedac-set": "train.batch_size=8; model.name=crnn_tiny;",
            "fedac-config": "",
        }
    )
    assert (cfg.algorithm, cfg.train.rounds, cfg.train.fraction, cfg.seed) == ("fedavg", 4, 0.5, 9)
    assert cfg.train.batch_size == 8 and cfg.model.name == "crnn_tiny"
    assert cfg.train.lr == load_config(None).train.lr  # "" keeps fedac's default
    assert split_overrides(" a=1 ;; b.c=x=y ") == ["a=1", "b.c=x=y"]
    with pytest.raises(ConfigError, match="unknown setting 'train.nope'"):
        fedac_config({"fedac-set": "train.nope=1"})
    with pytest.raises(ConfigError, match="no 'partition-id' in its node-config"):
        node_settings({"num-partitions": 3})
    assert (
        node_settings({"partition-id": 2, "num-partitions": 3, "data-root": "/d"}).data_root == "/d"
    )
    # node-config device: where this node trains, in place of the run's runtime.device (one
    # SuperNode per GPU), in the node's runtime; the run's config is left as the run wrote it.
    # Spelled wrong, a clear error.
    from fedac.flower.settings import node_runtime

    node = node_settings({"partition-id": 0, "device": "cpu"})
    # (no such GPU here: only the node's device may be used)
    run_cfg = load_config(None, ["runtime.device=cuda:7"])
    assert node_runtime(apply_node_settings(run_cfg, node), node).device.type == "cpu"
    assert run_cfg.runtime.device == "cuda:7"
    with pytest.raises(ConfigError, match="node-config device=cuda:7: runtime.device=cuda:7"):
        node_runtime(load_config(None), node_settings({"partition-id": 0, "device": "cuda:7"}))
    with pytest.raises(ConfigError, match="node-config device must be"):
        node_settings({"partition-id": 0, "device": "gpu1"})


def test_stop_local_superlink_kills_only_that_superlink_and_its_descendants():
    """What `flwr run` with ':local:' leaves running: a process whose command line names
    flower-superlink and its port, with children (the simulation runtime, Ray)."""
    import subprocess
    import sys
    from pathlib import Path

    from fedac.flower.local import descendants, free_port, stop_local_superlink

    def running(pid: int) -> bool:  # exists and is not a zombie waiting to be reaped
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    port, other = free_port(), free_port()
    spawn = (
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; "
        "time.sleep(60)']); time.sleep(60)"
    )
    ours = subprocess.Popen([sys.executable, "-c", spawn, "flower-superlink", "--port", str(port)])
    theirs = subprocess.Popen(
        [sys.executable, "-c", spawn, "flower-superlink", "--port", str(other)]
    )
    try:
        deadline = time.monotonic() + 300  # the python children start up (slowly on a busy host)
        while (
            not (descendants(ours.pid) and descendants(theirs.pid)) and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        child = descendants(ours.pid)[0]
        assert stop_local_superlink(port) == 2
        assert ours.wait(timeout=300) == -9 and theirs.poll() is None
        deadline = time.monotonic() + 300
        while running(child):
            assert time.monotonic() < deadline, "the SuperLink's child survived"
            time.sleep(0.05)
        assert stop_local_superlink(port) == 0
    finally:
        stop_local_superlink(other)
        theirs.wait(timeout=300)


@pytest.mark.parametrize("precision, expected", [("bf16", True), ("fp32", False)])
def test_a_nodes_personalized_evaluation_runs_under_the_precisions_autocast(
    monkeypatch, precision, expected
):
    """Flower nodes evaluate their own models in `runtime.precision`, as the simulator does."""
    import types

    from fedac.flower import clientapp

    seen = []
    monkeypatch.setattr(
        clientapp,
        "window_accuracy",
        lambda *a: seen.append(torch.is_autocast_enabled("cpu")) or 0.5,
    )
    cfg = load_config(overrides=[f"runtime.precision={precision}"])
    node = types.SimpleNamespace(
        cfg=cfg,
        client=types.SimpleNamespace(name="c", holdout_x=None, holdout_y=torch.zeros(3)),
        algorithm=types.SimpleNamespace(
            device=torch.device("cpu"), personalized_model=lambda name, state: object()
        ),
        data=types.SimpleNamespace(test=None),
    )
    assert clientapp.personal_metrics(node, None, final=False)["local_accuracy"] == 0.5
    assert seen == [expected]
