"""The Flower ServerApp: fedac's server side, evaluation and run directory on a Flower SuperLink.

The ServerApp builds the same `Simulator` object as `fedac run` for everything that is not client
training -- the dataset's validation / test splits, the algorithm, validation-based model selection,
`final_results`, metrics.csv / results.json / config.yaml / curves.png -- and replaces the round
loop by Flower's `Strategy.start` with `FedacStrategy`, which sends the algorithm's broadcast to the
sampled SuperNodes and runs `Algorithm.server_update` on their replies. Personalized metrics
(FedMLAC's, FedKAD's own models) are computed on the nodes, where those models live, and reported
back. With run-config `data-mode=device` the server holds only the validation and test splits and
trains whichever device nodes connect (`DeviceServerSide`, fedac.flower.devices).

Besides the `fedac run` outputs the run directory holds:
  server.log           the ServerApp's log (rounds, cohorts, dropped nodes, state digests)
  server_state.pt      the algorithm's global state after the last round (`torch.load`)
  flower_clients.json  per round, which node trained which client from which state
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import flwr
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

from fedac.algorithms.base import Algorithm
from fedac.config import Config, save_config
from fedac.engine.data import build_eval_data
from fedac.engine.evaluation import Evaluator
from fedac.engine.report import final_table, write_history, write_results
from fedac.engine.simulator import Simulator
from fedac.engine.state import RunState
from fedac.errors import ConfigError
from fedac.flower import transport
from fedac.flower.devices import refuse_attacks_on_devices
from fedac.flower.settings import DeploymentSettings, deployment_settings, fedac_config
from fedac.flower.strategy import FedacStrategy, NodeDirectory, PollingGrid, flower_strategy
from fedac.settings.compatibility import Deployment
from fedac.settings.compatibility import check as check_combination

log = logging.getLogger("fedac.flower")

app = ServerApp()


@dataclass
class NodeEvaluator(Evaluator):
    """The simulator's evaluation, with the personalized metrics the nodes report (the server holds
    no client's own model)."""

    strategy: FedacStrategy | None = None

    def personalized_local_accuracy(
        self, state: RunState, rows: list[dict[str, Any]] | None = None
    ) -> list[float]:
        # (the nodes score their own models: the server holds none, so `rows` carry no own scores)
        if self.strategy is None:
            return []
        return [
            r.metrics["local_accuracy"]
            for r in self.strategy.ordered_eval_reports()
            if "local_accuracy" in r.metrics
        ]

    def personalized_test_results(self, state: RunState) -> list[dict[str, float]]:
        if self.strategy is None:
            return []
        return [
            {"accuracy": r.metrics["test_accuracy"], "macro_f1": r.metrics["test_macro_f1"]}
            for r in self.strategy.ordered_eval_reports()
            if "test_accuracy" in r.metrics
        ]


class FlowerServerSide(Simulator):
    """The simulator's data, evaluation and reporting; personalized metrics come from the nodes
    (`NodeEvaluator`), and rounds run on real time (the virtual clock is refused)."""

    evaluator: NodeEvaluator
    evaluator_class = NodeEvaluator


class DeviceServerSide(FlowerServerSide):
    """Device mode (run-config data-mode=device): the server holds only the validation and test
    splits (`build_eval_data`); the clients are whichever device nodes connect, each with its own
    audio."""

    holds_clients = False


def default_run_dir(cfg: Config) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{stamp}-{cfg.algorithm}-{cfg.dataset}-s{cfg.seed}-flower"


def _atomic_torch_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _attach_log(run_dir: Path) -> list[tuple[logging.Logger, logging.Handler]]:
    """server.log gets fedac's and Flower's records; fedac's also go to stderr (streamed by `flwr
    run --stream`)."""
    formatter = logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s")
    file_handler = logging.FileHandler(run_dir / "server.log")
    file_handler.setFormatter(formatter)
    attached: list[tuple[logging.Logger, logging.Handler]] = [
        (logging.getLogger("fedac"), file_handler),
        (logging.getLogger("flwr"), file_handler),
    ]
    fedac_logger = logging.getLogger("fedac")
    if not fedac_logger.handlers:
        stream = logging.StreamHandler(sys.stderr)
        stream.setFormatter(formatter)
        attached.append((fedac_logger, stream))
    fedac_logger.setLevel(logging.INFO)
    for logger, handler in attached:
        logger.addHandler(handler)
    return attached


def _client_log(strategy: FedacStrategy) -> dict[str, Any]:
    return {
        "nodes": {
            str(n.node_id): {
                "client": n.client,
                "partition-id": n.partition_id,
                "num-examples": n.num_examples,
            }
            for n in strategy.directory.nodes.values()
        },
        "rounds": {
            str(r): [
                {
                    "node": rep.node_id,
                    "client": rep.client,
                    **rep.info,
                    **{f"metric.{k}": v for k, v in rep.metrics.items()},
                }
                for rep in reports
            ]
            for r, reports in strategy.train_reports.items()
        },
        "dropped": {str(r): nodes for r, nodes in strategy.dropped.items() if nodes},
    }


def _server_side(cfg: Config, run_dir: Path, device: bool) -> FlowerServerSide:
    """The simulator's server half for this deployment: with device data it holds only the
    validation and test splits (the nodes label their own clips)."""
    if device:
        refuse_attacks_on_devices(cfg)
        return DeviceServerSide(
            cfg, run_dir, data=build_eval_data(cfg, progress=False), progress=False
        )
    return FlowerServerSide(cfg, run_dir, progress=False)


def _round_strategy(
    cfg: Config,
    settings: DeploymentSettings,
    state: RunState,
    side: FlowerServerSide,
    directory: NodeDirectory,
    secure: bool,
):
    """The Flower strategy that runs the rounds, and how to read each round's outcome from it (the
    server state and the round's metrics)."""
    if settings.strategy == "flower":
        refuse_layers(cfg)
        strategy, round_metrics = _flower_builtin(cfg, settings, state, side.algorithm)
        return flower_dp(strategy, cfg, side.privacy), round_metrics
    # run-config secagg=true: the uploads are summed by Flower's SecAgg+ (fedac.flower.secagg)
    if secure and settings.secagg is not None:
        # lazy: start-up time (SecAgg+ workflow)
        from fedac.flower.secagg import SecAggStrategy

        strategy = SecAggStrategy(side.algorithm, state.server, directory, cfg, settings.secagg)
    else:
        # the simulator's server step: attacks and DP over the uploads, the byte ledger, LPA's log
        strategy = FedacStrategy(side.algorithm, state.server, directory, cfg, side.server_step)
        strategy.ledger_state = state  # the bytes per client, for clients.csv (engine/clients.py)
        side.evaluator.strategy = strategy
    return strategy, lambda arrays: (strategy.server, strategy.round_metrics)


def _round_evaluator(
    cfg: Config,
    run_dir: Path,
    side: FlowerServerSide,
    state: RunState,
    strategy,
    round_metrics,
    started: float,
):
    """Flower's `evaluate_fn`: after each round, the new server state, the round's metrics, the
    evaluation every `train.eval_every` rounds (metrics.csv) and the state saved to disk."""

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if server_round == 0:
            return None
        state.server, metrics = round_metrics(arrays)
        row = {"round": float(server_round), **metrics}
        if server_round % cfg.train.eval_every == 0 or server_round == cfg.train.rounds:
            side.evaluator.evaluate_round(state, server_round, row)
            row["wall_seconds"] = time.perf_counter() - started
            state.history.append(row)
            write_history(run_dir, state.history)
            shown = ", ".join(
                f"{k} {row[k]:.4f}"
                for k in ("val_accuracy", "local_accuracy", "train_loss")
                if k in row
            )
            log.info("round %d evaluated: %s", server_round, shown)
        state.round = server_round
        _atomic_torch_save(state.server, run_dir / "server_state.pt")
        if isinstance(strategy, FedacStrategy):
            (run_dir / "flower_clients.json").write_text(
                json.dumps(_client_log(strategy), indent=2, default=str)
            )
        return MetricRecord({k: float(v) for k, v in row.items()})

    return evaluate_fn


def _runtime_record(strategy, directory: NodeDirectory, secure: bool) -> dict[str, Any]:
    """results.json's `runtime` of a deployment: Flower's version, the strategy, and with fedac's
    strategy the node of each client and the dropped nodes; with SecAgg+ its settings and rounds."""
    runtime: dict[str, Any] = {
        "engine": "flower",
        "flwr": flwr.__version__,
        "strategy": type(strategy).__name__,
    }
    if isinstance(strategy, FedacStrategy):
        runtime["nodes"] = {n.client: n.node_id for n in directory.nodes.values()}
        runtime["dropped"] = {str(r): nodes for r, nodes in strategy.dropped.items() if nodes}
    if secure:
        runtime["secagg"] = {
            **vars(strategy.secagg),
            "rounds": {str(r): v for r, v in strategy.rounds.items()},
        }
    return runtime


def run_deployment(
    grid: Grid, cfg: Config, settings: DeploymentSettings, run_dir: Path
) -> dict[str, Any]:
    """Train `cfg` on the SuperNodes connected to `grid`; write and return results.json's
    content."""
    started = time.perf_counter()
    device = settings.data_mode == "device"
    secure = settings.secagg is not None and settings.secagg.enabled
    # Before any data is built: the compatibility matrix with this deployment's settings (SecAgg+
    # refuses what needs each client's upload; compressed uploads what acts before compression).
    check_combination(cfg, Deployment.of(settings))
    side = _server_side(cfg, run_dir, device)
    save_config(cfg, run_dir / "config.yaml")
    state = side._fresh_state()
    # Every message carries the run's label set: device nodes label their own clips with it.
    # (Workloads built without a manifest, such as benchmarks/flower_apps.py's, have no label names
    # to send.)
    manifest = side.data.manifest
    announce = {"classes": list(manifest.classes)} if manifest is not None else {}
    directory = NodeDirectory(
        side.data.task.clients,
        settings.min_nodes,
        settings.node_wait,
        settings.round_timeout,
        settings.poll_interval,
        open_roster=device,
        announce=announce,
    )
    polling = PollingGrid(grid, settings.poll_interval, directory.describe)
    strategy, round_metrics = _round_strategy(cfg, settings, state, side, directory, secure)
    initial = transport.to_records(side.algorithm.broadcast(state.server))[0]
    strategy.start(
        grid=polling,
        initial_arrays=initial,
        num_rounds=cfg.train.rounds,
        timeout=settings.round_timeout,
        evaluate_fn=_round_evaluator(cfg, run_dir, side, state, strategy, round_metrics, started),
        train_config=ConfigRecord(announce),
        evaluate_config=ConfigRecord(announce),
    )
    results = side.final_results(state)
    # the clients are the nodes (client_accuracy_* stay NaN: their held-out data never left them)
    if device:
        results["clients"] = len(directory.nodes)
    results["wall_seconds"] = time.perf_counter() - started
    results["runtime"] = _runtime_record(strategy, directory, secure)
    # named like the simulator's: each ClientApp call trains its one client (training/step.py)
    results["execution"] = "sequential: a Flower ClientApp trains one client per message"
    write_results(run_dir, results, cfg)
    log.info("fedac run finished\n%s\nrun directory: %s", final_table(results), run_dir)
    return results


def refuse_layers(cfg: Config) -> None:
    """Flower's built-in strategies know nothing of fedac's attacks (nor of client-side clipping
    here): say so instead of ignoring them. dp.mode=central goes through Flower's own DP wrapper
    (`flower_dp`)."""
    if cfg.attack.kind != "none" or cfg.dp.mode == "client":
        raise ConfigError(
            f"attack.kind={cfg.attack.kind} / dp.mode={cfg.dp.mode} run through the fedac "
            "strategy; set strategy=fedac (the default) in the run config"
        )


def flower_dp(strategy, cfg: Config, privacy):
    """dp.mode=central on a built-in strategy: Flower's DifferentialPrivacyServerSideFixedClipping
    (each update clipped to dp.clip, the strategy's mean, Gaussian noise of std z * C / m with m the
    cohort size). Flower's FedAvg weights the clipped updates by n_k where fedac's DP-FedAvg
    (privacy.py) does not, so the two agree when clients hold equal data; epsilon comes from fedac's
    accountant either way."""
    if cfg.dp.mode != "central":
        return strategy
    from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping

    return DifferentialPrivacyServerSideFixedClipping(
        strategy, cfg.dp.noise_multiplier, cfg.dp.clip, privacy.cohort
    )


def _flower_builtin(
    cfg: Config, settings: DeploymentSettings, state: RunState, algorithm: Algorithm
):
    """Flower's own strategy for a FedAvg-family algorithm, and how to read each round's outcome
    from it."""
    if cfg.algorithm == "fedadam":
        log.warning(
            "Flower's FedAdam applies Adam's bias correction to the server step; fedac's FedAdam "
            "(Reddi et al., Alg. 2) does not, so this run will not reproduce `fedac run` (use "
            "strategy=fedac for that)"
        )
    recorded: dict[str, Any] = {}

    def train_metrics(records, weight_key):
        recorded["clients"] = float(len(records))
        recorded["metrics"] = aggregate_metricrecords(records, weight_key)
        return recorded["metrics"]

    strategy = flower_strategy(
        cfg,
        fraction_train=cfg.train.fraction,
        fraction_evaluate=0.0,
        min_available_nodes=settings.min_nodes,
        min_train_nodes=1,
        train_metrics_aggr_fn=train_metrics,
    )
    log.info(
        "server side: Flower's %s (node sampling is Flower's, not seeded by fedac)",
        type(strategy).__name__,
    )

    def round_metrics(arrays: ArrayRecord) -> tuple[dict[str, Any], dict[str, float]]:
        metrics = {"clients": recorded.pop("clients", 0.0)}
        aggregated = dict(recorded.pop("metrics", {}) or {})
        if "loss" in aggregated:  # Flower weights client losses by n_k; the simulator averages them
            metrics["train_loss"] = float(aggregated["loss"])
        params = transport.from_records(arrays)
        reference = algorithm.global_params(state.server)
        # Flower's FedAdam returns float64 under NumPy 2: keep the model's own dtypes.
        params = {k: v.to(reference[k].dtype) if k in reference else v for k, v in params.items()}
        return algorithm.with_global_params(state.server, params), metrics

    return strategy, round_metrics


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = fedac_config(context.run_config)
    settings = deployment_settings(context.run_config)
    run_dir = (settings.run_dir or default_run_dir(cfg)).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg.out = str(run_dir)
    attached = _attach_log(run_dir)
    try:
        log.info(
            "fedac %s on Flower %s: run directory %s", cfg.algorithm, flwr.__version__, run_dir
        )
        run_deployment(grid, cfg, settings, run_dir)
    except Exception:
        log.exception("the fedac ServerApp failed")
        raise
    finally:
        for logger, handler in attached:
            logger.removeHandler(handler)
            if isinstance(handler, logging.FileHandler):
                handler.close()
