"""The single-machine simulator: sample a cohort, run the algorithm's client side for each member,
run its server side, evaluate on validation, checkpoint. No algorithm logic lives here.

Reproducibility and resume: the cohort of round t, each client's batch order and its dropout masks
derive from (seed, t, client) only, and the checkpoint holds the global state, every persistent
client state and the history. A run resumed from round r's checkpoint therefore produces exactly the
parameters of an uninterrupted run.
"""

from __future__ import annotations

import copy
import logging
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from fedac.algorithms import build_algorithm
from fedac.algorithms.base import Algorithm
from fedac.config import Config
from fedac.engine.clients import client_summary, log_clients, own_scores, test_confusion
from fedac.engine.clock.selection import Selection, build_selection
from fedac.engine.data import FederatedData, build_federated_data, record_bad_files
from fedac.engine.distributed import (
    Round,
    current_world,
    evaluation,
    how_shared,
    owner,
    run_shared,
    sums_uploads,
)
from fedac.engine.execution import ExecutionPlan, check_execution
from fedac.engine.report import truncate_client_rows, truncate_pruning_log, write_history
from fedac.engine.run import RoundDriver
from fedac.engine.server_step import Arrival, ServerStep, StepResult
from fedac.engine.state import BestModel, RunState, SystemBook
from fedac.engine.system import (
    CLOCK_METRICS,
    SYSTEM_CSV,
    SystemClock,
    count_flops,
    difference,
    system_active,
)
from fedac.engine.tracking import check_trackers
from fedac.errors import ConfigError
from fedac.rules.attacks import Attack
from fedac.rules.compression import Compressor
from fedac.rules.privacy import Privacy
from fedac.seeding import numpy_rng
from fedac.training.device import device_name, nbytes, place, to_device
from fedac.training.evaluate import evaluate, kws_rates, selection_score, window_accuracy
from fedac.training.metrics import mean_std
from fedac.training.packing import client_home
from fedac.training.runtime import start_runtime
from fedac.training.schedule import step_sizes
from fedac.training.stacking import client_progress
from fedac.training.step import train_client
from fedac.training.types import ClientData, usable

log = logging.getLogger(__name__)


def sample_cohort(clients: list[str], fraction: float, seed: int, round_idx: int) -> list[str]:
    """ceil-free active ratio: max(1, round(fraction * N)) clients, drawn without replacement from
    (seed, round)."""
    if not 0 < fraction <= 1:
        raise ConfigError(f"train.fraction must lie in (0, 1], got {fraction}")
    size = max(1, int(round(fraction * len(clients))))
    picked = numpy_rng(seed, "cohort", round_idx).choice(len(clients), size, replace=False)
    return [clients[i] for i in sorted(picked)]


def tagged(
    views: dict[str, dict[str, float]], prefix: str = "", suffix: str = ""
) -> dict[str, float]:
    """The further views' metrics (Algorithm.evaluate_views) as flat keys
    <prefix><tag>_<suffix><key>."""
    return {
        f"{prefix}{tag}_{suffix}{k}": v
        for tag, metrics in views.items()
        for k, v in metrics.items()
    }


class Simulator(RoundDriver):
    #: False for a server whose clients hold their data elsewhere (the Flower ServerApp in device
    #: mode).
    holds_clients = True
    #: False for a server whose rounds run on real time (Flower's): the virtual clock is refused.
    virtual_time = True

    def __init__(
        self,
        cfg: Config,
        run_dir: str | Path,
        data: FederatedData | None = None,
        progress: bool = True,
    ):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.progress = progress
        self.world = current_world()  # several processes (torchrun): engine/distributed.py
        check_trackers(cfg.log)  # a missing tracker extra fails here, not after training
        check_execution(cfg.runtime.execution)
        # Resolved once, before the data is built (a missing GPU fails at once), and passed down.
        self.runtime = start_runtime(cfg.runtime)
        self.device = self.runtime.device
        self.data = data or build_federated_data(cfg, progress, self.device)
        record_bad_files(self.run_dir, self.data)  # data.on_bad_file=skip: the files left out
        self.algorithm: Algorithm = build_algorithm(cfg, self.data.task, self.runtime)
        #: How the clients train (runtime.execution=cohort that cannot stack fails here, at start).
        self.plan = ExecutionPlan.for_run(self.algorithm, writes=self.world.writes)
        self.trainable = [c.name for c in self.data.clients if c.num_samples > 0]
        if self.holds_clients and not self.trainable:
            raise ConfigError(f"no client holds training data for dataset {cfg.dataset}")
        # Poisoned clients and DP act as layers over client data and uploads (attacks.py,
        # privacy.py).
        self.attack = Attack(cfg, [c.name for c in self.data.clients])
        self.data = self.attack.poison_data(self.data)
        self.attack.prepare_success_rate(self.data)
        # Built on the host, then on the run's device for every round (training/device.py); the
        # clients' data and models stay on the host instead when they do not fit there
        # (`runtime.client_memory`).
        self.client_home = client_home(
            self.runtime.client_memory, self.device, self._resident_bytes
        )
        self.data = place(self.data, self.device, clients_on=self.client_home)
        self.attack.backdoor_test = to_device(self.attack.backdoor_test, self.device)
        # the clients of every round (the size depends on the fraction and the client count only)
        self.cohort_size = (
            len(sample_cohort(self.trainable, cfg.train.fraction, cfg.seed, 1))
            if self.trainable
            else 0
        )
        # (a device-mode server holds no clients)
        self.privacy = Privacy(
            cfg,
            len(self.trainable),
            self.cohort_size,
            type(self.algorithm).dp_compatible,
            type(self.algorithm).lpa_setting,
        )
        kind = type(self.algorithm)  # (uploads of the broadcast's form: compressible)
        compression = Compressor(cfg, kind.dp_compatible or kind.sums_uploads)
        self.server_step = ServerStep(
            self.algorithm, self.attack, self.privacy, self.run_dir, compression
        )
        # over several processes: one all-reduce of the weighted sums where nothing needs each
        # upload
        self.sums = self.world.distributed and sums_uploads(
            self.algorithm, self.attack, self.privacy
        )
        #: The virtual clock (system.*), or None: the ideal federation.
        self.clock = self._start_clock()
        #: Who trains each round (selection.*; engine/clock/selection.py).
        self.selector = self._start_selection()
        # over several processes: a client's persistent state lives on its owner alone (memory / N
        # per rank)
        if self.world.distributed and (
            type(self.algorithm).personalized
            or type(self.algorithm).init_client_state is not Algorithm.init_client_state
        ):
            owners = {c.name: owner(i, self.world.size) for i, c in enumerate(self.data.clients)}
            self.state_owner = owners.__getitem__

    def _start_clock(self) -> SystemClock | None:
        self._flops: dict[str, float] = {}
        cfg = self.cfg
        if not system_active(cfg.system):
            return None
        if not self.virtual_time:
            raise ConfigError(
                "system.* models devices and time in the simulator; a Flower deployment runs on "
                "its nodes' real clocks (leave system.* at its defaults)"
            )
        clock = SystemClock(
            cfg,
            {name: self.data.client(name).num_samples for name in self.trainable},
            self._trained_model,
            self._flops_per_sample,
            type(self.algorithm).dp_compatible,
            self.algorithm.partial_work,
        )
        if clock.asynchronous:  # each upload is re-based on its own: no all-reduced sum
            self.sums = False
            if self.server_step.compression is not None:
                raise ConfigError(
                    f"system.mode={cfg.system.mode} with compression.method="
                    f"{cfg.compression.method}: the async modes re-base each update by its "
                    "staleness before the server step, where compression (and its error feedback) "
                    "acts; they are not combined yet: use system.mode=sync, or no compression"
                )
        return clock

    def _start_selection(self) -> Selection:
        """The clock's selection rule, or without the clock one of its own."""
        cfg = self.cfg
        if not self.virtual_time and cfg.selection.method != "random":
            raise ConfigError(
                f"selection.method={cfg.selection.method} chooses clients in the simulator; a "
                "Flower deployment samples uniformly (leave selection.method=random)"
            )
        if self.clock is not None:
            return self.clock.selector
        sizes = {n: self.data.client(n).num_samples for n in self.trainable}
        return build_selection(cfg, sizes, False)

    def holds(self, name: str) -> bool:
        """Whether this process holds (and trains) client `name`'s persistent state."""
        return self.state_owner is None or self.state_owner(name) == self.world.rank

    # --- state ---------------------------------------------------------------------------------
    def _fresh_state(self) -> RunState:
        return RunState(self.cfg.algorithm, self.algorithm.init_server())

    def _client_state(self, state: RunState, name: str) -> Any:
        """The client's persistent state where it lives between rounds (`self.client_home`)."""
        if name not in state.clients:
            state.clients[name] = self._homed(self.algorithm.init_client_state(name))
        return state.clients[name]

    def _homed(self, obj: Any) -> Any:
        return to_device(obj, self.client_home, pin=self.client_home != self.device)

    def _resident_bytes(self) -> int:
        """Bytes of every client's data and persistent state (one state measured per
        architecture)."""
        per_arch: dict[str, int] = {}
        for name in self.trainable:
            arch = self.algorithm.client_architecture(name)
            if arch not in per_arch:
                per_arch[arch] = nbytes(self.algorithm.init_client_state(name))
        states = sum(per_arch[self.algorithm.client_architecture(name)] for name in self.trainable)
        return states + sum(nbytes(c) for c in self.data.clients)

    def _client_data(self, name: str) -> ClientData:
        """A client's data on the run's device (a copy when it lives on the host)."""
        return to_device(self.data.client(name), self.device)

    # --- one round -----------------------------------------------------------------------------
    def run_round(self, state: RunState, round_idx: int) -> dict[str, float]:
        self.selector.bind(state.selection)
        if self.clock is not None and self.clock.asynchronous:
            return self._async_round(state, round_idx)
        # (compression.download=true: what the clients receive is the quantised broadcast)
        payload = self.server_step.broadcast(self.algorithm.broadcast(state.server), round_idx)
        if self.clock is None:
            names = self.selector.choose(
                self.trainable, self.cohort_size, ("cohort", round_idx), round_idx
            )
            limits: dict[str, int | None] = {}
            clock: dict[str, float] = {}
        else:  # the clock decides who counts before anyone trains (engine/system.py)
            kept, clock = self.clock.sync_round(
                self._book(state), round_idx, self.cohort_size, *self._traffic(payload)
            )
            names, limits = [o.client for o in kept], {o.client: o.steps for o in kept}
        results, datas = self._train(state, payload, names, round_idx, limits)
        arrivals = [
            Arrival(
                name,
                r.upload,
                self._weight(name, data.num_samples, limits.get(name)),
                r.metrics.get("loss", math.nan),
                r.state,
            )
            for name, data, r in zip(names, datas, results)
        ]
        self.selector.observe(round_idx, {a.client: a.loss for a in arrivals})
        step = self.server_step(state, payload, arrivals, round_idx, summed=results.summed)
        self._commit(state, step, names, [r.state for r in results], round_idx)
        return {**step.metrics, **clock}

    def _train(
        self,
        state: RunState,
        payload: Any,
        names: list[str],
        round_idx: int,
        limits: dict[str, int | None] | None = None,
    ) -> tuple[Round, list[ClientData]]:
        """The updates of clients `names` from `payload` (each to its step limit, where the clock
        set one), on the run's execution plan, with their data."""
        datas = [self._client_data(name) for name in names]
        if limits:
            datas = [replace(d, step_limit=limits.get(d.name)) for d in datas]
        states = [
            to_device(self._client_state(state, name), self.device) if self.holds(name) else None
            for name in names
        ]  # (the others' states live on their owners)
        # (autocast inside; over several processes each trains its share and all get every result)
        results = run_shared(
            self.world,
            self.plan,
            payload,
            states,
            datas,
            round_idx,
            self.cfg.seed,
            usable if self.sums else None,
            [self.state_owner(n) for n in names] if self.state_owner is not None else None,
        )
        state.auto_choice = dict(self.plan.measured)  # a measured path, kept for a resume
        return results, datas

    def _commit(
        self,
        state: RunState,
        step: StepResult,
        names: list[str],
        states: list[Any],
        round_idx: int,
    ) -> None:
        """The round's new global state, and the new persistent states of the clients whose
        uploads the server accepted."""
        state.server = step.server
        accepted = set(step.accepted)
        for name, new in zip(names, states):
            if name not in accepted:
                continue
            if new is not None and self.holds(name):
                state.clients[name] = self._homed(new)
            state.visits[name] = state.visits.get(name, 0) + 1
        if self.world.traffic:  # (benchmarks and tests: the states this process holds)
            self.world.log_held(round_idx, len(state.clients), nbytes(state.clients))

    def _weight(self, name: str, samples: int, steps: int | None) -> int:
        """n_k, or with partial work the samples the client processed (at least 1)."""
        if steps is None or self.clock is None:
            return samples
        return max(1, round(samples * self.clock.share_done(name, steps)))

    # --- the virtual clock (engine/system.py) ---------------------------------------------------
    def _book(self, state: RunState) -> SystemBook:
        if state.system is None:
            state.system = SystemBook()
        return state.system

    def _traffic(self, payload: Any) -> tuple[int, int]:
        """Bytes a client downloads and uploads in one update, for the clock: the upload is taken
        to be a model of the broadcast's form, at its compressed size where compression is on."""
        compression = self.server_step.compression
        if compression is None:
            return nbytes(payload), nbytes(payload)
        down = compression.broadcast_bytes(payload)
        return (nbytes(payload) if down is None else down), compression.wire_bytes(payload, payload)

    def _trained_model(self, client: str) -> str:
        """The model a client trains (its own for personalized methods, else the shared one): what
        its FLOPs are counted for."""
        if type(self.algorithm).personalized:
            return self.algorithm.client_architecture(client)
        return self.cfg.model.name

    def _flops_per_sample(self, arch: str) -> float:
        """Training FLOPs per sample of one local step of `arch` under this run's method, counted
        once on one real local update of the smallest client of that architecture."""
        known = self._flops  # (counted again on resume: a count does not vary)
        if arch not in known:
            name = min(
                (c for c in self.trainable if self._trained_model(c) == arch),
                key=lambda c: (self.data.client(c).num_samples, c),
            )
            data = self._client_data(name)
            algorithm = self.algorithm
            # (any model's values do: a count depends on the shapes; the global RNG is restored)
            with client_progress(lambda done: None):  # (not one of the round's clients)
                flops = count_flops(
                    lambda: train_client(
                        algorithm,
                        algorithm.broadcast(algorithm.init_server()),
                        self._homed(self.algorithm.init_client_state(name)),
                        data,
                        0,
                        self.cfg.seed,
                    )
                )
            samples = sum(step_sizes(data.num_samples, self.cfg.train))
            known[arch] = flops / max(1, samples)
        return known[arch]

    def _async_round(self, state: RunState, round_idx: int) -> dict[str, float]:
        """FedBuff / FedAsync (engine/system.py): events until the next server update."""
        clock, book = self.clock, self._book(state)
        assert clock is not None
        started = book.time
        payload = self.server_step.broadcast(self.algorithm.broadcast(state.server), round_idx)
        traffic = self._traffic(payload)
        slots = clock.concurrency(self.cohort_size)
        need = 1 if self.cfg.system.mode == "fedasync" else self.cfg.system.buffer
        counts = {"sampled": 0.0, "dropped": 0.0, "stale": 0.0}
        while len(book.buffer) < need:
            counts["sampled"] += clock.dispatch(book, slots, *traffic)
            if not book.jobs:
                clock.wait(book)
                continue
            job = clock.next_event(book)
            if job["status"] != "arrived":
                counts["dropped"] += 1
            elif book.version - job["version"] > self.cfg.system.max_staleness:
                counts["stale"] += 1
            else:
                book.buffer.append(job)
        self._train_version(state, book, payload, round_idx)
        applied, book.buffer = book.buffer, []
        staleness = [book.version - job["version"] for job in applied]
        arrivals = [
            Arrival(
                job["client"],
                clock.rebased(job, payload, book.version),
                self.data.client(job["client"]).num_samples,
                job["result"].metrics.get("loss", math.nan),
                job["result"].state,
            )
            for job in applied
        ]
        self.selector.observe(round_idx, {a.client: a.loss for a in arrivals})
        step = self.server_step(state, payload, arrivals, round_idx)
        self._commit(
            state, step, [a.client for a in arrivals], [a.state for a in arrivals], round_idx
        )
        book.version += 1
        return {
            **step.metrics,
            "virtual_time_s": book.time,
            "round_s": book.time - started,
            **counts,
            "arrived": float(len(applied)),
            "mean_staleness": float(np.mean(staleness)),
        }

    def _train_version(
        self, state: RunState, book: SystemBook, payload: Any, round_idx: int
    ) -> None:
        """Train, as one stacked call, every job dispatched on the current model version that will
        deliver and has not trained yet (the model is about to change). FedBuff keeps each update
        as its difference from the model it started from."""
        pending = [
            job
            for job in book.jobs + book.buffer
            if job["version"] == book.version
            and job["status"] == "arrived"
            and job["result"] is None
        ]
        if not pending:
            return
        results, _ = self._train(state, payload, [job["client"] for job in pending], round_idx)
        for job, result in zip(pending, results):
            if self.cfg.system.mode == "fedbuff":
                result = replace(result, upload=difference(result.upload, payload))
            job["result"] = result

    def _personalized_models(self, state: RunState, clients: list[ClientData] | None = None):
        """(client, its own model) for every client (of `clients`, default all) that has trained at
        least once (the others still hold their random initial weights); nothing for
        non-personalized methods."""
        for client in self.data.clients if clients is None else clients:
            if not state.visits.get(client.name):
                continue
            own = self.algorithm.personalized_model(
                client.name, self._client_state(state, client.name)
            )
            if own is not None:
                yield to_device(client, self.device), own

    def _personalized_local_accuracy(
        self, state: RunState, rows: list[dict[str, Any]] | None = None
    ) -> list[float]:
        """Each client's own model on its local held-out windows (empty for non-personalized
        methods): read from this evaluation's clients.csv `rows` when given (each own model is then
        scored once a round, not twice; the same accuracy, computed as `window_accuracy` does), else
        scored here."""
        if rows is not None:
            return [row["own_accuracy"] for row in rows if "own_accuracy" in row]
        batch = self.cfg.train.eval_batch_size
        return list(
            own_scores(
                self, state, lambda c, own: window_accuracy(own, c.holdout_x, c.holdout_y, batch)
            ).values()
        )

    def _personalized_test_results(self, state: RunState) -> list[dict[str, float]]:
        """Each client's own model on the test split (empty for non-personalized methods). The
        Flower ServerApp overrides this and `_personalized_local_accuracy` with what its nodes
        report."""
        # (over several processes each scores its share: clients.own_scores)
        batch = self.cfg.train.eval_batch_size
        return list(
            own_scores(
                self, state, lambda _, own: evaluate(own, self.data.eval_split("test"), batch)
            ).values()
        )

    def _evaluate_round(self, state: RunState, round_idx: int, row: dict[str, float]) -> None:
        """Validation metrics of the global model (kept as `best` when they improve); personalized
        methods also log their clients' mean local held-out accuracy. Every client's scores go to
        clients.csv."""
        rows = log_clients(self, state, round_idx)
        local = self._personalized_local_accuracy(state, rows)
        if local:
            row["local_accuracy"] = mean_std(local)[0]
        model = self.algorithm.global_model(state.server)
        if model is None:
            return
        val, views = self.algorithm.evaluate_views(
            model, self.data.val, self.cfg.train.eval_batch_size
        )
        row.update({f"val_{k}": v for k, v in val.items()})
        row.update(tagged(views, "val_"))
        if self.cfg.train.test_curve:  # a curve only: selection below reads validation alone
            row["test_accuracy"] = evaluate(
                model, self.data.eval_split("test"), self.cfg.train.eval_batch_size
            )["accuracy"]
        score = selection_score(val)
        if state.best is None or score > state.best.val_score:
            state.best = BestModel(
                round_idx, val.get("accuracy", score), score, copy.deepcopy(state.server)
            )

    # --- whole run (the skeleton: engine/run.py) ------------------------------------------------
    shown = ("val_accuracy", "val_wer", "local_accuracy", "train_loss")

    @property
    def rounds(self) -> int:
        return self.cfg.train.rounds

    @property
    def desc(self) -> str:
        return f"{self.cfg.algorithm} rounds"

    @property
    def clients_per_round(self) -> int:
        return self.cohort_size

    @property
    def writes(self) -> bool:
        return self.world.writes

    def place_state(self, state: RunState) -> RunState:
        """The run state on the run's device, every client's persistent state where it lives
        (`client_home`); a resumed run keeps auto's measured choice of path."""
        clients = state.clients
        state = super().place_state(replace(state, clients={}))
        state.clients = {name: self._homed(value) for name, value in clients.items()}
        self.plan.restore(state.auto_choice)
        return state

    def first_line(self) -> str:
        clock = f"; {self.clock.describe()}" if self.clock is not None else ""
        return (
            f"{self.cfg.algorithm} on {device_name(self.device)} "
            f"(runtime.device={self.cfg.runtime.device}); clients train "
            f"{self.plan.path}{how_shared(self.world, self.sums)}{clock}"
        )

    def rewind_logs(self, round_idx: int) -> None:
        truncate_pruning_log(self.run_dir, round_idx)
        truncate_client_rows(self.run_dir, round_idx)

    def round_written(self, state: RunState, round_idx: int, row: dict[str, float]) -> None:
        if state.system is not None:  # system.csv: every round's clock (rewritten from the state)
            state.system.rows.append({k: row[k] for k in ("round", *CLOCK_METRICS) if k in row})
            if self.writes:
                write_history(self.run_dir, state.system.rows, SYSTEM_CSV)

    def evaluates(self, round_idx: int) -> bool:
        return round_idx % self.cfg.train.eval_every == 0 or round_idx == self.cfg.train.rounds

    def checkpoint_boundary(self, round_idx: int) -> bool:
        return (
            round_idx % self.cfg.train.checkpoint_every == 0 or round_idx == self.cfg.train.rounds
        )

    def evaluate(self, state: RunState, round_idx: int, row: dict[str, float]) -> None:
        # (every rank its share, gathered: engine/distributed.py `evaluation`)
        with self.runtime.autocast(), evaluation(self.world, round_idx):
            self._evaluate_round(state, round_idx, row)

    def final(self, state: RunState) -> dict[str, Any]:
        with self.runtime.autocast(), evaluation(self.world, None):
            return self.final_results(state)

    def closing(self) -> dict[str, Any]:
        # (auto: what the probe chose)
        out: dict[str, Any] = {"execution": self.plan.path}
        if self.plan.measured:
            out["execution_probe"] = dict(self.plan.measured)
        return out

    def selected_server(self, state: RunState) -> dict[str, Any]:
        if self.cfg.train.select == "last" or state.best is None:
            return state.server
        if self.cfg.train.select != "best_val":
            raise ConfigError(
                f"train.select must be best_val or last, got {self.cfg.train.select!r}"
            )
        return state.best.server

    def client_state_memory(self, state: RunState) -> dict[str, Any]:
        """What the clients' persistent states (personal models, control variates, duals) take:
        every client that has trained holds one, of its architecture's size (measured once per
        architecture, so a process holding only its share under torchrun counts them all)."""
        sizes: dict[str, int] = {}
        held = [name for name in self.trainable if state.visits.get(name)]
        for name in held:
            arch = self.algorithm.client_architecture(name)
            if arch not in sizes:
                sizes[arch] = nbytes(self.algorithm.init_client_state(name))
        total = sum(sizes[self.algorithm.client_architecture(name)] for name in held)
        return {
            "clients_holding": len(held),
            "bytes_total": total,
            "bytes_per_client": total / len(held) if held else 0.0,
        }

    def final_results(self, state: RunState) -> dict[str, Any]:
        """Test metrics of the model selected on validation, plus per-client and personalized
        metrics."""
        batch = self.cfg.train.eval_batch_size
        server = self.selected_server(state)
        model = self.algorithm.global_model(server)
        final: dict[str, Any] = {"has_global_model": model is not None}
        if model is not None:
            test, views = self.algorithm.evaluate_views(model, self.data.test, batch)
            final.update(test)
            final.update(tagged(views))
            if self.data.manifest is not None:  # (benchmark workloads carry no class names)
                final.update(
                    kws_rates(
                        model, self.data.eval_split("test"), self.data.manifest.classes, batch
                    )
                )
            curve = [row["test_accuracy"] for row in state.history if "test_accuracy" in row]
            if curve:
                final["test_last5_mean"] = float(np.mean(curve[-5:]))
            for name, split in self.data.extra_test.items():
                metrics, views = self.algorithm.evaluate_views(model, split, batch)
                final.update({f"{name}_{k}": v for k, v in metrics.items()})
                final.update(tagged(views, suffix=f"{name}_"))
            final["selected_round"] = (
                state.best.round
                if self.cfg.train.select == "best_val" and state.best
                else state.round
            )
            local = self.world.each(
                self.data.clients,
                lambda c: window_accuracy(
                    model,
                    to_device(c.holdout_x, self.device),
                    to_device(c.holdout_y, self.device),
                    batch,
                ),
                "gathering the clients' accuracy",
            )
            final["client_accuracy_mean"], final["client_accuracy_std"] = mean_std(local)
        personal = self._personalized_test_results(state)
        if personal:
            # The clients' own models, over the clients that trained (the count is reported).
            for key in ("accuracy", "macro_f1"):
                final[f"personalized_{key}_mean"], final[f"personalized_{key}_std"] = mean_std(
                    [p[key] for p in personal]
                )
            local = self._personalized_local_accuracy(state)
            final["personalized_local_accuracy_mean"], final["personalized_local_accuracy_std"] = (
                mean_std(local)
            )
            final["personalized_clients"] = len(personal)
        if model is None:
            final["selected_round"] = state.round
        final.update(
            self.attack.final_metrics(model, batch), **self.privacy.final_metrics(state.round)
        )
        visits = list(state.visits.values())
        if visits:  # the simulator's count (a Flower deployment's nodes keep their own)
            final["clients_trained"] = len(visits)
            final["visits_per_trained_client"] = float(np.mean(visits))
        extra = {"per_client": client_summary(self, state, server)}  # (spreads and cohort counts)
        extra["client_state"] = self.client_state_memory(state)
        if self.clock is not None and state.system is not None:
            extra["system"] = self.clock.summary(state.system, state.history, self._flops)
        if (counts := test_confusion(self, model)) is not None:
            extra["confusion"] = counts
        return {
            "algorithm": self.cfg.algorithm,
            "dataset": self.cfg.dataset,
            "seed": self.cfg.seed,
            "final": final,
            "history": state.history,
            "rounds": state.round,
            "clients": len(self.data.clients),
            "num_classes": self.data.task.num_classes,
            **extra,
        }
