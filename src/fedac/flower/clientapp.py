"""The Flower ClientApp: one fedac client per SuperNode, trained by the fedac client update
unchanged.

- `train`: decode the global payload, load this client's persistent state from `context.state` (or
  create it as the simulator does), call `fedac.training.step.train_client` -- the function every
  fedac runtime calls, so batch order and dropout masks are those of the simulator -- keep the new
  state in `context.state` and reply with the upload, n_k and the client's metrics. The state (e.g.
  FedMLAC's personalized model) never leaves the node; only its digest is reported, so the server
  can log which state each round started from.
- `evaluate`: the personalized model on the client's local held-out windows (and, on the final
  round, on the test split), as the simulator's personalized metrics. On evaluation rounds a client
  that trains evaluates its new model within `train` already, so only clients left out of the
  round's cohort get an `evaluate` message.
- `query`: which client this node holds (name, partition-id, n_k), asked once by the ServerApp.

The node's client is `partition-id` of the clients fedac's partitioner makes from the run's config
(node-config `partition-id`, `num-partitions`, optionally `data-root` / `cache-dir`), or, with
node-config `data-mode=device`, the node's own folder of clips (fedac.flower.devices).
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field
from typing import Any

from flwr.app import ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedac.algorithms import build_algorithm
from fedac.algorithms.base import Algorithm, ClientData
from fedac.config import Config
from fedac.engine.data import FederatedData, build_federated_data
from fedac.errors import ConfigError
from fedac.flower import transport
from fedac.flower.devices import device_client, run_classes
from fedac.flower.secagg import secagg_mod
from fedac.flower.settings import (
    NodeSettings,
    apply_node_settings,
    fedac_config,
    node_runtime,
    node_settings,
)
from fedac.flower.strategy import ARRAYS, CLIENT_INFO, CONFIG, EVAL, METRICS, REJECTED_UPDATE
from fedac.rules.attacks import Attack
from fedac.rules.compression import Compressor
from fedac.training.device import autocast, place, to_device
from fedac.training.evaluate import evaluate as evaluate_split
from fedac.training.evaluate import window_accuracy
from fedac.training.step import train_client
from fedac.training.types import all_finite

log = logging.getLogger("fedac.flower")

#: context.state record names of the persistent client state.
STATE = "fedac.state"
STATE_INFO = "fedac.state-info"
#: context.state record names of the client's error-feedback residual (compression.*).
RESIDUAL = "fedac.compression-residual"
RESIDUAL_INFO = "fedac.compression-residual-info"

app = ClientApp()


@dataclass
class RunData:
    """What every node of one run on one machine shares: the config, the federation's data, the
    algorithm."""

    cfg: Config
    data: FederatedData
    algorithm: Algorithm


@dataclass
class NodeClient:
    cfg: Config
    data: FederatedData
    algorithm: Algorithm
    client: ClientData
    partition_id: int
    info: dict[str, Any] = field(default_factory=dict)
    """Extra facts the node reports with its client (device mode: its folder's skipped files)."""


# A SuperNode starts a new ClientApp process per message; in Flower's simulation engine one process
# serves many nodes. Either way, build each (run, node) client once per process, and the dataset
# once per (run, data location): simulated nodes share it instead of each holding the whole
# federation (500 nodes x a 2 GB dataset would not fit). Algorithms keep no per-client state, so one
# serves all.
_CLIENTS: dict[str, NodeClient] = {}
_RUNS: dict[str, RunData] = {}


def _setup_logging() -> None:
    root = logging.getLogger("fedac")
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(
            logging.Formatter("%(asctime)s fedac-client %(levelname)s %(message)s")
        )
        root.addHandler(handler)
        root.setLevel(logging.INFO)


def _key(*parts: Any) -> str:
    return json.dumps(parts, default=str)


def run_data(context: Context, node: NodeSettings) -> RunData:
    # the device too: simulated nodes of one process may each name their own GPU (node-config
    # `device`)
    key = _key(
        context.run_id,
        sorted(context.run_config.items()),
        node.data_root,
        node.cache_dir,
        node.device,
    )
    if key not in _RUNS:
        cfg = apply_node_settings(fedac_config(context.run_config), node)
        runtime = node_runtime(cfg, node)
        data = build_federated_data(cfg, progress=False, device=runtime.device)
        # a malicious node's poisoned data
        data = Attack(cfg, [c.name for c in data.clients]).poison_data(data)
        algorithm = build_algorithm(cfg, data.task, runtime)
        _RUNS[key] = RunData(cfg, place(data, algorithm.device), algorithm)
    return _RUNS[key]


def node_client(context: Context, content: RecordDict | None = None) -> NodeClient:
    key = _key(
        context.run_id, sorted(context.run_config.items()), sorted(context.node_config.items())
    )
    if key in _CLIENTS:
        return _CLIENTS[key]
    _setup_logging()
    node = node_settings(context.node_config)
    if node.data_mode == "device":
        own = device_client(
            context, node, run_classes(content if content is not None else RecordDict())
        )
        pid = -1 if node.partition_id is None else node.partition_id
        # its one client, val and test on the node's device
        data = place(own.data, own.algorithm.device)
        _CLIENTS[key] = NodeClient(own.cfg, data, own.algorithm, data.clients[0], pid, own.info)
        return _CLIENTS[key]
    run = run_data(context, node)
    count = len(run.data.clients)
    if node.num_partitions is not None and node.num_partitions != count:
        raise ConfigError(
            f"node-config num-partitions={node.num_partitions}, but the run's config makes {count} "
            f"clients (dataset {run.cfg.dataset}, data.partition={run.cfg.data.partition}, "
            f"data.num_clients={run.cfg.data.num_clients}): start the SuperNodes with "
            f"num-partitions={count}, or change the partition settings in fedac-set"
        )
    assert node.partition_id is not None  # full data mode: node_settings requires partition-id
    if not 0 <= node.partition_id < count:
        raise ConfigError(
            f"node-config partition-id={node.partition_id} is outside 0..{count - 1} "
            f"(the run's config makes {count} clients)"
        )
    _CLIENTS[key] = NodeClient(
        run.cfg, run.data, run.algorithm, run.data.clients[node.partition_id], node.partition_id
    )
    return _CLIENTS[key]


def load_state(context: Context, node: NodeClient) -> tuple[Any, int]:
    """The client's persistent state and the round it was last trained in (0: freshly
    initialised)."""
    if STATE_INFO in context.state.config_records:
        info = context.state.config_records[STATE_INFO]
        if str(info["client"]) != node.client.name:
            raise ConfigError(
                f"this node's stored state belongs to client {info['client']}, not "
                f"{node.client.name}: was the node's partition-id changed during the run?"
            )
        return to_device(transport.get(context.state, STATE), node.algorithm.device), int(
            info["round"]
        )
    return node.algorithm.init_client_state(node.client.name), 0


def save_state(context: Context, node: NodeClient, state: Any, round_idx: int) -> None:
    if state is None:
        return
    transport.put(context.state, STATE, state)
    context.state[STATE_INFO] = ConfigRecord({"client": node.client.name, "round": round_idx})


def compressed(
    context: Context, node: NodeClient, payload: Any, upload: Any, round_idx: int
) -> Any:
    """What the node sends of `upload`: under compression.* its wire form (rules/compression.py
    `encode`: the bytes the ledger counts), with the client's error-feedback residual kept in
    `context.state` beside its persistent state; else the upload itself."""
    if node.cfg.compression.method == "none":
        return upload
    kind = type(node.algorithm)
    compressor = Compressor(node.cfg, kind.dp_compatible or kind.sums_uploads)
    name = node.client.name
    residuals: dict[str, Any] = {}
    if RESIDUAL_INFO in context.state.config_records:
        owner = str(context.state.config_records[RESIDUAL_INFO]["client"])
        if owner != name:
            raise ConfigError(
                f"this node's stored compression residual belongs to client {owner}, not {name}: "
                "was the node's partition-id changed during the run?"
            )
        residuals[name] = to_device(transport.get(context.state, RESIDUAL), node.algorithm.device)
    wire = compressor.encode(payload, upload, name, round_idx, residuals)
    if name in residuals:
        transport.put(context.state, RESIDUAL, residuals[name])
        context.state[RESIDUAL_INFO] = ConfigRecord({"client": name})
    return wire


def _client_info(node: NodeClient, **extra: Any) -> ConfigRecord:
    return ConfigRecord(
        {
            "client": node.client.name,
            "partition-id": node.partition_id,
            "num-examples": node.client.num_samples,
            **node.info,
            **extra,
        }
    )


def _metric_record(values: dict[str, Any]) -> MetricRecord:
    """MetricRecord takes int or float (not bool, not NumPy scalars)."""
    out: dict[str, int | float] = {}
    for key, value in values.items():
        out[key] = int(value) if isinstance(value, (bool, int)) else float(value)
    return MetricRecord(out)


@app.train(mods=[secagg_mod])  # SecAgg+ messages (run-config secagg=true); others pass through
def train(msg: Message, context: Context) -> Message:
    node = node_client(context, msg.content)
    round_idx = int(msg.content[CONFIG]["server-round"])
    # as in the simulator, a client without training data never trains
    if node.client.num_samples == 0:
        return Message(
            RecordDict(
                {METRICS: _metric_record({"num-examples": 0}), CLIENT_INFO: _client_info(node)}
            ),
            reply_to=msg,
        )
    payload = to_device(transport.get(msg.content, ARRAYS), node.algorithm.device)
    state, state_round = load_state(context, node)
    state_digest = transport.digest(state) if state is not None else ""
    result = train_client(node.algorithm, payload, state, node.client, round_idx, node.cfg.seed)
    if not all_finite(result.upload) or not all_finite(result.state):
        log.warning(
            "round %d: client %s produced NaN/Inf parameters; update discarded, state kept",
            round_idx,
            node.client.name,
        )
        return Message(
            Error(
                REJECTED_UPDATE,
                f"client {node.client.name} produced NaN/Inf parameters in round "
                f"{round_idx}; its update is discarded",
            ),
            reply_to=msg,
        )
    save_state(context, node, result.state, round_idx)
    reply = RecordDict()
    transport.put(reply, ARRAYS, compressed(context, node, payload, result.upload, round_idx))
    reply[METRICS] = _metric_record({"num-examples": node.client.num_samples, **result.metrics})
    info: dict[str, Any] = {"trained-round": round_idx}
    if result.state is not None:
        info.update(
            {
                "state-round": state_round,
                "state-digest": state_digest,
                "new-state-digest": transport.digest(result.state),
            }
        )
    reply[CLIENT_INFO] = _client_info(node, **info)
    config = msg.content[CONFIG]
    if bool(config.get("evaluate", False)):
        # An evaluation round: the state just trained is the one the round's evaluation would load,
        # so evaluate it now and save the server an `evaluate` exchange with this node.
        reply[EVAL] = _metric_record(
            personal_metrics(node, result.state, bool(config.get("final", False)))
        )
    log.info(
        "round %d: client %s trained (state of round %d, %s -> %s)",
        round_idx,
        node.client.name,
        state_round,
        state_digest or "-",
        info.get("new-state-digest", "-"),
    )
    return Message(reply, reply_to=msg)


def personal_metrics(node: NodeClient, state: Any, final: bool) -> dict[str, Any]:
    """The client's own model on its local held-out windows, and on the final round on the test
    split."""
    batch = node.cfg.train.eval_batch_size
    metrics: dict[str, Any] = {"num-examples": int(node.client.holdout_y.shape[0])}
    own = node.algorithm.personalized_model(node.client.name, state)
    if own is not None:
        with _precision(node):
            metrics["local_accuracy"] = window_accuracy(
                own, node.client.holdout_x, node.client.holdout_y, batch
            )
            # (a device node without test-root holds no test split)
            if final and node.data.test is not None:
                metrics.update(
                    {f"test_{k}": v for k, v in evaluate_split(own, node.data.test, batch).items()}
                )
    return metrics


def _precision(node: NodeClient):
    """`runtime.precision`'s autocast for a node's evaluations, as the simulator evaluates."""
    return autocast(node.cfg.runtime.precision, node.algorithm.device)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    node = node_client(context, msg.content)
    config = msg.content[CONFIG] if CONFIG in msg.content else ConfigRecord()
    batch = node.cfg.train.eval_batch_size
    state, state_round = load_state(context, node)
    # A node that never trained holds a random initial model: it reports no personalized metrics
    # (the simulator's personalized means likewise cover only the clients that trained).
    trained = state_round > 0 or not node.algorithm.personalized
    metrics: dict[str, Any] = (
        personal_metrics(node, state, bool(config.get("final", False)))
        if trained
        else {"num-examples": int(node.client.holdout_y.shape[0])}
    )
    if ARRAYS in msg.content:
        # A global model sent along (Flower's built-in strategies do): its accuracy on the local
        # held-out data.
        model = node.algorithm.global_model({"params": transport.get(msg.content, ARRAYS)})
        if model is not None:
            with _precision(node):
                metrics["accuracy"] = window_accuracy(
                    model, node.client.holdout_x, node.client.holdout_y, batch
                )
    reply = RecordDict(
        {
            METRICS: _metric_record(metrics),
            CLIENT_INFO: _client_info(node, **{"state-round": state_round}),
        }
    )
    return Message(reply, reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    node = node_client(context, msg.content)
    return Message(
        RecordDict({CLIENT_INFO: _client_info(node, **{"num-clients": len(node.data.clients)})}),
        reply_to=msg,
    )
