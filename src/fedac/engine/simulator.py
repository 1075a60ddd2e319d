"""The single-machine simulator: each round its schedule (engine/clock/) says who trains from which
model version, the execution plan trains them, and the one server step takes their arrivals;
evaluation and the final results are engine/evaluation.py's. No algorithm logic lives here.

Reproducibility and resume: the cohort of round t, each client's batch order and its dropout masks
derive from (seed, t, client) only, and the checkpoint holds the global state, every persistent
client state, the clock and the history. A run resumed from round r's checkpoint therefore produces
exactly the parameters of an uninterrupted run.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from fedac.algorithms import build_algorithm
from fedac.algorithms.base import Algorithm
from fedac.config import Config
from fedac.engine.client_states import ClientStates
from fedac.engine.clock.cohort import cohort_size, sample_cohort
from fedac.engine.clock.flops import FlopCount
from fedac.engine.clock.model import CLOCK_METRICS, SYSTEM_CSV
from fedac.engine.clock.schedule import RoundSchedule
from fedac.engine.clock.start import start_schedule
from fedac.engine.data import FederatedData, build_federated_data, record_bad_files
from fedac.engine.distributed import (
    Round,
    current_world,
    evaluation,
    how_shared,
    run_shared,
    sums_uploads,
)
from fedac.engine.evaluation import Evaluator, client_state_bytes
from fedac.engine.execution import ExecutionPlan, check_execution
from fedac.engine.report import (
    compression_note,
    truncate_client_rows,
    truncate_pruning_log,
    write_history,
)
from fedac.engine.run import RoundDriver
from fedac.engine.server_step import ServerStep
from fedac.engine.state import RunState
from fedac.engine.tracking import check_trackers
from fedac.errors import ConfigError
from fedac.rules.attacks import Attack
from fedac.rules.compression import Compressor
from fedac.rules.privacy import Privacy
from fedac.settings.compatibility import check as check_combination
from fedac.training.device import device_name, nbytes, place, to_device
from fedac.training.packing import client_home
from fedac.training.runtime import start_runtime
from fedac.training.types import ClientData, usable

__all__ = ["Simulator", "sample_cohort"]  # (sample_cohort: engine/clock/cohort.py)


class Simulator(RoundDriver):
    #: False for a server whose clients hold their data elsewhere (Flower's device mode).
    holds_clients = True
    #: The evaluation this driver runs (the Flower ServerApp's reads its nodes' reports).
    evaluator_class: type[Evaluator] = Evaluator

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
        check_combination(cfg)  # the compatibility matrix, before any data is built
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
        # Poisoned clients and DP: layers over client data and uploads (attacks.py, privacy.py)
        self.attack = Attack(cfg, [c.name for c in self.data.clients])
        self.data = self.attack.poison_data(self.data)
        self.attack.prepare_success_rate(self.data)
        #: n_k of each trainable client (a data attack's poisoned clips counted)
        self.sizes = {name: self.data.client(name).num_samples for name in self.trainable}
        # Built on the host, then on the run's device for every round (training/device.py); the
        # clients' data and models stay on the host if they do not fit (`runtime.client_memory`).
        self.client_home = client_home(
            self.runtime.client_memory, self.device, self._resident_bytes
        )
        self.states = ClientStates(
            self.algorithm, self.data.clients, self.world, self.device, self.client_home
        )
        self.state_owner = self.states.owner
        self.data = place(self.data, self.device, clients_on=self.client_home)
        self.attack.backdoor_test = to_device(self.attack.backdoor_test, self.device)
        # the clients of every round (fraction x client count; a device-mode server holds none)
        self.cohort_size = (
            cohort_size(len(self.trainable), cfg.train.fraction) if self.trainable else 0
        )
        self._server_side()
        self.schedule = self._start_schedule(self.server_step.compression)
        # over several processes: one all-reduce of the weighted sums where nothing needs each
        # upload (the async modes re-base each upload on its own)
        self.sums = (
            self.world.distributed
            and not self.schedule.asynchronous
            and sums_uploads(self.algorithm, self.attack, self.privacy)
        )
        self.evaluator = self.evaluator_class(
            cfg,
            self.data,
            self.algorithm,
            self.device,
            self.world,
            self.run_dir,
            self.attack,
            self.privacy,
            self.trainable,
            self._client_state,
            self.state_owner,
            lambda state: self.schedule.summary(state, self.flops.known),
            self.holds_clients,
        )

    def _server_side(self) -> None:
        """DP, the uploads' compression and the one server step over the uploads."""
        kind = type(self.algorithm)
        self.privacy = Privacy(
            self.cfg, len(self.trainable), self.cohort_size, kind.dp_compatible, kind.lpa_setting
        )
        # (uploads of the broadcast's form: compressible)
        compression = Compressor(self.cfg, kind.dp_compatible or kind.sums_uploads)
        self.server_step = ServerStep(
            self.algorithm, self.attack, self.privacy, self.run_dir, compression
        )

    def _start_schedule(self, compression: Compressor | None) -> RoundSchedule:
        """Who trains each round, from which model version (engine/clock/); `compression`: the
        uploads' (None: off), whose wire size the clock charges."""
        self.flops = FlopCount(
            self.cfg, self.algorithm, self.sizes, self._client_data, self.states.homed
        )
        return start_schedule(
            self.cfg,
            self.sizes,
            self.cohort_size,
            compression=compression,
            architecture=self.flops.trained_model,
            flops=self.flops.per_sample,
        )

    # --- state ---------------------------------------------------------------------------------
    def _fresh_state(self) -> RunState:
        return RunState(self.cfg.algorithm, self.algorithm.init_server())

    def _client_state(self, state: RunState, name: str) -> Any:
        return self.states.get(state, name)

    def _resident_bytes(self) -> int:
        """Bytes of every client's data and persistent state."""
        states = client_state_bytes(self.algorithm, self.trainable)
        return states + sum(nbytes(c) for c in self.data.clients)

    def _client_data(self, name: str) -> ClientData:
        """A client's data on the run's device (a copy when it lives on the host)."""
        return to_device(self.data.client(name), self.device)

    # --- one round -----------------------------------------------------------------------------
    def run_round(self, state: RunState, round_idx: int) -> dict[str, float]:
        """The schedule's plan (who trains from this round's model, each to its step limit),
        trained on the execution plan, its arrivals through the one server step."""
        self.schedule.selector.bind(state.selection)  # (its history: checkpointed, resumed)
        # (compression.download=true: what the clients receive is the quantised broadcast)
        payload = self.server_step.broadcast(self.algorithm.broadcast(state.server), round_idx)
        plan = self.schedule.plan(state, round_idx, payload)
        results = (
            self._train(state, payload, plan.clients, round_idx, plan.limits)
            if plan.train is not None
            else Round()
        )
        arrivals = self.schedule.arrivals(state, plan, results, payload)
        self.schedule.observe(round_idx, arrivals)  # (the selection rule learns their losses)
        step = self.server_step(state, payload, arrivals, round_idx, summed=results.summed)
        self.states.commit(state, step, arrivals, round_idx)
        return {**step.metrics, **plan.metrics}

    def _train(
        self,
        state: RunState,
        payload: Any,
        names: list[str],
        round_idx: int,
        limits: dict[str, int],
    ) -> Round:
        """The updates of clients `names` from `payload` (each to its step limit, where the clock
        set one), on the run's execution plan."""
        datas = [self._client_data(name) for name in names]
        if limits:
            datas = [replace(d, step_limit=limits.get(d.name)) for d in datas]
        states = self.states.for_training(state, names)  # (others' live on their owners)
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
        return results

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
        state.clients = {name: self.states.homed(value) for name, value in clients.items()}
        self.plan.restore(state.auto_choice)
        return state

    def first_line(self) -> str:
        clock = self.schedule.describe()
        return (
            f"{self.cfg.algorithm} on {device_name(self.device)} "
            f"(runtime.device={self.cfg.runtime.device}); clients train "
            f"{self.plan.path}{how_shared(self.world, self.sums)}"
            f"{f'; {clock}' if clock else ''}"
            f"{compression_note(self.server_step.compression)}"
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
            self.evaluator.evaluate_round(state, round_idx, row)

    def final(self, state: RunState) -> dict[str, Any]:
        with self.runtime.autocast(), evaluation(self.world, None):
            return self.final_results(state)

    def final_results(self, state: RunState) -> dict[str, Any]:
        return self.evaluator.final_results(state)

    def closing(self) -> dict[str, Any]:
        out: dict[str, Any] = {"execution": self.plan.path}  # (auto: what the probe chose)
        if self.plan.measured:
            out["execution_probe"] = dict(self.plan.measured)
        return out
