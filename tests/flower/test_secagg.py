"""Secure aggregation (Flower's SecAgg+, run-config secagg=true; fedac.flower.secagg): the ServerApp
and ClientApps in one process (flower_helpers.LocalGrid) end with the n_k-weighted mean of the
clients' uploads within the quantization error derived in fedac.flower.secagg, the server only ever
receives masked vectors, and every combination that needs each client's upload is refused."""

from __future__ import annotations

import copy

import numpy as np
import pytest

pytest.importorskip(
    "flwr", reason="flwr is not installed (pip install 'flwr>=1.41,<1.42'); Flower tests skipped"
)

import test_flower  # noqa: E402
from flwr.common import bytes_to_ndarray  # noqa: E402
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage  # noqa: E402
from test_flower import dataset, nodes_for, run_config, run_local  # noqa: F401,E402  (dataset is a fixture)

from fedac.engine.simulator import Simulator  # noqa: E402
from fedac.errors import ConfigError  # noqa: E402
from fedac.flower import clientapp, secagg  # noqa: E402
from fedac.flower.settings import fedac_config  # noqa: E402
from fedac.flower.strategy import FlowerRunError  # noqa: E402
from fedac.rules.aggregation import weighted_mean  # noqa: E402
from flower_helpers import LocalGrid, use_task_identity  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
STAGES = [Stage.SETUP, Stage.SHARE_KEYS, Stage.COLLECT_MASKED_VECTORS, Stage.UNMASK]


@pytest.fixture(autouse=True)
def task_identity(monkeypatch):
    use_task_identity(monkeypatch)


class RecordingGrid(LocalGrid):
    """LocalGrid that also keeps every reply, and can kill a node when a given SecAgg+ stage reaches
    it."""

    kill_at: tuple[str, int] | None = None

    def push_messages(self, messages):
        messages = list(messages)
        for message in messages:
            # SecAgg+ sends one RecordDict object to every node and the mod edits it: deliver
            # copies, as the wire does
            message.content = copy.deepcopy(message.content)
            configs = message.content.config_records.get(RECORD_KEY_CONFIGS)
            if configs is not None:
                # (the node's mod pops it)
                self.stages = getattr(self, "stages", []) + [configs[Key.STAGE]]
            if self.kill_at and configs is not None and configs.get(Key.STAGE) == self.kill_at[0]:
                self.dead.add(self.kill_at[1])
        return super().push_messages(messages)

    def pull_messages(self, message_ids):
        replies = super().pull_messages(message_ids)
        self.replies = getattr(self, "replies", []) + list(replies)
        return replies


def run_secagg(dataset, tmp_path, monkeypatch, sets="", kill_at=None, nodes=3, **extra):  # noqa: F811
    """A SecAgg+ run in one process; returns (results, grid, config, uploads, rounds) where
    `uploads[t]` are the (upload, n_k) the nodes produced in round t and `rounds[t]` the server's
    parameters after round t."""
    uploads: dict[int, list] = {}
    rounds: dict[int, dict] = {}
    train_client = clientapp.train_client

    def recording_train(algorithm, payload, state, data, round_idx, seed):
        result = train_client(algorithm, payload, state, data, round_idx, seed)
        uploads.setdefault(round_idx, []).append((result.upload, data.num_samples))
        return result

    aggregate = secagg.SecAggStrategy.aggregate_secagg

    def recording_aggregate(self, server_round, results, failures):
        first = results[0][1].parameters.tensors
        # the aggregate only, for everyone
        assert all(res.parameters.tensors == first for _, res in results)
        aggregate(self, server_round, results, failures)
        rounds[server_round] = {k: v.clone() for k, v in self.server["params"].items()}

    class Grid(RecordingGrid):
        pass

    Grid.kill_at = kill_at
    monkeypatch.setattr(clientapp, "train_client", recording_train)
    monkeypatch.setattr(secagg.SecAggStrategy, "aggregate_secagg", recording_aggregate)
    monkeypatch.setattr(test_flower, "LocalGrid", Grid)
    # round-timeout 0.5 s only bounds the wait for a killed node: LocalGrid answers the live ones in
    # the first poll
    settings = {
        "algorithm": "fedavg",
        "secagg": True,
        "poll-interval": 0.01,
        "round-timeout": 0.5,
        **extra,
    }
    settings["fedac-set"] = run_config(dataset, "x", num_clients=nodes)["fedac-set"] + (
        ";" + sets if sets else ""
    )
    results, grid, config = run_local(
        dataset, tmp_path, nodes_for(nodes), **{"min-nodes": nodes, **settings}
    )
    return results, grid, config, uploads, rounds


def quantization_bound(
    ns: list[int], max_weight: float, clip: float, levels: int, spread: float
) -> float:
    """fedac.flower.secagg's bound on one entry of the aggregated update: K stochastic roundings of
    step 2C/Q divided by sum_k w_k, plus the rounding of w_k = round(Q n_k / W) / Q (relative error)
    times the updates' spread; plus float32 rounding of the result (the simulator rounds too)."""
    exact = [n / max_weight for n in ns]
    weights = [round(levels * w) / levels for w in exact]
    relative = max(abs(w - e) / e for w, e in zip(weights, exact))
    return len(ns) * (2 * clip / levels) / sum(weights) + 2 * relative * spread + 1e-6


def max_gap(a: dict, b: dict) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in b)


@pytest.mark.slow
def test_secagg_fedavg_equals_the_weighted_mean_within_the_quantization_error(
    dataset, tmp_path, monkeypatch
):
    """2 rounds of FedAvg through SecAgg+: each round's global model is the n_k-weighted mean of the
    uploads the nodes produced, to within the derived bound; the run ends near the plain simulator's
    FedAvg."""
    results, grid, config, uploads, rounds = run_secagg(dataset, tmp_path / "fine", monkeypatch)
    C, Q = 8.0, 2**22
    for t in (1, 2):
        ns = [n for _, n in uploads[t]]
        exact = weighted_mean(uploads[t])
        previous = rounds[t - 1] if t > 1 else None
        spread = max(max_gap(u, exact) for u, _ in uploads[t])
        bound = quantization_bound(ns, max(ns), C, Q, spread)
        gap = max_gap(rounds[t], exact)
        assert gap <= bound, (t, gap, bound)
        # it did move
        assert bound < 1e-4 and (previous is None or max_gap(rounds[t], previous) > 100 * bound)
        # W = largest n_k
        assert results["runtime"]["secagg"]["rounds"][str(t)]["max_weight"] == max(ns)
    # Against the plain simulator: round 2 trains from a model off by <= the round-1 bound, so the
    # final models may differ by the two rounds' bounds plus what SGD makes of a ~1e-5 start
    # difference; 1e-4.
    sim = Simulator(fedac_config(config), tmp_path / "sim", progress=False)
    sim.run()
    assert max_gap(rounds[2], sim.state.server["params"]) < 1e-4

    # Coarse quantization (Q = 2**8: step 2C/Q = 0.0625) is clearly not the mean: the test can fail.
    _, _, _, coarse_uploads, coarse = run_secagg(
        dataset, tmp_path / "coarse", monkeypatch, **{"secagg-quantization-range": 2**8}
    )
    assert max_gap(coarse[1], weighted_mean(coarse_uploads[1])) > 100 * bound


def test_the_server_only_receives_masked_vectors(dataset, tmp_path, monkeypatch):
    """Every round runs the four SecAgg+ stages; the masked-vector replies carry no parameters, only
    vectors masked uniformly over [0, 2**32) (a quantized update lies in [0, Q = 2**22])."""
    results, grid, _, uploads, _ = run_secagg(dataset, tmp_path, monkeypatch, rounds=1)
    train = [m for m in grid.sent if m.metadata.message_type == "train"]
    assert grid.stages == [s for s in STAGES for _ in range(3)]  # 3 nodes, the four stages in order
    assert all(
        not m.content.array_records or "fitins.parameters" in m.content.array_records for m in train
    )
    masked = [
        r
        for r in grid.replies
        if Key.MASKED_PARAMETERS in r.content.config_records.get(RECORD_KEY_CONFIGS, {})
    ]
    assert len(masked) == 3
    for reply in masked:
        # no upload in the clear
        assert all(len(record) == 0 for record in reply.content.array_records.values())
        vectors = [
            bytes_to_ndarray(b)
            for b in reply.content.config_records[RECORD_KEY_CONFIGS][Key.MASKED_PARAMETERS]
        ]
        values = np.concatenate([v.ravel() for v in vectors[1:]]).astype(np.float64)
        assert values.min() >= 0 and values.max() < 2**32
        # masked: not a quantized update, which stays in [0, 2**22]
        assert np.mean(values > 2**22) > 0.9
    assert results["runtime"]["strategy"] == "SecAggStrategy"
    assert results["runtime"]["secagg"]["rounds"]["1"]["clients"] == [
        "client000",
        "client001",
        "client002",
    ]


def test_unequal_clients_are_weighted_by_n_k(dataset, tmp_path, monkeypatch):
    sets = "data.partition=dirichlet;data.alpha=0.3"
    results, _, _, uploads, rounds = run_secagg(dataset, tmp_path, monkeypatch, sets=sets, rounds=1)
    ns = [n for _, n in uploads[1]]
    assert len(set(ns)) > 1, ns
    exact = weighted_mean(uploads[1])
    unweighted = weighted_mean([(u, 1) for u, _ in uploads[1]])
    spread = max(max_gap(u, exact) for u, _ in uploads[1])
    bound = quantization_bound(ns, max(ns), 8.0, 2**22, spread)
    assert max_gap(rounds[1], exact) <= bound
    # the plain mean is far outside the bound
    assert max_gap(rounds[1], unweighted) > 20 * bound, ns


def test_a_client_lost_mid_round_is_recovered_above_the_threshold_and_halts_below(
    dataset, tmp_path, monkeypatch
):
    """Node 102 dies after sending its keys; 4 shares (with 3 nodes: every node holds a share of
    every other's secrets). threshold 2: its masks are reconstructed and the round aggregates the
    two others; threshold 3: the round halts and the global model stays as it was."""
    kill = (Stage.COLLECT_MASKED_VECTORS, 102)
    results, _, _, uploads, rounds = run_secagg(
        dataset,
        tmp_path / "t2",
        monkeypatch,
        kill_at=kill,
        rounds=1,
        **{"secagg-threshold": 2, "secagg-num-shares": 4},
    )
    assert results["runtime"]["secagg"]["rounds"]["1"]["clients"] == ["client000", "client001"]
    survivors = uploads[1][:2]
    ns = [n for _, n in survivors]
    spread = max(max_gap(u, weighted_mean(survivors)) for u, _ in survivors)
    assert max_gap(rounds[1], weighted_mean(survivors)) <= quantization_bound(
        ns, max(n for _, n in uploads[1]), 8.0, 2**22, spread
    )
    results, _, _, _, rounds = run_secagg(
        dataset,
        tmp_path / "t3",
        monkeypatch,
        kill_at=kill,
        rounds=1,
        **{"secagg-threshold": 3, "secagg-num-shares": 4},
    )
    assert rounds == {} and results["runtime"]["secagg"]["rounds"] == {}
    assert results["runtime"]["dropped"] == {
        "1": [
            "node 100 (client client000, partition-id 0)",
            "node 101 (client client001, partition-id 1)",
            "node 102 (client client002, partition-id 2)",
        ]
    }


def test_clipping_range_and_max_weight_are_applied(dataset, tmp_path, monkeypatch):
    """A tight clipping range clips the weighted updates (the aggregate shrinks to <= C); an
    explicit max_weight replaces the cohort's largest n_k."""
    results, _, _, uploads, rounds = run_secagg(
        dataset,
        tmp_path,
        monkeypatch,
        rounds=1,
        **{"secagg-clipping-range": 1e-4, "secagg-max-weight": 1000.0},
    )
    info = results["runtime"]["secagg"]["rounds"]["1"]
    assert info["max_weight"] == 1000.0
    ns = [n for _, n in uploads[1]]
    # every w_k Delta_k is clipped to [-C, C], so the mean update is at most C * K / sum_k w_k
    assert info["aggregate_max_abs"] <= 1e-4 * len(ns) / (sum(ns) / 1000.0) * 1.001
    assert max_gap(rounds[1], weighted_mean(uploads[1])) > 1e-4  # ~30x the unclipped run's bound


@pytest.mark.parametrize(
    "extra, match",
    [
        (
            {"algorithm": "fedmlac"},
            "algorithm=fedmlac needs each client's upload on the server.*set secagg=false",
        ),
        (
            {"sets": "aggregation.method=median"},
            "aggregation.method=median compares the clients' uploads.*aggregation.method=mean",
        ),
        ({"sets": "aggregation.method=lpa"}, "aggregation.method=lpa compares"),
        (
            {"sets": "aggregation.weighting=uniform"},
            "aggregation.weighting=uniform: the secure sum weights.*=n_k",
        ),
        (
            {"sets": "dp.mode=central;dp.clip=0.5"},
            "dp.mode=central clips each client's update on the server.*dp.mode=none",
        ),
        (
            {"sets": "attack.kind=sign_flip;attack.fraction=0.4"},
            "attack.kind=sign_flip alters each upload on the server",
        ),
        ({"strategy": "flower"}, 'strategy=flower cannot run with secagg=true.*strategy="fedac"'),
        ({"data-mode": "device"}, "data-mode=device is not supported with secagg=true"),
        ({"algorithm": "fedkad"}, "algorithm=fedkad needs each client's upload"),
        ({"secagg-num-shares": 2}, "secagg-num-shares=2.*greater than 2"),
        ({"secagg-threshold": "x"}, "run-config 'secagg-threshold' expects a number"),
        ({"secagg": "maybe"}, "run-config 'secagg' must be true or false"),
    ],
)
def test_combinations_needing_each_upload_are_refused(dataset, tmp_path, monkeypatch, extra, match):
    extra = dict(extra)
    with pytest.raises(ConfigError, match=match):
        run_secagg(dataset, tmp_path, monkeypatch, sets=extra.pop("sets", ""), rounds=1, **extra)


def test_a_cohort_of_one_is_refused(dataset, tmp_path, monkeypatch):
    with pytest.raises(
        FlowerRunError,
        match=r"SecAgg\+ needs at least 2 clients per round, the cohort has 1 "
        r"\(train.fraction=0.34",
    ):
        run_secagg(dataset, tmp_path, monkeypatch, rounds=1, fraction=0.34)


def test_data_poisoning_combines_and_secagg_off_is_the_default_path(dataset, tmp_path, monkeypatch):
    """A data attack acts on the node, so it runs under SecAgg+; without `secagg` the Message-API
    strategy runs."""
    results, *_ = run_secagg(
        dataset,
        tmp_path / "attack",
        monkeypatch,
        rounds=1,
        sets="attack.kind=label_flip;attack.fraction=0.34",
    )
    assert (
        results["runtime"]["strategy"] == "SecAggStrategy"
        and results["final"]["malicious_clients"] == 1
    )
    plain, *_ = run_local(dataset, tmp_path / "plain", nodes_for(3), algorithm="fedavg", rounds=1)
    assert plain["runtime"]["strategy"] == "FedacStrategy" and "secagg" not in plain["runtime"]


def test_num_shares_sets_each_nodes_neighbours(dataset, tmp_path, monkeypatch):
    """5 nodes: with secagg-num-shares=3 each node shares its secrets with 2 others (SecAgg+'s
    sparse graph), with the default 1.0 with all 4 (SecAgg); either way the round ends with the
    weighted mean."""
    for shares, expected in ((3, 2), (1.0, 4)):
        _, grid, _, uploads, rounds = run_secagg(
            dataset,
            tmp_path / str(shares),
            monkeypatch,
            nodes=5,
            rounds=1,
            **{"secagg-num-shares": shares, "secagg-threshold": 2},
        )
        sent = [
            r.content.config_records[RECORD_KEY_CONFIGS][Key.DESTINATION_LIST]
            for r in grid.replies
            if Key.DESTINATION_LIST in r.content.config_records.get(RECORD_KEY_CONFIGS, {})
        ]
        assert [len(destinations) for destinations in sent] == [expected] * 5, shares
        ns = [n for _, n in uploads[1]]
        spread = max(max_gap(u, weighted_mean(uploads[1])) for u, _ in uploads[1])
        assert max_gap(rounds[1], weighted_mean(uploads[1])) <= quantization_bound(
            ns, max(ns), 8.0, 2**22, spread
        )
