"""fedac's server side as a Flower strategy, and the Flower built-in strategies that match fedac's.

`FedacStrategy` is a `flwr.serverapp.strategy.Strategy`: Flower's `Strategy.start` drives the
rounds, and the strategy delegates everything algorithmic to `Algorithm.broadcast` /
`Algorithm.server_update`, so FedMLAC's Layer-wise Pruning Aggregation, FedKAD's prototype
aggregation and every other fedac aggregator run unchanged. What it adds is deployment bookkeeping
only:

- `NodeDirectory`: which SuperNode holds which fedac client (asked once per node with a `query`
  message), so cohorts are drawn exactly as the simulator draws them: `sample_cohort` over the
  connected clients in the clients' order, seeded by (seed, round). With every client connected and
  `fraction=1.0` the Flower run and the simulator train the same clients in the same order.
- `PollingGrid`: a Grid wrapper that polls for replies every `poll_interval` seconds (Flower's
  `send_and_receive` sleeps 3 s between polls) and logs, by node id and client, who did not answer
  within the round timeout.

`flower_strategy` builds Flower's own FedAvg / FedProx / FedAdagrad / FedYogi / FedAvgM configured
to give fedac's numbers (see its docstring for where Flower's FedAdam differs from fedac's).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedac.algorithms.base import Algorithm
from fedac.config import Config
from fedac.engine.server_step import Arrival, ServerStep
from fedac.engine.simulator import sample_cohort
from fedac.engine.state import RunState
from fedac.errors import ConfigError, FedacError
from fedac.flower import transport
from fedac.training.device import nbytes

log = logging.getLogger("fedac.flower")

#: Record names shared by the ServerApp and the ClientApp (the first three are Flower's defaults).
ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"
CLIENT_INFO = "fedac.client"
#: MetricRecord of the personalized evaluation a client runs right after training on evaluation
#: rounds.
EVAL = "fedac.eval"
#: Error code of a reply whose update was NaN/Inf and was discarded on the node (codes < 100 are
#: Flower's).
REJECTED_UPDATE = 1001


class FlowerRunError(FedacError):
    """The deployment cannot go on (too few SuperNodes, two nodes holding one client, ...)."""


@dataclass
class NodeInfo:
    node_id: int
    client: str
    partition_id: int
    num_examples: int

    def __str__(self) -> str:
        if self.partition_id < 0:  # a device node: no partition-id
            return f"node {self.node_id} (client {self.client})"
        return f"node {self.node_id} (client {self.client}, partition-id {self.partition_id})"


def reply_origin(reply: Message, sent: list[Message]) -> int:
    """The node a reply is about. An error the SuperLink creates for an unreachable node comes from
    the SuperLink itself (src_node_id 1); the message it answers tells which node was meant."""
    for message in sent:
        if (
            message.metadata.message_id
            and message.metadata.message_id == reply.metadata.reply_to_message_id
        ):
            return message.metadata.dst_node_id
    return reply.metadata.src_node_id


class PollingGrid(Grid):
    """Delegates to the ServerApp's Grid; `send_and_receive` polls faster and reports missing
    replies."""

    def __init__(
        self, grid: Grid, poll_interval: float = 0.5, describe: Callable[[int], str] | None = None
    ):
        self._grid = grid
        self.poll_interval = poll_interval
        self.describe = describe or (lambda node_id: f"node {node_id}")
        self.missing: list[int] = []
        """Nodes that did not reply to the last exchange within its timeout."""

    def set_run(self, run) -> None:
        self._grid.set_run(run)

    @property
    def run(self):
        return self._grid.run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return self._grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        return self._grid.get_node_ids()

    def get_nodes(self):
        return self._grid.get_nodes()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self._grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self._grid.pull_messages(message_ids)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> list[Message]:
        messages = list(messages)
        self.missing = []
        if not messages:
            return []
        destinations = [m.metadata.dst_node_id for m in messages]
        kind = messages[0].metadata.message_type
        # order preserved; None for a message that failed to push
        ids = list(self.push_messages(messages))
        pending = {mid: dst for mid, dst in zip(ids, destinations) if mid}
        for dst in (dst for mid, dst in zip(ids, destinations) if not mid):
            log.warning(
                "%s message to %s could not be pushed to the SuperLink", kind, self.describe(dst)
            )
            self.missing.append(dst)
        del messages
        deadline = None if timeout is None else time.monotonic() + timeout
        replies: list[Message] = []
        while pending:
            got = list(self.pull_messages(list(pending)))
            for reply in got:
                pending.pop(reply.metadata.reply_to_message_id, None)
            replies.extend(got)
            if not pending or (deadline is not None and time.monotonic() >= deadline):
                break
            time.sleep(self.poll_interval)
        for dst in pending.values():
            log.warning(
                "%s did not reply to the %s message within %g s: dropped from this exchange",
                self.describe(dst),
                kind,
                timeout if timeout is not None else float("inf"),
            )
            self.missing.append(dst)
        return replies


class NodeDirectory:
    """Which connected SuperNode holds which fedac client; new nodes are asked with a `query`
    message."""

    def __init__(
        self,
        clients: list[str],
        min_nodes: int = 1,
        node_wait: float = 120.0,
        timeout: float = 600.0,
        poll_interval: float = 0.5,
        open_roster: bool = False,
        announce: dict[str, Any] | None = None,
    ):
        self.order = {name: i for i, name in enumerate(clients)}
        self.open_roster = open_roster
        """Device mode: any client a node announces joins, and the client order is by name (the
        order of the partition's client names in the simulator), so cohorts are still the
        simulator's."""
        self.announce = dict(announce or {})
        """Sent in every query's config (device mode: the run's class names)."""
        self.min_nodes = min_nodes
        self.node_wait = node_wait
        self.timeout = timeout
        self.poll_interval = poll_interval
        self.nodes: dict[int, NodeInfo] = {}
        self.connected: set[int] = set()

    def describe(self, node_id: int) -> str:
        info = self.nodes.get(node_id)
        return str(info) if info else f"node {node_id}"

    def _wait_for_nodes(self, grid: Grid) -> list[int]:
        deadline = time.monotonic() + self.node_wait
        while True:
            node_ids = sorted(grid.get_node_ids())
            if len(node_ids) >= self.min_nodes:
                return node_ids
            if time.monotonic() >= deadline:
                raise FlowerRunError(
                    f"only {len(node_ids)} SuperNode(s) connected after {self.node_wait:.0f} s, "
                    f"but min-nodes={self.min_nodes}: start more SuperNodes or lower run-config "
                    "min-nodes"
                )
            time.sleep(self.poll_interval)

    def refresh(self, grid: Grid, identify: bool = True) -> tuple[list[NodeInfo], list[int]]:
        """Wait for `min_nodes` and log departures. Returns the identified live nodes in client
        order and the connected nodes not identified yet; with `identify`, those are first asked
        with a `query`."""
        node_ids = self._wait_for_nodes(grid)
        for gone in sorted(self.connected - set(node_ids)):
            log.warning("%s left the federation", self.describe(gone))
        for new in sorted(set(node_ids) - self.connected):
            log.info("%s connected", self.describe(new))
        self.connected = set(node_ids)
        if identify and any(n not in self.nodes for n in node_ids):
            self._identify(grid, [n for n in node_ids if n not in self.nodes])
        live = sorted(
            (self.nodes[n] for n in node_ids if n in self.nodes),
            key=lambda info: self.order[info.client],
        )
        # A node whose query failed is asked again next round; it does not train unidentified.
        return live, ([] if identify else [n for n in node_ids if n not in self.nodes])

    def _identify(self, grid: Grid, node_ids: list[int]) -> None:
        content = RecordDict({CONFIG: ConfigRecord({"fedac-query": "client", **self.announce})})
        messages = [Message(content, node_id, MessageType.QUERY) for node_id in node_ids]
        for reply in grid.send_and_receive(messages, timeout=self.timeout):
            node_id = reply_origin(reply, messages)
            if reply.has_error():
                log.error(
                    "node %d could not load its fedac client: %s", node_id, reply.error.reason
                )
                continue
            self.learn(node_id, reply.content[CLIENT_INFO])

    def learn(self, node_id: int, info: ConfigRecord | dict) -> NodeInfo:
        """Record which client a node holds (from any of its replies); rejects clients the server
        does not know and two nodes holding one client."""
        client = str(info["client"])
        if node_id in self.nodes:
            return self.nodes[node_id]
        if client not in self.order and self.open_roster:
            self.order = {name: i for i, name in enumerate(sorted([*self.order, client]))}
        if client not in self.order:
            raise FlowerRunError(
                f"node {node_id} holds client '{client}', which the ServerApp's config does not "
                "make: node and server partition different data (check data.* settings and the "
                "nodes' data-root)"
            )
        for other in self.nodes.values():
            if other.client == client:
                raise FlowerRunError(
                    f"nodes {other.node_id} and {node_id} both hold client {client} (partition-id "
                    f"{info['partition-id']}): give every SuperNode a distinct partition-id "
                    "(device mode: a distinct folder or node-config client)"
                )
        self.nodes[node_id] = NodeInfo(
            node_id, client, int(info["partition-id"]), int(info["num-examples"])
        )
        log.info(
            "%s joined with %d training windows",
            self.nodes[node_id],
            self.nodes[node_id].num_examples,
        )
        if (
            int(info.get("skipped-unknown", 0))
            or int(info.get("skipped-corrupt", 0))
            or int(info.get("skipped-missing", 0))
        ):
            log.warning(
                "%s skipped files on its device: %s with labels the run does not know (%s), %s "
                "unreadable, %s listed but missing",
                self.nodes[node_id],
                info.get("skipped-unknown", 0),
                info.get("unknown-labels", "") or "-",
                info.get("skipped-corrupt", 0),
                info.get("skipped-missing", 0),
            )
        return self.nodes[node_id]


@dataclass
class ClientReport:
    """One client's answer in a round (train diagnostics or evaluation metrics)."""

    node_id: int
    client: str
    metrics: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Received:
    """One client's usable reply in a round: its upload and n_k, its report and, on evaluation
    rounds, the evaluation it ran right after training."""

    upload: Any
    weight: int
    report: ClientReport
    evaluation: ClientReport | None


@dataclass
class Answers:
    """A round's replies, sorted (`FedacStrategy._read_replies`)."""

    received: list[Received] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    """Clients whose node refused its own non-finite update."""
    failed: list[int] = field(default_factory=list)
    """Nodes whose reply was an error."""
    first_error: str = ""


class FedacStrategy(Strategy):
    """Flower strategy that runs a fedac Algorithm's server side (aggregation included)
    unchanged."""

    def __init__(
        self,
        algorithm: Algorithm,
        server: dict[str, Any],
        directory: NodeDirectory,
        cfg: Config,
        server_step: ServerStep | None = None,
    ):
        self.algorithm = algorithm
        self.server_step = server_step or ServerStep(algorithm)
        """The simulator's server step (engine/server_step.py): the ServerApp passes the run's, with
        its attack and DP layers; alone, uploads reach the algorithm as they come."""
        self.server = server
        """The algorithm's global state (what `Algorithm.server_update` returns), kept on the
        ServerApp."""
        self.directory = directory
        self.cfg = cfg
        self.round_metrics: dict[str, float] = {}
        self.train_reports: dict[int, list[ClientReport]] = {}
        self.eval_reports: dict[str, ClientReport] = {}
        """Latest evaluation reply per client."""
        self.dropped: dict[int, list[str]] = {}
        """Round -> nodes (described) that were sampled but sent no usable reply."""
        self._sent: dict[int, str] = {}
        self._messages: list[Message] = []
        self._skip_eval: set[int] = set()
        self.ledger_state = RunState(cfg.algorithm, None)
        """Where the bytes sent are counted (the server step's byte ledger): the ServerApp's run
        state."""

    # --- helpers -------------------------------------------------------------------------------
    def payload_record(self) -> RecordDict:
        content = RecordDict()
        transport.put(content, ARRAYS, self.algorithm.broadcast(self.server))
        return content

    def global_arrays(self) -> ArrayRecord:
        return transport.to_records(self.algorithm.broadcast(self.server))[0]

    def is_eval_round(self, server_round: int) -> bool:
        return (
            server_round % self.cfg.train.eval_every == 0 or server_round == self.cfg.train.rounds
        )

    def summary(self) -> None:
        train = self.cfg.train
        log.info(
            "fedac strategy: algorithm %s, %d rounds, fraction %.3g, seed %d, evaluation every %d "
            "round(s)",
            self.cfg.algorithm,
            train.rounds,
            train.fraction,
            self.cfg.seed,
            train.eval_every,
        )

    # --- training ------------------------------------------------------------------------------
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        # Full participation needs no identification round: every connected node trains, and its
        # reply says which client it holds. Partial participation samples clients, so new nodes are
        # asked first.
        full = self.cfg.train.fraction >= 1.0
        known, unknown = self.directory.refresh(grid, identify=not full)
        live = [n for n in known if n.num_examples > 0]
        if not live and not unknown:
            raise FlowerRunError(
                f"none of the {len(self.directory.connected)} connected SuperNodes holds a usable "
                "fedac client with training data (see the node errors logged above)"
            )
        names = (
            sample_cohort(
                [n.client for n in live], self.cfg.train.fraction, self.cfg.seed, server_round
            )
            if live
            else []
        )
        by_client = {n.client: n for n in live}
        content = self.payload_record()
        config["server-round"] = server_round
        evaluating = self.algorithm.personalized and self.is_eval_round(server_round)
        config["evaluate"] = evaluating
        config["final"] = server_round == self.cfg.train.rounds
        if evaluating:
            # this round's reports only: a dropped node's old numbers must not count
            self.eval_reports = {}
        content[CONFIG] = config
        self._sent = {by_client[name].node_id: name for name in names}
        self._sent.update({node_id: f"<node {node_id}>" for node_id in unknown})
        log.info(
            "round %d: training %d of %d connected clients: %s",
            server_round,
            len(self._sent),
            len(live) + len(unknown),
            ", ".join(names + [f"node {n} (not identified yet)" for n in unknown]),
        )
        self._messages = [Message(content, node_id, MessageType.TRAIN) for node_id in self._sent]
        return self._messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        answers = self._read_replies(server_round, replies)
        if (
            answers.failed
            and not answers.received
            and not answers.rejected
            and len(answers.failed) == len(self._sent)
        ):
            raise FlowerRunError(
                f"round {server_round}: every sampled SuperNode failed; the first said: "
                f"{answers.first_error}"
            )
        payload = self.algorithm.broadcast(self.server)
        step = self.server_step(
            self.ledger_state,
            payload,
            [self._arrival(payload, r) for r in answers.received],
            server_round,
            rejected_elsewhere=len(answers.rejected),
        )
        self.server = step.server
        kept = [r for r in answers.received if r.report.client in step.accepted]
        self.train_reports[server_round] = [r.report for r in kept]
        for r in kept:
            if r.evaluation is not None:
                self.eval_reports[r.report.client] = r.evaluation
            if "state-round" in r.report.info:
                log.info(
                    "round %d: client %s trained from its state of round %s (digest %s) -> %s",
                    server_round,
                    r.report.client,
                    r.report.info["state-round"],
                    r.report.info.get("state-digest"),
                    r.report.info.get("new-state-digest"),
                )
        metrics = step.metrics
        metrics["dropped"] = float(len(self._skip_eval))
        self.round_metrics = metrics
        return (self.global_arrays() if step.accepted else None), MetricRecord(metrics)

    def _arrival(self, payload: Any, received: Received) -> Arrival:
        """A reply as the server step's `Arrival`; a compressed upload (compression.*: the node
        sent its wire form, clientapp.py `compressed`) decoded, with the bytes it took."""
        loss = received.report.metrics.get("loss", math.nan)
        client = received.report.client
        compression = self.server_step.compression
        if compression is None:
            return Arrival(client, received.upload, received.weight, loss)
        upload = compression.decode(payload, received.upload)
        return Arrival(client, upload, received.weight, loss, wire_bytes=nbytes(received.upload))

    def _read_replies(self, server_round: int, replies: Iterable[Message]) -> Answers:
        """The round's replies sorted into uploads (in the simulator's cohort order), updates a node
        refused itself, and failures; the nodes that failed or never answered are logged and left
        out of this round's evaluation."""
        answers, answered = Answers(), set()
        for reply in replies:
            node_id = reply_origin(reply, self._messages)
            answered.add(node_id)
            client = self._sent.get(node_id, f"<unknown node {node_id}>")
            if reply.has_error():
                if reply.error.code == REJECTED_UPDATE:
                    log.warning(
                        "round %d: client %s returned NaN/Inf parameters; its update is discarded",
                        server_round,
                        client,
                    )
                    answers.rejected.append(client)
                else:
                    log.warning(
                        "round %d: %s dropped out (%s); the round goes on with the others",
                        server_round,
                        self.directory.describe(node_id),
                        reply.error.reason,
                    )
                    answers.failed.append(node_id)
                    answers.first_error = answers.first_error or reply.error.reason
                continue
            if CLIENT_INFO in reply.content:
                client = self.directory.learn(node_id, reply.content[CLIENT_INFO]).client
            metrics = dict(reply.content[METRICS])
            if int(metrics["num-examples"]) == 0:
                log.info(
                    "round %d: client %s holds no training data; it is left out of later cohorts",
                    server_round,
                    client,
                )
                continue
            info = dict(reply.content[CLIENT_INFO]) if CLIENT_INFO in reply.content else {}
            answers.received.append(
                Received(
                    transport.get(reply.content, ARRAYS),
                    int(metrics["num-examples"]),
                    ClientReport(node_id, client, metrics, info),
                    ClientReport(node_id, client, dict(reply.content[EVAL]), info)
                    if EVAL in reply.content
                    else None,
                )
            )
        missing = [n for n in self._sent if n not in answered]
        self._skip_eval = set(missing) | set(answers.failed)
        self.dropped[server_round] = [self.directory.describe(n) for n in sorted(self._skip_eval)]
        for node_id in missing:
            log.warning(
                "round %d: %s dropped out (no reply); the round goes on with the others",
                server_round,
                self.directory.describe(node_id),
            )
        # The simulator's cohort order (read now: in device mode the order grows as nodes announce
        # themselves).
        answers.received.sort(
            key=lambda r: self.directory.order.get(r.report.client, len(self.directory.order))
        )
        return answers

    # --- evaluation on the nodes (personalized models never leave them) ---------------------------
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        if not self.algorithm.personalized or not self.is_eval_round(server_round):
            return []
        node_ids = set(grid.get_node_ids())
        # Clients that trained this round evaluated in their train reply; the others (not sampled,
        # or whose update was rejected) are asked now. Nodes that dropped out of the round are not
        # waited for again.
        targets = [
            n
            for n in self.directory.nodes.values()
            if n.node_id in node_ids
            and n.node_id not in self._skip_eval
            and n.client not in self.eval_reports
        ]
        if not targets:
            return []
        config["server-round"] = server_round
        config["final"] = server_round == self.cfg.train.rounds
        content = RecordDict({CONFIG: config})
        self._sent = {n.node_id: n.client for n in targets}
        self._messages = [Message(content, n.node_id, MessageType.EVALUATE) for n in targets]
        return self._messages

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        if not self.algorithm.personalized or not self.is_eval_round(server_round):
            return None
        for reply in replies:
            node_id = reply_origin(reply, self._messages)
            if reply.has_error():
                log.warning(
                    "round %d: evaluation on %s failed: %s",
                    server_round,
                    self.directory.describe(node_id),
                    reply.error.reason,
                )
                continue
            info = dict(reply.content[CLIENT_INFO])
            self.eval_reports[str(info["client"])] = ClientReport(
                node_id, str(info["client"]), dict(reply.content[METRICS]), info
            )
        local = [
            r.metrics["local_accuracy"]
            for r in self.ordered_eval_reports()
            if "local_accuracy" in r.metrics
        ]
        return MetricRecord({"local_accuracy": float(np.mean(local))}) if local else None

    def ordered_eval_reports(self) -> list[ClientReport]:
        return sorted(
            self.eval_reports.values(), key=lambda r: self.directory.order.get(r.client, 1 << 30)
        )


# --- Flower's own strategies, configured as fedac's -----------------------------------------------

#: fedac algorithm -> Flower strategy class name (flwr.serverapp.strategy) whose server step is
#: fedac's.
FLOWER_STRATEGIES = {
    "fedavg": "FedAvg",
    "fedprox": "FedProx",
    "fedadam": "FedAdam",
    "fedyogi": "FedYogi",
    "fedadagrad": "FedAdagrad",
    "fedavgm": "FedAvgM",
}


def flower_adam_lr(server_lr: float, beta1: float, beta2: float, server_round: int) -> float:
    """The step size Flower's FedAdam actually takes in `server_round`:
    eta * sqrt(1 - beta2^(t+1)) / (1 - beta1^(t+1)) with t = server_round (Adam's bias correction,
    shifted by one round). fedac's FedAdam (Reddi et al. 2021, Alg. 2) takes `server_lr`
    unchanged."""
    t = server_round + 1.0
    return server_lr * math.sqrt(1 - beta2**t) / (1 - beta1**t)


def flower_strategy(cfg: Config, **sampling: Any) -> Strategy:
    """Flower's built-in strategy for a fedac FedAvg-family algorithm, configured with fedac's
    settings.

        It reproduces fedac's server step (up to float rounding: Flower averages in float32 NumPy,
        fedac in float64) for fedavg / fedprox (weighted mean; the proximal term is client-side),
        fedyogi, fedadagrad and fedavgm, as long as the aggregation is the plain mean and the model
        has no integer buffers (Flower averages those as floats; fedac copies them). Flower's
        FedAdagrad has no server
    momentum (beta_1 fixed at 0); fedac's has Alg. 2's beta1, so it is set on the strategy. FedAdam
    differs: Flower multiplies the
        step by Adam's bias correction (see `flower_adam_lr`), which Reddi et al.'s Alg. 2 and fedac
        do not; it equals fedac's step only with beta1 = beta2 = 0. `sampling` goes to the strategy
        (fraction_train, min_available_nodes, ...).
    """
    import flwr.serverapp.strategy as flower

    if cfg.algorithm not in FLOWER_STRATEGIES:
        raise ConfigError(
            f"Flower has no built-in strategy for '{cfg.algorithm}'; "
            f"use the fedac strategy (known: {', '.join(FLOWER_STRATEGIES)})"
        )
    if cfg.aggregation.method != "mean":
        raise ConfigError(
            f"Flower's {FLOWER_STRATEGIES[cfg.algorithm]} averages; aggregation.method="
            f"{cfg.aggregation.method} needs the fedac strategy"
        )
    if cfg.aggregation.weighting != "n_k":  # Flower's strategies weight every mean by num-examples
        raise ConfigError(
            f"Flower's {FLOWER_STRATEGIES[cfg.algorithm]} weights by n_k; aggregation.weighting="
            f"{cfg.aggregation.weighting} needs the fedac strategy"
        )
    cls = getattr(flower, FLOWER_STRATEGIES[cfg.algorithm])
    opt = cfg.fedopt
    if cfg.algorithm == "fedprox":
        return cls(proximal_mu=cfg.fedprox.mu, **sampling)
    if cfg.algorithm == "fedavgm":
        # Flower steps x - lr * (momentum * v + (x - mean)); fedac x + lr * (momentum * m + (mean -
        # x)): same.
        return cls(
            server_learning_rate=opt.avgm_server_lr, server_momentum=opt.momentum, **sampling
        )
    if cfg.algorithm == "fedadagrad":
        # Flower's FedAdagrad fixes beta_1 = 0 (m_t = Delta_t); Reddi et al.'s Alg. 2 and fedac keep
        # the momentum m_t = beta1 m_{t-1} + (1 - beta1) Delta_t. The attribute is what its update
        # reads.
        strategy = cls(eta=opt.server_lr, eta_l=cfg.train.lr, tau=opt.tau, **sampling)
        strategy.beta_1 = opt.beta1
        return strategy
    if cfg.algorithm in ("fedadam", "fedyogi"):
        # eta_l (client learning rate) is only logged by Flower; fedac's is train.lr.
        return cls(
            eta=opt.server_lr,
            eta_l=cfg.train.lr,
            beta_1=opt.beta1,
            beta_2=opt.beta2,
            tau=opt.tau,
            **sampling,
        )
    return cls(**sampling)
