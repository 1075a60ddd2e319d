"""`fedac sweep`: a hyper-parameter search over fedac runs, on Optuna (docs/sweep.md).

Each trial is one real fedac run (its own run directory `DIR/trials/NNNN`, config.yaml included)
whose settings are the command's (`--config`, `--set`, `--algorithm`, `--dataset`, `--rounds`,
`--seed`) plus the values Optuna's sampler (`--sampler`: TPE or random) draws for the searched
settings (`--search KEY=LOW:HIGH[:log]` or `--search KEY=a,b,c`). A trial is scored on the
**validation split only**: its `--metric` (default: the shared model's `val_accuracy`, or, for a
method with no shared model, `local_accuracy`, its clients' own models on their held-out clips) at
every evaluated round is reported to Optuna's pruner, which may stop a hopeless trial there; a
finished trial scores the value of the model the run selects (`train.select`: the best evaluated
round, or the last). Nothing is ever chosen on the test split.

The budget is rounds: every trial trains `train.rounds` rounds (or fewer when pruned). With the
virtual clock on (`system.*`) trials.csv records each trial's virtual seconds too, but the budget
stays rounds (a trial cut at a virtual time would not be what `fedac run --config best.yaml`
repeats).

The study lives in a storage: `DIR/study.journal` (Optuna's JournalStorage on a file, the storage
Optuna documents as safe for several processes on one machine), or `--storage URL` (any database
Optuna's RDBStorage takes, e.g. PostgreSQL, for processes on several machines). Trials finished or
pruned count towards `--trials`; the same command with a larger `--trials` adds only the missing
ones. A trial whose process ended mid-trial (killed) is found RUNNING with its process gone (each
worker holds a lock on `DIR/workers/<host>-<pid>.lock`; on a database, Optuna's heartbeat), marked
FAIL and its settings tried again: the retry continues the killed run from its last checkpoint, in
its directory (a database's heartbeat retry starts afresh). `--jobs K` runs K worker processes, each
claiming trials under a file lock, so they finish exactly `--trials` trials between them.

Outputs: `DIR/trials.csv` and `DIR/best.yaml` (the best trial's config.yaml: `fedac run --config
DIR/best.yaml` repeats it), rewritten after every trial, and `DIR/sweep.png` (the score of every
trial, and each searched setting's effect) when the sweep ends.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import json
import os
import socket
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from fedac.config import (
    Config,
    fit_eval_schedule,
    last_settings,
    load_config,
    not_applied,
    save_config,
)
from fedac.errors import ConfigError, FedacError, RunInterrupted
from fedac.settings.algorithms import ALGORITHMS

STUDY = "fedac-sweep"
#: Settings a sweep does not search: the budget, the run's identity and its directory.
NOT_SEARCHED = {
    "train.rounds": "the budget: give --rounds",
    "algorithm": "a sweep searches one algorithm's settings",
    "out": "each trial has its own run directory",
}
#: Metrics that are better when lower (a search over them minimises).
LOWER_IS_BETTER = ("loss", "wer", "cer", "eer")
Direction = Literal["minimize", "maximize"]


@dataclass
class Search:
    """One searched setting: a numeric range (`low`..`high`, on a log scale when `log`) or a list
    of `choices`."""

    key: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: list[Any] = field(default_factory=list)
    integer: bool = False

    def text(self) -> str:
        if self.choices:
            return f"{self.key} in {{{', '.join(map(str, self.choices))}}}"
        return f"{self.key} in [{self.low:g}, {self.high:g}]{' (log)' if self.log else ''}"

    def distribution(self):
        import optuna  # lazy: start-up time

        if self.choices:
            return optuna.distributions.CategoricalDistribution(self.choices)
        if self.integer:
            return optuna.distributions.IntDistribution(int(self.low), int(self.high), log=self.log)  # type: ignore[arg-type]
        return optuna.distributions.FloatDistribution(self.low, self.high, log=self.log)  # type: ignore[arg-type]


def parse_search(text: str) -> Search:
    """`KEY=LOW:HIGH[:log]` or `KEY=a,b,c` -> a Search (its values unchecked: `check_searches`)."""
    key, sep, spec = text.partition("=")
    key = key.strip()
    if not sep or not key or not spec.strip():
        raise ConfigError(f"--search {text}: write KEY=LOW:HIGH[:log] or KEY=a,b,c")
    if "," in spec:
        choices = [yaml.safe_load(v.strip()) for v in spec.split(",") if v.strip()]
        if len(choices) < 2 or len({json.dumps(c) for c in choices}) < len(choices):
            raise ConfigError(f"--search {text}: give two or more different values")
        return Search(key, choices=choices)
    parts = spec.split(":")
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2].strip() != "log"):
        raise ConfigError(f"--search {text}: write KEY=LOW:HIGH[:log] or KEY=a,b,c")
    try:
        low, high = float(parts[0]), float(parts[1])
    except ValueError:
        raise ConfigError(f"--search {text}: LOW and HIGH must be numbers") from None
    if not low < high:
        raise ConfigError(f"--search {text}: LOW must be below HIGH")
    log = len(parts) == 3
    if log and low <= 0:
        raise ConfigError(f"--search {text}: a log range needs LOW > 0")
    return Search(key, low, high, log)


@dataclass
class SweepSpec:
    """Everything a worker process needs (picklable): the command's settings and the searches."""

    out: Path
    searches: list[Search]
    trials: int
    config: str | None = None
    overrides: list[str] = field(default_factory=list)
    algorithm: str | None = None
    dataset: str | None = None
    rounds: int | None = None
    seed: int | None = None
    metric: str = "auto"
    pruner: str = "median"
    sampler: str = "tpe"
    """`tpe[:STARTUP]` or `random` (`sampler_of`); not part of the study's definition: a later
    sitting may draw its trials another way."""
    baseline: bool = False
    """Trial 0 runs the searched settings' own values (the untuned run), so the best trial is never
    worse on validation than not tuning."""
    storage: str | None = None
    jobs: int = 1
    progress: bool = True

    def settings(self, params: dict[str, Any]) -> list[str]:
        """The command's --sets, then the trial's drawn values, which replace any of theirs."""
        drawn = [f"{k}={json.dumps(v)}" for k, v in params.items()]
        return last_settings([*self.overrides, *drawn])

    def config_for(self, params: dict[str, Any]) -> Config:
        """A trial's config: the command's settings with `params`, its eval schedule fitted as
        `fedac run` fits it (so best.yaml repeats the trial)."""
        flags: dict[str, Any] = {"train.rounds": self.rounds}
        cfg = load_config(
            self.config,
            self.settings(params),
            algorithm=self.algorithm,
            dataset=self.dataset,
            seed=self.seed,
            **flags,
        )
        fit_eval_schedule(cfg)
        return cfg

    def definition(self) -> dict[str, Any]:
        """What makes two commands one study (everything but --trials, --jobs, --storage); of
        --sets of one key, the last (`last_settings`)."""
        text = Path(self.config).read_text() if self.config else ""
        return {
            "config_sha256": hashlib.sha256(text.encode()).hexdigest(),
            "overrides": last_settings(self.overrides),
            "algorithm": self.algorithm,
            "dataset": self.dataset,
            "rounds": self.rounds,
            "seed": self.seed,
            "metric": self.metric,
            "pruner": self.pruner,
            "baseline": self.baseline,
            "searches": [s.text() for s in self.searches],
        }


def _setting(cfg: Config, key: str) -> tuple[Any, Any]:
    """(the section holding `key`'s last part, its current value)."""
    *path, name = key.split(".")
    node: Any = cfg
    for part in path:
        node = getattr(node, part)
    return node, getattr(node, name)


def check_searches(spec: SweepSpec) -> Config:
    """Refuse, naming it, a search over an unknown setting, a value its setting does not allow, a
    range over a setting that is not a number, or a setting the run does not read (another
    algorithm's section, a data setting its partition ignores); every check is the config's own
    (`load_config`: types and declared ranges; `not_applied`). Returns the base config."""
    base = spec.config_for({})
    keys = [s.key for s in spec.searches]
    for key in {k for k in keys if keys.count(k) > 1}:
        raise ConfigError(f"--search {key}: searched twice")
    own = ALGORITHMS[base.algorithm].section or base.algorithm
    unread = not_applied(base)
    for s in spec.searches:
        if s.key in NOT_SEARCHED:
            raise ConfigError(f"--search {s.key}: not searchable ({NOT_SEARCHED[s.key]})")
        section = s.key.split(".")[0]
        if section in base.sections() and section != own:
            raise ConfigError(
                f"--search {s.key}: {base.algorithm} does not read the {section} settings "
                f"(another algorithm's); search a setting {base.algorithm} reads"
            )
        if s.key in unread:
            raise ConfigError(f"--search {s.key}: {unread[s.key]}")
        for value in s.choices or [s.low, s.high]:
            try:
                cfg = spec.config_for({s.key: value})
            except ConfigError as exc:
                raise ConfigError(f"--search {s.key}: value {value!r} refused: {exc}") from None
        if s.choices:
            continue
        _, current = _setting(cfg, s.key)
        if isinstance(current, bool) or not isinstance(current, (int, float)):
            raise ConfigError(
                f"--search {s.key}: a range needs a numeric setting ({s.key} is "
                f"{type(current).__name__}); list its values as {s.key}=a,b,c"
            )
        # (an integer setting has already refused a LOW or HIGH that is no integer)
        s.integer = isinstance(current, int)
    return base


# --- the study ------------------------------------------------------------------------------------
def open_storage(spec: SweepSpec):
    """The study's storage: the journal file in DIR, or `--storage URL` (a database, with Optuna's
    heartbeat failing and retrying the trials of a machine that stopped)."""
    import optuna  # lazy: start-up time

    if spec.storage:
        return optuna.storages.RDBStorage(
            spec.storage,
            heartbeat_interval=30,
            grace_period=120,
            failed_trial_callback=optuna.storages.RetryFailedTrialCallback(max_retry=None),
        )
    from optuna.storages.journal import JournalFileBackend

    return optuna.storages.JournalStorage(JournalFileBackend(str(spec.out / "study.journal")))


def median_pruner(text: str) -> tuple[int, int] | None:
    """--pruner: `none`, or `median[:STARTUP[:WARMUP]]`, Optuna's MedianPruner that prunes no trial
    before STARTUP trials have finished (default 5) and none before its round WARMUP (default 0)
    -> (STARTUP, WARMUP); None for `none`."""
    name, *numbers = text.split(":")
    if name == "none" and not numbers:
        return None
    try:
        startup, warmup = [int(n) for n in numbers] + [5, 0][len(numbers) :]
        if name != "median" or len(numbers) > 2 or startup < 0 or warmup < 0:
            raise ValueError
    except ValueError:
        raise ConfigError(
            f"fedac sweep: --pruner {text!r}: expected none or median[:STARTUP[:WARMUP]] "
            "(non-negative whole numbers: trials finished before any pruning, rounds before a "
            "trial may be pruned)"
        ) from None
    return startup, warmup


#: Optuna's TPE draws its first trials at random (its `n_startup_trials`) before it models them.
TPE_STARTUP = 10


def sampler_of(text: str) -> tuple[str, int]:
    """--sampler: `tpe[:STARTUP]`, Optuna's TPE sampler, whose first STARTUP trials (default
    TPE_STARTUP, Optuna's) are drawn at random before it models the finished ones, or `random`,
    every trial drawn at random -> (name, STARTUP; 0 for random)."""
    name, *numbers = text.split(":")
    try:
        startup = int(numbers[0]) if numbers else TPE_STARTUP
        if name not in ("tpe", "random") or len(numbers) > (name == "tpe") or startup < 0:
            raise ValueError
    except ValueError:
        raise ConfigError(
            f"fedac sweep: --sampler {text!r}: expected tpe[:STARTUP] (STARTUP a non-negative "
            "whole number: trials drawn at random before TPE models the finished ones) or random"
        ) from None
    return name, startup if name == "tpe" else 0


def open_study(spec: SweepSpec, direction: Direction, worker: int = 0):
    """Create the study, or load it and refuse a command that is not the one that made it."""
    import optuna  # lazy: start-up time

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    median = median_pruner(spec.pruner)
    pruner = (
        optuna.pruners.MedianPruner(n_startup_trials=median[0], n_warmup_steps=median[1])
        if median
        else optuna.pruners.NopPruner()
    )
    storage = open_storage(spec)
    study = optuna.create_study(
        study_name=STUDY,
        storage=storage,
        direction=direction,
        load_if_exists=True,
        pruner=pruner,
    )
    # Each worker's sampler seed: the sweep's seed, the worker's index and the trials the study
    # holds, so a resumed sweep draws anew and two workers never draw the same startup trials.
    held = len(study.get_trials(deepcopy=False))
    seed = (((spec.seed or 0) * 7919 + worker) * 100_003 + held) % 2**32  # (numpy's range)
    name, startup = sampler_of(spec.sampler)
    study.sampler = (
        optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup)
        if name == "tpe"
        else optuna.samplers.RandomSampler(seed=seed)
    )
    with claim_lock(spec.out):
        made = study.user_attrs.get("definition")
        if made is None:
            study.set_user_attr("definition", spec.definition())
            if spec.baseline:  # the untuned settings first (a search of a list holds them)
                base = spec.config_for({})
                study.enqueue_trial(
                    {s.key: _setting(base, s.key)[1] for s in spec.searches},
                    user_attrs={"baseline": True},
                )
        else:
            # (a study made before definitions dropped replaced --sets holds them all)
            made = {**made, "overrides": last_settings(made["overrides"])}
            changed = [k for k, v in spec.definition().items() if made.get(k) != v]
            if changed:
                raise ConfigError(
                    f"{spec.out} holds a sweep of other settings ({', '.join(changed)} differ); "
                    "rerun its command (only --trials, --jobs and --storage may change) or give "
                    "another --out"
                )
    return study


def direction_of(metric: str) -> Direction:
    return "minimize" if any(m in metric for m in LOWER_IS_BETTER) else "maximize"


@contextlib.contextmanager
def claim_lock(out: Path) -> Iterator[None]:
    """An exclusive lock on DIR/claim.lock among this machine's workers."""
    import fcntl

    with open(out / "claim.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@contextlib.contextmanager
def worker_lock(out: Path) -> Iterator[str]:
    """Hold DIR/workers/<host>-<pid>.lock while this process works: a trial of a worker whose lock
    is free was left by a process that has ended."""
    import fcntl

    (out / "workers").mkdir(exist_ok=True)
    name = worker_id()
    with open(out / "workers" / f"{name}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield name


def worker_alive(out: Path, name: str) -> bool:
    """Whether worker `name` (of this machine) still holds its lock; a worker of another machine
    counts as alive (its database heartbeat decides)."""
    import fcntl

    path = out / "workers" / f"{name}.lock"
    if not name.startswith(socket.gethostname() + "-") or not path.exists():
        return not name.startswith(socket.gethostname() + "-")
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False


def fail_stale(study, out: Path, spec_storage: str | None = None) -> list[int]:
    """Mark FAIL every RUNNING trial whose process has ended, and queue its settings again (its
    retry is a new trial with `retry_of`). Returns the trials failed."""
    import optuna  # lazy: start-up time

    if spec_storage:  # a database's heartbeat (Optuna's; experimental, so its warning is muted)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
    failed = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        name = t.user_attrs.get("worker")
        if name is None or worker_alive(out, name):
            continue
        storage = study._storage
        storage.set_trial_user_attr(t._trial_id, "failed", "its process ended mid-trial")
        if storage.set_trial_state_values(t._trial_id, state=optuna.trial.TrialState.FAIL):
            study.enqueue_trial(t.params, user_attrs={"retry_of": t.number})
            failed.append(t.number)
    return failed


def counts(study) -> dict[str, int]:
    """Trials by state: done (finished), pruned, running, failed."""
    out = {"done": 0, "pruned": 0, "running": 0, "failed": 0}
    for t in study.get_trials(deepcopy=False):
        name = {"COMPLETE": "done", "PRUNED": "pruned", "RUNNING": "running", "FAIL": "failed"}
        if t.state.name in name:
            out[name[t.state.name]] += 1
    return out


def claim(study, spec: SweepSpec, name: str):
    """The next trial for this worker, or None when finished and running trials reach --trials.
    Claims are serialised by DIR/claim.lock on one machine; across machines a trial claimed past
    the count is told FAIL (`surplus`) and the worker stops."""
    import optuna  # lazy: start-up time

    with claim_lock(spec.out):
        for number in fail_stale(study, spec.out, spec.storage):
            _say(spec, f"trial {number}: its process ended mid-trial; marked FAIL, tried again")
        n = counts(study)
        if n["done"] + n["pruned"] + n["running"] >= spec.trials:
            return None
        trial = study.ask({s.key: s.distribution() for s in spec.searches})
        trial.set_user_attr("worker", name)
    ahead = [
        t
        for t in study.get_trials(deepcopy=False)
        if t.number < trial.number
        and t.state.name in ("COMPLETE", "PRUNED", "RUNNING")
        and "surplus" not in t.user_attrs
    ]
    if len(ahead) >= spec.trials:
        trial.set_user_attr("surplus", True)
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        return None
    return trial


def _say(spec: SweepSpec, line: str) -> None:
    if spec.progress:
        print(f"fedac sweep: {line}", flush=True)


# --- one trial ------------------------------------------------------------------------------------
class Pruned(Exception):
    """Optuna's pruner stopped the trial at a round."""


#: --metric's two orders of preference: `auto` the shared model first, `personal` the clients' own
#: models first (a personalised method's own settings, Ditto's lambda say, move only those).
PREFERENCE = {
    "auto": ("val_accuracy", "local_accuracy"),
    "personal": ("local_accuracy", "val_accuracy"),
}


def metric_of(spec: SweepSpec, row: dict[str, float]) -> str | None:
    """The metric a row is scored on: --metric, or under `auto` the shared model's validation
    accuracy, else (no shared model) the clients' own models' held-out accuracy; under `personal`
    the other way round."""
    if spec.metric not in PREFERENCE:
        return spec.metric if spec.metric in row else None
    return next((m for m in PREFERENCE[spec.metric] if m in row), None)


def with_pruning(
    driver: type, spec: SweepSpec, trial, curve: list[tuple[int, float]], earlier: list[float]
) -> type:
    """`driver` (a round driver class) reporting every evaluated round's metric to `trial` and
    stopping when Optuna's pruner says so; `earlier` receives the run's wall seconds before this
    sitting (0 for a fresh run)."""

    def score(round_idx: int, row: dict[str, float]) -> bool:
        """Report `row`'s metric to the study; False: the round was not evaluated."""
        if "virtual_time_s" in row:
            trial.set_user_attr("virtual_s", float(row["virtual_time_s"]))
        metric = metric_of(spec, row)
        if metric is None:
            return False
        trial.set_user_attr("metric", metric)
        curve.append((round_idx, float(row[metric])))
        trial.report(float(row[metric]), round_idx)
        return True

    class Pruning(driver):
        def place_state(self, state):
            # a resumed run (a retry continuing its interrupted trial): the evaluations before its
            # checkpoint reported again, so its curve and the pruner see every round
            state = super().place_state(state)
            earlier.append(state.wall_seconds)  # (the interrupted sittings' wall time)
            for row in state.history:
                score(int(row["round"]), row)
            if state.history and trial.should_prune():
                raise Pruned(state.round)
            return state

        def round_written(self, state, round_idx: int, row: dict[str, float]) -> None:
            super().round_written(state, round_idx, row)
            if score(round_idx, row) and trial.should_prune():
                raise Pruned(round_idx)

    return Pruning


def interrupted_run(spec: SweepSpec, study, trial) -> Path | None:
    """The run directory of the trial `trial` retries (`retry_of`) when it holds a checkpoint to
    continue from; None: a fresh run."""
    from fedac.engine.checkpoint import CHECKPOINT

    retried = trial.user_attrs.get("retry_of")
    if retried is None:
        return None
    old = study.get_trials(deepcopy=False)[int(retried)]
    run_dir = spec.out / str(old.user_attrs.get("run_dir", f"trials/{int(retried):04d}"))
    return run_dir if (run_dir / CHECKPOINT).is_file() else None


def run_trial(spec: SweepSpec, study, trial, built: dict) -> str:
    """Train `trial`'s run and tell the study its score (or that it was pruned). Returns its state.
    A run interrupted (SIGINT / SIGTERM) is told FAIL and queued again before the signal ends the
    sweep; any other error is told FAIL and stops the sweep. The retry continues the interrupted
    run from its last checkpoint, in its directory (`interrupted_run`)."""
    import optuna  # lazy: start-up time

    from fedac.engine.runner import runner_for
    from fedac.engine.simulator import Simulator
    from fedac.experiments.compare import shared_data

    resumed = interrupted_run(spec, study, trial)
    run_dir = resumed or spec.out / "trials" / f"{trial.number:04d}"
    cfg = spec.config_for(trial.params)
    cfg.out = str(run_dir)
    trial.set_user_attr("run_dir", str(run_dir.relative_to(spec.out)))
    driver, _ = runner_for(cfg)
    curve: list[tuple[int, float]] = []
    earlier: list[float] = []
    started = time.perf_counter()
    from optuna.storages._heartbeat import get_heartbeat_thread  # (a database's; else a no-op)

    heartbeat = get_heartbeat_thread(trial._trial_id, study._storage)
    try:
        with heartbeat:
            kwargs = {"data": shared_data(built, cfg, False)} if driver is Simulator else {}
            run = with_pruning(driver, spec, trial, curve, earlier)(
                cfg, run_dir, progress=False, **kwargs
            )
            run.run(resume=resumed is not None)
    except Pruned:
        trial.set_user_attr("wall_s", time.perf_counter() - started + sum(earlier))
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        return "pruned"
    except (RunInterrupted, KeyboardInterrupt) as exc:
        trial.set_user_attr("failed", "interrupted")
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
        if isinstance(exc, RunInterrupted):  # the sweep continues, this trial's run with it
            exc.continue_with = (
                "the same command again (the study continues; this trial's run resumes from its "
                "checkpoint)"
            )
        raise
    except BaseException as exc:
        trial.set_user_attr("failed", f"{type(exc).__name__}: {exc}"[:500])
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        raise
    trial.set_user_attr("wall_s", time.perf_counter() - started + sum(earlier))
    if not curve:
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        raise FedacError(f"trial {trial.number}: its rows have no metric {spec.metric!r}")
    values = [v for _, v in curve]
    pick = min if direction_of(curve_metric(trial)) == "minimize" else max
    score = values[-1] if cfg.train.select == "last" else pick(values)
    study.tell(trial, score)
    return "done"


def curve_metric(trial) -> str:
    return str(trial.user_attrs.get("metric", "val_accuracy"))


#: The federated data this process built last (experiments/compare.py `shared_data`): a worker's
#: trials, and the sweeps one process runs one after another (`fedac reproduce pfl-tuned`).
_BUILT: dict = {}


def work(spec: SweepSpec, direction: Direction, worker: int = 0) -> None:
    """One worker (`worker`: its index): claim and run trials until the study has --trials
    finished or running; rewrite the outputs after each."""
    study = open_study(spec, direction, worker)
    built = _BUILT  # (the data of this process's last seed, reused by its next sweep too)
    with worker_lock(spec.out) as name:
        while (trial := claim(study, spec, name)) is not None:
            shown = ", ".join(f"{k}={_fmt(v)}" for k, v in trial.params.items())
            state = run_trial(spec, study, trial, built)
            n = counts(study)
            final = study.get_trials(deepcopy=False)[trial.number]
            score = f"{final.value:.4f}" if final.value is not None else "-"
            _say(
                spec,
                f"trial {trial.number} {state} ({shown}): {curve_metric(final)} {score} | "
                f"{n['done']} done, {n['pruned']} pruned, {n['running']} running of "
                f"{spec.trials}",
            )
            write_outputs(spec, study, figure=False)


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _worker_main(spec: SweepSpec, direction: Direction, worker: int) -> None:
    """A --jobs worker process (spawned)."""
    try:
        work(spec, direction, worker)
    except FedacError as exc:
        print(f"fedac sweep: error: {exc}", file=sys.stderr)
        sys.exit(2)


# --- outputs --------------------------------------------------------------------------------------
CSV_HEAD = ["trial", "state", "score", "metric"]
CSV_TAIL = ["rounds", "pruned_at", "wall_s", "virtual_s", "retry_of", "run_dir", "failed"]


def trial_rows(spec: SweepSpec, study) -> list[dict[str, Any]]:
    rows = []
    for t in study.get_trials(deepcopy=False):
        if "surplus" in t.user_attrs:
            continue
        steps = sorted(t.intermediate_values)
        rows.append(
            {
                "trial": t.number,
                "state": t.state.name,
                "score": t.value if t.value is not None else "",
                "metric": t.user_attrs.get("metric", ""),
                **{s.key: t.params.get(s.key, "") for s in spec.searches},
                "rounds": steps[-1] if steps else "",
                "pruned_at": steps[-1] if t.state.name == "PRUNED" and steps else "",
                **{k: t.user_attrs.get(k, "") for k in CSV_TAIL[2:]},
            }
        )
    return rows


def write_outputs(spec: SweepSpec, study, figure: bool = True) -> None:
    """trials.csv, best.yaml and (`figure`) sweep.png, from the study as it stands. The workers
    write the first two after every trial, the figure (about a second of matplotlib) once when the
    sweep ends."""
    rows = trial_rows(spec, study)
    columns = [*CSV_HEAD, *(s.key for s in spec.searches), *CSV_TAIL]
    # each process its own temporary file: two workers finishing at once would otherwise move
    # one file twice (the second os.replace found it gone)
    tmp = f".tmp.{os.getpid()}"
    with open(spec.out / f"trials.csv{tmp}", "w", newline="") as handle:
        writer = csv.DictWriter(handle, columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    os.replace(spec.out / f"trials.csv{tmp}", spec.out / "trials.csv")
    complete = [r for r in rows if r["state"] == "COMPLETE"]
    if complete:
        best = study.best_trial
        cfg = load_config(spec.out / best.user_attrs["run_dir"] / "config.yaml")
        cfg.out = None
        save_config(cfg, spec.out / f"best.yaml{tmp}")
        head = (
            f"# fedac sweep {spec.out}: trial {best.number}, {curve_metric(best)} "
            f"{best.value:.4f} on validation "
            f"({', '.join(f'{k}={v}' for k, v in best.params.items())}).\n# Repeat it: fedac run "
            f"--config {spec.out / 'best.yaml'}\n"
        )
        text = (spec.out / f"best.yaml{tmp}").read_text()
        (spec.out / f"best.yaml{tmp}").write_text(head + text)
        os.replace(spec.out / f"best.yaml{tmp}", spec.out / "best.yaml")
    if figure:
        plot_sweep(spec, rows, spec.out / "sweep.png")


def plot_sweep(spec: SweepSpec, rows: list[dict[str, Any]], path: Path) -> None:
    """Left: every trial's score (finished, and pruned at their last report) and the best so far;
    then one panel per searched setting: score against its value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scored = [r for r in rows if r["state"] == "COMPLETE"]
    panels = 1 + len(spec.searches)
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.6), squeeze=False)
    ax = axes[0][0]
    ax.scatter([r["trial"] for r in scored], [r["score"] for r in scored], label="finished")
    if scored:
        pick = min if direction_of(str(scored[0]["metric"])) == "minimize" else max
        running, best = [], None
        for r in scored:
            best = r["score"] if best is None else pick(best, r["score"])
            running.append(best)
        ax.step([r["trial"] for r in scored], running, where="post", label="best so far")
    pruned = [r for r in rows if r["state"] == "PRUNED"]
    ax.scatter(
        [r["trial"] for r in pruned], [0] * len(pruned), marker="x", color="grey", label="pruned"
    )
    ax.set(xlabel="trial", ylabel="validation score", title="score by trial")
    ax.legend(fontsize=7)
    for ax, s in zip(axes[0][1:], spec.searches):
        xs = [r[s.key] if not s.choices else str(r[s.key]) for r in scored]
        ax.scatter(xs, [r["score"] for r in scored])
        if s.log:
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set(xlabel=s.key, title=f"effect of {s.key}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- the command ----------------------------------------------------------------------------------
def spec_from_args(args: argparse.Namespace) -> SweepSpec:
    if args.trials < 1 or args.jobs < 1:
        raise ConfigError("--trials and --jobs must be at least 1")
    return SweepSpec(
        out=Path(args.out),
        searches=[parse_search(t) for t in args.search],
        trials=args.trials,
        config=args.config,
        overrides=list(args.overrides),
        algorithm=args.algorithm,
        dataset=args.dataset,
        rounds=args.rounds,
        seed=args.seed,
        metric=args.metric,
        pruner=args.pruner,
        sampler=args.sampler,
        baseline=args.baseline,
        storage=args.storage,
        jobs=args.jobs,
        progress=not args.quiet,
    )


def sweep(spec: SweepSpec) -> dict[str, int]:
    """Check the searches, say what is searched and the budget, run the workers (this process,
    or --jobs spawned processes), write the outputs. Returns the final trial counts."""
    if not spec.searches:
        raise ConfigError("fedac sweep: give at least one --search KEY=LOW:HIGH[:log] or KEY=a,b,c")
    median_pruner(spec.pruner)  # (refused before any run)
    name, startup = sampler_of(spec.sampler)
    base = check_searches(spec)
    for s in spec.searches if spec.baseline else ():
        value = _setting(base, s.key)[1]
        if not s.distribution()._contains(s.distribution().to_internal_repr(value)):
            raise ConfigError(f"--baseline: {s.key}'s own value {value!r} lies outside its search")
    spec.out.mkdir(parents=True, exist_ok=True)
    direction = direction_of("val_accuracy" if spec.metric in PREFERENCE else spec.metric)
    study = open_study(spec, direction)
    n = counts(study)
    metric = (
        "val_accuracy (a method with no shared model: local_accuracy)"
        if spec.metric == "auto"
        else "local_accuracy, the clients' own models on their held-out clips (a method with none: "
        "val_accuracy)"
        if spec.metric == "personal"
        else spec.metric
    )
    _say(
        spec,
        f"{base.algorithm} on {base.dataset}: searching "
        f"{'; '.join(s.text() for s in spec.searches)}; budget {spec.trials} trials x "
        f"{base.train.rounds} rounds (evaluated every {base.train.eval_every}), scored on "
        f"validation: {metric}; {spec.pruner} pruner; "
        f"{f'TPE sampler ({startup} random trials first)' if name == 'tpe' else 'random sampler'}; "
        "study "
        f"{spec.storage or spec.out / 'study.journal'} holds {n['done']} done, {n['pruned']} "
        f"pruned; {spec.jobs} process(es)",
    )
    if spec.jobs == 1:
        work(spec, direction)
    else:
        _spawn(spec, direction)
    write_outputs(spec, study)
    n = counts(study)
    others = f", {n['running']} running in other processes" if n["running"] else ""
    _say(spec, f"{n['done']} done, {n['pruned']} pruned, {n['failed']} failed{others}; {spec.out}")
    return n


def _spawn(spec: SweepSpec, direction: Direction) -> None:
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    workers = [
        context.Process(target=_worker_main, args=(spec, direction, k)) for k in range(spec.jobs)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    bad = [w.exitcode for w in workers if w.exitcode]
    if bad:
        raise FedacError(f"{len(bad)} of {spec.jobs} sweep processes failed (exit {bad})")


def cmd_sweep(args: argparse.Namespace) -> int:
    n = sweep(spec_from_args(args))
    # (trials still running belong to other processes on the study, which finish them)
    return 0 if n["done"] + n["pruned"] + n["running"] >= args.trials else 1


def add_sweep_parser(sub) -> None:
    p = sub.add_parser(
        "sweep",
        help="search settings on validation with Optuna: trials.csv, sweep.png, best.yaml "
        "(docs/sweep.md)",
    )
    p.add_argument("--algorithm", metavar="NAME")
    p.add_argument("--dataset", metavar="NAME")
    p.add_argument("--config", help="YAML config every trial starts from")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument(
        "--search",
        action="append",
        default=[],
        metavar="KEY=LOW:HIGH[:log] | KEY=a,b,c",
        help="a searched setting (repeatable)",
    )
    p.add_argument("--trials", type=int, required=True, help="finished + pruned trials wanted")
    p.add_argument("--rounds", type=int, help="rounds per trial (the budget)")
    p.add_argument("--seed", type=int, help="every trial's run seed (and the sampler's)")
    p.add_argument("--out", required=True, help="sweep folder: study, trials, outputs")
    p.add_argument("--jobs", type=int, default=1, help="worker processes on this machine")
    p.add_argument(
        "--storage", metavar="URL", help="a database URL Optuna takes (several machines)"
    )
    p.add_argument(
        "--metric",
        default="auto",
        help="validation metric of the history rows (default auto: val_accuracy, or "
        "local_accuracy where there is no shared model; personal: local_accuracy where clients "
        "keep own models, else val_accuracy)",
    )
    p.add_argument(
        "--pruner",
        default="median",
        metavar="median[:STARTUP[:WARMUP]]|none",
        help="Optuna's median pruner (default: after 5 finished trials, from round 0), or none",
    )
    p.add_argument(
        "--sampler",
        default="tpe",
        metavar="tpe[:STARTUP]|random",
        help=f"how trials are drawn: Optuna's TPE, its first STARTUP (default {TPE_STARTUP}) at "
        "random, or every one at random",
    )
    p.add_argument(
        "--baseline",
        action="store_true",
        help="trial 0 runs the searched settings' own values (never worse than not tuning)",
    )
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_sweep)
