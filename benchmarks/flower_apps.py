"""The Flower side of bench_cohort.py's `flower` part: `flwr run benchmarks <local simulation>`.

This folder is a Flower app (benchmarks/pyproject.toml); the run-config key `workload` picks what
runs:

- `w`: workload W written the way a Flower user writes it -- a ClientApp that loads the global
  CRNN-Lite from the message, runs one local epoch of SGD on its partition and replies with the new
  weights, and a ServerApp running Flower's own FedAvg (`fraction_train` 0.1 of 100 nodes). No fedac
  code on the training path except the model definition (`build_model`), so it measures Flower.
- `fedmlac`: the fedac Flower app itself (`fedac.flower.clientapp` / `serverapp`, unchanged), with
  the personalized CRNN-Base models in each node's `context.state`; only its data source is replaced
  by the benchmark's random features (`workloads.uniform_federation`), the same clients fedac
  trains.

The ServerApp writes time marks (`time.time()`, comparable with the launching process's clock) to
the run-config's `marks-file` after each event: `serverapp_start`, `round_start` (one per round; for
W the end of round t is the start of round t + 1), `serverapp_end`.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

import fedac.engine.simulator as fedac_simulator
from fedac.flower import clientapp as fedac_clientapp
from fedac.flower import serverapp as fedac_serverapp
from fedac.models import build_model
from workloads import CLASSES, FEATURES, W_PER_ROUND, uniform_federation


def benchmark_data(cfg, progress: bool = True, device=None):
    """fedac's dataset builder for this benchmark: `data.num_clients` clients of random features (on
    the CPU, where the benchmark's apps train; `device` is the builder's signature)."""
    return uniform_federation(cfg.data.num_clients)


def use_benchmark_data() -> None:
    """Point the fedac apps at the benchmark's data (ServerApp: the Simulator's validation / test
    splits; ClientApp: each node's client); nothing else in them changes. Done on first use, not on
    import, so importing this module changes nothing."""
    fedac_clientapp.build_federated_data = benchmark_data
    fedac_simulator.build_federated_data = benchmark_data


class Marks:
    def __init__(self, path: str):
        self.path = Path(path)
        self.marks: list[tuple[str, float]] = []

    def add(self, event: str) -> None:
        self.marks.append((event, time.time()))
        tmp = self.path.with_name(f".{self.path.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.marks))
        os.replace(tmp, self.path)


class RoundStarts(logging.Handler):
    """Marks each round's start from the fedac strategy's 'round t: training ...' log line."""

    def __init__(self, marks: Marks):
        super().__init__(logging.INFO)
        self.marks = marks

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, str) and record.msg.startswith("round %d: training"):
            self.marks.add("round_start")


# --- workload W, plain Flower ---------------------------------------------------------------------


def crnn_lite(dropout: float = 0.1) -> torch.nn.Module:
    return build_model("crnn_lite", FEATURES, CLASSES, dropout)


def w_train(msg: Message, context: Context) -> Message:
    torch.set_num_threads(int(context.run_config["torch-threads"]))
    clients = uniform_federation(int(context.node_config["num-partitions"])).clients
    client = clients[int(context.node_config["partition-id"])]
    model = crnn_lite()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=float(context.run_config["lr"]))
    losses = []
    for idx in torch.randperm(client.num_samples).split(16):
        loss = F.cross_entropy(model(client.x[idx]), client.y[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    metrics = MetricRecord(
        {"train_loss": sum(losses) / len(losses), "num-examples": client.num_samples}
    )
    return Message(
        RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}), reply_to=msg
    )


def w_main(grid: Grid, context: Context, marks: Marks) -> None:
    nodes = int(context.run_config["nodes"])
    strategy = FedAvg(
        fraction_train=W_PER_ROUND / nodes,
        fraction_evaluate=0.0,
        min_available_nodes=nodes,
        min_train_nodes=W_PER_ROUND,
    )
    torch.manual_seed(0)

    def mark_round(server_round: int, arrays: ArrayRecord) -> None:
        marks.add("round_start")  # called before round 1 and after every round
        return None

    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(crnn_lite().state_dict()),
        num_rounds=int(context.run_config["rounds"]),
        evaluate_fn=mark_round,
    )


# --- the apps -------------------------------------------------------------------------------------


def is_fedmlac(context: Context) -> bool:
    return str(context.run_config["workload"]) == "fedmlac"


clientapp = ClientApp()


@clientapp.train()
def train(msg: Message, context: Context) -> Message:
    return fedac_app(msg, context) if is_fedmlac(context) else w_train(msg, context)


@clientapp.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return fedac_app(msg, context)


@clientapp.query()
def query(msg: Message, context: Context) -> Message:
    return fedac_app(msg, context)


def fedac_app(msg: Message, context: Context) -> Message:
    use_benchmark_data()
    return fedac_clientapp.app(msg, context)


serverapp = ServerApp()


@serverapp.main()
def main(grid: Grid, context: Context) -> None:
    marks = Marks(str(context.run_config["marks-file"]))
    marks.add("serverapp_start")
    if is_fedmlac(context):
        use_benchmark_data()
        handler = RoundStarts(marks)
        logging.getLogger("fedac.flower").addHandler(handler)
        try:
            fedac_serverapp.main(grid, context)
        finally:
            logging.getLogger("fedac.flower").removeHandler(handler)
    else:
        w_main(grid, context, marks)
    marks.add("serverapp_end")
