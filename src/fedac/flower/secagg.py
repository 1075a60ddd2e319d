"""Secure aggregation: FedAvg-style uploads through Flower's SecAgg+ (run-config `secagg=true`).

What it protects: the ServerApp never sees a client's parameters. Each sampled client quantizes its
weighted update, adds pairwise masks (cancelling in the sum) and a private mask, and uploads the
result; the server learns only the sum of the cohort's updates, once enough clients (the
reconstruction threshold) hand in the shares that remove the masks -- also those of clients that
dropped out mid-round. n_k, the client's name and its training loss still travel in the clear
(fedac's diagnostics).

How it runs (Flower 1.41): SecAgg+ exists only as a legacy workflow, `SecAggPlusWorkflow`
(flwr/server/workflow/secure_aggregation/secaggplus_workflow.py), which drives a legacy
`flwr.server.strategy`-style object through a `LegacyContext`, with the ClientApp's `secaggplus_mod`
(flwr/client/mod/secure_aggregation/secaggplus_mod.py) on the node. `SecAggStrategy` replaces
`Strategy.start` by a round loop that runs that workflow each round; its `configure_fit` samples the
simulator's cohort and `aggregate_fit` receives only the unmasked aggregate (Flower writes the same
aggregate into every client's FitRes, secaggplus_workflow.py:652-656). On the node, `secagg_mod`
hands the four SecAgg+ stages to Flower's mod and, for the masked-vector stage, runs fedac's normal
`train` (fedac.flower.clientapp) and turns its upload into the update the mod masks.

What is summed, and the weights: client k sends Delta_k = theta_k - theta (every entry of the
broadcast, in float64), not theta_k: updates are small, so the clipping range [-C, C] can be tight
and the quantization fine. Flower's mod multiplies the update by w_k = round(Q n_k / W) / Q
(secaggplus_mod.py:244-257), clips to [-C, C], quantizes stochastically onto Q levels
(quantization.py: step 2C/Q) and sends the quantized w_k along; the server divides the unmasked sum
by sum_k w_k (secaggplus_workflow.py:639-650). So the result is fedac's n_k-weighted mean (Eq. 3) of
Delta_k, and theta + that mean is what FedAvg's server step sees (`Algorithm.server_update` with
that one average, which `weighted_mean` returns unchanged, and on which FedAdam / FedYogi /
FedAdagrad / FedAvgM take their server step).

W (run-config secagg-max-weight): Flower needs W >= n_k or the sum may overflow, and the
quantization error grows as W / n_k. By default (0) W is the largest n_k of the round's cohort,
which the server knows anyway (nodes announce n_k): then max_k w_k = 1 and sum_k w_k >= 1.

Quantization error, per entry of the aggregated update (with K the clients whose vectors were
summed):
    |mean_secagg - mean_exact| <= K * (2C / Q) / sum_k w_k + 2 * max_k |rel. error of w_k| * max_k
    |Delta_k|
(each client's stochastic rounding is off by less than one step 2C/Q; w_k's rounding is at most
W / (2 Q n_k) relative). With the defaults C = 8, Q = 2**22 and W = max n_k: below K * 3.8e-6. An
entry of w_k Delta_k outside [-C, C] is clipped (the node logs a warning). K * Q must stay below
Flower's modulus 2**32 (checked each round).

Integer entries (e.g. BatchNorm's step counter) are summed like the others and rounded; the
simulator's FedAvg copies the first client's instead (aggregation.weighted_mean), so such models
differ there.

Refused, with the setting to change (`refuse_unsupported`): anything whose server step needs each
client's upload, not their weighted mean -- LPA (FedMLAC) and the robust rules (aggregation.method),
FedKAD / FedKWS-UI / zero-shot / early-exit / central server steps, server-side DP (dp.mode,
clipping each update), model-poisoning attacks (applied to each upload on the server); and
strategy=flower, data-mode=device. Data-poisoning attacks act on the node and combine.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.common import Code, FitIns, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, RECORD_KEY_STATE
from flwr.compat.common import recorddict_compat as compat
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.server_config import ServerConfig
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import (
    MAIN_CONFIGS_RECORD,
    MAIN_PARAMS_RECORD,
)
from flwr.server.workflow.constant import (
    Key as WorkflowKey,
)
from flwr.serverapp import Grid

from fedac.config import Config
from fedac.engine.simulator import sample_cohort
from fedac.errors import ConfigError, FedacError
from fedac.flower import transport
from fedac.flower.settings import DeploymentSettings, SecAggSettings
from fedac.flower.strategy import (
    ARRAYS,
    CLIENT_INFO,
    CONFIG,
    METRICS,
    ClientReport,
    FedacStrategy,
    FlowerRunError,
)
from fedac.settings.compatibility import Deployment
from fedac.settings.compatibility import check as check_combination

log = logging.getLogger("fedac.flower")

#: FitIns config key: the broadcast's entry names, in the order of its arrays.
NAMES = "fedac-names"
#: Flower's SecAgg+ modulus (SecAggPlusWorkflow's default modulus_range); sums must stay below it.
MODULUS = 2**32


def refuse_unsupported(cfg: Config, settings: DeploymentSettings) -> None:
    """ConfigError for every combination SecAgg+ cannot carry (the server only ever sees a weighted
    sum): the compatibility matrix's rules for a deployment with secagg=true
    (settings/compatibility.py)."""
    check_combination(cfg, Deployment(settings.strategy, settings.data_mode, secagg=True))


def secagg_workflow(settings: SecAggSettings, timeout: float | None) -> SecAggPlusWorkflow:
    """Flower's workflow with the run's settings; Flower's own checks become ConfigErrors naming the
    keys."""
    try:
        return SecAggPlusWorkflow(
            settings.num_shares,
            settings.threshold,
            max_weight=settings.max_weight or 1.0,
            clipping_range=float(settings.clipping_range),
            quantization_range=int(settings.quantization_range),
            modulus_range=MODULUS,
            timeout=timeout,
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"run-config secagg-num-shares={settings.num_shares} / "
            f"secagg-threshold={settings.threshold} / "
            f"secagg-quantization-range={settings.quantization_range}: {exc} (Flower's SecAgg+ "
            "rules: an integer num-shares > 2 and threshold < num-shares, or fractions in (0, 1]; "
            f"quantization range < {MODULUS})"
        ) from None


# --- node side ------------------------------------------------------------------------------------


def secagg_mod(
    msg: Message, context: Context, call_next: Callable[[Message, Context], Message]
) -> Message:
    """The ClientApp's train mod: SecAgg+ messages go through Flower's `secaggplus_mod` around
    fedac's `train`; every other message passes untouched."""
    if (
        msg.metadata.message_type != MessageType.TRAIN
        or RECORD_KEY_CONFIGS not in msg.content.config_records
    ):
        return call_next(msg, context)
    return secaggplus_mod(msg, context, lambda m, c: _train_update(m, c, call_next))


def _train_update(
    msg: Message, context: Context, train: Callable[[Message, Context], Message]
) -> Message:
    """FitIns -> fedac's train message; its upload -> the FitRes of the update Delta_k = theta_k -
    theta."""
    fitins = compat.recorddict_to_fitins(msg.content, keep_input=True)
    names = json.loads(str(fitins.config[NAMES]))
    payload = {
        name: torch.from_numpy(np.array(a))
        for name, a in zip(names, parameters_to_ndarrays(fitins.parameters))
    }
    content = RecordDict()
    transport.put(content, ARRAYS, payload)
    content[CONFIG] = ConfigRecord({k: v for k, v in fitins.config.items() if k != NAMES})
    original = msg.content
    msg.content = content
    try:
        reply = train(msg, context)
    finally:
        msg.content = original
    # e.g. a NaN update: this node drops out of the round; SecAgg+ recovers its masks
    if reply.has_error():
        raise FedacError(f"fedac train failed on this node: {reply.error.reason}")
    upload = transport.get(reply.content, ARRAYS)
    metrics = dict(reply.content[METRICS])
    n_k = int(metrics.pop("num-examples"))
    delta = [(upload[name].double() - payload[name].double()).numpy() for name in names]
    _warn_if_clipped(context, delta, n_k)
    info = dict(reply.content[CLIENT_INFO])
    fit_metrics = {
        **metrics,
        "client": str(info["client"]),
        "partition-id": int(info["partition-id"]),
    }
    fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(delta), n_k, fit_metrics)
    return Message(compat.fitres_to_recorddict(fitres, keep_input=True), reply_to=msg)


def _warn_if_clipped(context: Context, delta: list[np.ndarray], n_k: int) -> None:
    state = context.state.config_records[RECORD_KEY_STATE]
    weight = n_k / float(state["max_weight"])
    largest = max((float(np.abs(d).max()) for d in delta if d.size), default=0.0) * weight
    if largest > float(state["clipping_range"]):
        log.warning(
            "secure aggregation: this node's weighted update reaches %.3g, beyond the clipping "
            "range %g; it is clipped (raise run-config secagg-clipping-range)",
            largest,
            float(state["clipping_range"]),
        )


# --- server side ----------------------------------------------------------------------------------


@dataclass
class _Proxy:
    """What SecAggPlusWorkflow reads of a legacy ClientProxy: its node id."""

    node_id: int


class _LegacyStrategy:
    """The two legacy-Strategy calls SecAggPlusWorkflow makes, delegated to the SecAggStrategy."""

    def __init__(self, owner: SecAggStrategy, grid: Grid):
        self.owner, self.grid = owner, grid

    def configure_fit(self, server_round, parameters, client_manager):
        return self.owner.configure_secagg(server_round, self.grid)

    def aggregate_fit(self, server_round, results, failures):
        self.owner.aggregate_secagg(server_round, results, failures)
        return None, {}


class SecAggStrategy(FedacStrategy):
    """fedac's strategy with the uploads summed by SecAgg+: the cohorts, logs and server step are
    FedacStrategy's; only the way the uploads reach `Algorithm.server_update` differs."""

    def __init__(self, algorithm, server, directory, cfg: Config, settings: SecAggSettings):
        super().__init__(algorithm, server, directory, cfg)
        self.secagg = settings
        self.rounds: dict[int, dict[str, Any]] = {}
        """Round -> what the server learnt: clients summed, max_weight, the aggregate's maximum
        |entry|."""
        self._payload: dict[str, torch.Tensor] = {}
        self._aggregated = False

    def configure_secagg(self, server_round: int, grid: Grid) -> list[tuple[_Proxy, FitIns]]:
        known, _ = self.directory.refresh(grid, identify=True)
        live = [n for n in known if n.num_examples > 0]
        names = (
            sample_cohort(
                [n.client for n in live], self.cfg.train.fraction, self.cfg.seed, server_round
            )
            if live
            else []
        )
        if len(names) < 2:
            raise FlowerRunError(
                f"round {server_round}: SecAgg+ needs at least 2 clients per round, the cohort has "
                f"{len(names)} (train.fraction={self.cfg.train.fraction}, {len(live)} usable "
                "clients): raise fraction or connect more SuperNodes"
            )
        if len(names) * int(self.secagg.quantization_range) >= MODULUS:
            raise ConfigError(
                f"{len(names)} clients x "
                f"secagg-quantization-range={self.secagg.quantization_range} reaches SecAgg+'s "
                "modulus 2**32, so the sum would wrap: lower secagg-quantization-range"
            )
        by_client = {n.client: n for n in live}
        self.workflow.max_weight = float(
            self.secagg.max_weight or max(by_client[c].num_examples for c in names)
        )
        self._payload = dict(self.algorithm.broadcast(self.server))
        if not all(isinstance(v, torch.Tensor) for v in self._payload.values()):
            raise ConfigError(
                f"algorithm={self.cfg.algorithm} broadcasts more than a model; set secagg=false"
            )
        config = {
            "server-round": server_round,
            "evaluate": False,
            "final": server_round == self.cfg.train.rounds,
            NAMES: json.dumps(list(self._payload)),
        }
        fitins = FitIns(ndarrays_to_parameters([v.numpy() for v in self._payload.values()]), config)
        self._sent = {by_client[name].node_id: name for name in names}
        log.info(
            "round %d: secure aggregation over %d of %d connected clients: %s (max_weight %g)",
            server_round,
            len(names),
            len(live),
            ", ".join(names),
            self.workflow.max_weight,
        )
        return [(_Proxy(by_client[name].node_id), fitins) for name in names]

    def aggregate_secagg(
        self, server_round: int, results: list[tuple[_Proxy, FitRes]], failures: list
    ) -> None:
        """`results` carry the unmasked weighted mean of the updates (the same for every client),
        never an upload."""
        reports = []
        for proxy, res in results:
            metrics = {k: v for k, v in res.metrics.items() if k not in ("client", "partition-id")}
            reports.append(
                ClientReport(
                    proxy.node_id,
                    str(res.metrics["client"]),
                    {**metrics, "num-examples": res.num_examples},
                )
            )
        reports.sort(key=lambda r: self.directory.order.get(r.client, len(self.directory.order)))
        self.train_reports[server_round] = reports
        answered = {r.node_id for r in reports}
        self.dropped[server_round] = [
            self.directory.describe(n) for n in sorted(set(self._sent) - answered)
        ]
        mean = parameters_to_ndarrays(results[0][1].parameters)
        average = {}
        for (name, reference), update in zip(self._payload.items(), mean):
            value = reference.double() + torch.from_numpy(
                np.asarray(update, dtype=np.float64)
            ).reshape(reference.shape)
            average[name] = (value if reference.is_floating_point() else value.round()).to(
                reference.dtype
            )
        self.server, metrics = self.algorithm.server_update(
            self.server, [(average, 1)], server_round
        )
        losses = [r.metrics["loss"] for r in reports if "loss" in r.metrics]
        self.round_metrics = {
            "clients": float(len(reports)),
            "rejected": 0.0,
            **metrics,
            "train_loss": float(np.mean(losses)) if losses else math.nan,
            "dropped": float(len(self.dropped[server_round])),
        }
        self.rounds[server_round] = {
            "clients": [r.client for r in reports],
            "failures": len(failures),
            "max_weight": self.workflow.max_weight,
            "aggregate_max_abs": max(float(np.abs(u).max()) for u in mean if u.size),
        }
        self._aggregated = True

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config=None,
        evaluate_config=None,
        evaluate_fn=None,
    ):
        """The round loop: SecAgg+ (four message exchanges) for training, then the ServerApp's
        evaluation."""
        self.workflow = secagg_workflow(self.secagg, timeout)
        context = LegacyContext(
            Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={}),
            config=ServerConfig(num_rounds=num_rounds),
            strategy=_LegacyStrategy(self, grid),
        )
        # fedac sends its own payload in FitIns
        context.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord()
        log.info(
            "secure aggregation (SecAgg+): num_shares %s, threshold %s, clipping range %g, "
            "quantization range %d, max_weight %s",
            self.secagg.num_shares,
            self.secagg.threshold,
            self.secagg.clipping_range,
            self.secagg.quantization_range,
            self.secagg.max_weight or "largest n_k of each cohort",
        )
        for server_round in range(1, num_rounds + 1):
            context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord(
                {WorkflowKey.CURRENT_ROUND: server_round}
            )
            self._aggregated = False
            self.workflow(grid, context)
            if not self._aggregated:  # Flower halts when too few clients remain to remove the masks
                log.warning(
                    "round %d: secure aggregation halted (too few clients left for the "
                    "reconstruction threshold); the global state is unchanged",
                    server_round,
                )
                self.dropped[server_round] = [
                    self.directory.describe(n) for n in sorted(self._sent)
                ]
                self.round_metrics = {
                    "clients": 0.0,
                    "rejected": 0.0,
                    "train_loss": math.nan,
                    "dropped": float(len(self._sent)),
                }
            if evaluate_fn is not None:
                evaluate_fn(server_round, self.global_arrays())
