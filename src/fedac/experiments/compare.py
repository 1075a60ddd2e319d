"""`fedac compare`: several methods x several seeds in one command, summarised as mean ± std.

A method is `LABEL=ALGORITHM[:key=value,key=value...]`, e.g.
`FedAvg+LPA=fedavg:aggregation.method=lpa`. Presets name the method lists of the papers' tables.
Every run keeps its own run directory; the comparison writes `summary.json` and `table.md`. The data
are built once per comparison and reused across methods and seeds (the partition depends on the
seed, so one build per seed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from fedac.algorithms import ALGORITHMS
from fedac.config import Config, fit_eval_schedule, last_settings, load_config, parse_override
from fedac.data.registry import DATASETS, fit_user_data
from fedac.errors import ConfigError, RunInterrupted
from fedac.progress import before_run_starts
from fedac.training.metrics import mean_std

if TYPE_CHECKING:  # (training.types imports torch: not for the parser)
    from fedac.training.types import FederatedData

PRESETS: dict[str, list[str]] = {
    # fedmlac.md Fig. 2/3 methods with heterogeneous clients (each draws a CRNN from the zoo).
    # FedAvg cannot mix architectures, so its rows train one shared CRNN-Lite (the Plug-in's
    # architecture).
    "fedmlac": [
        "FedAvg=fedavg",
        "FedAvg+LPA=fedavg:aggregation.method=lpa",
        "FedKAD=fedkad:model.heterogeneous=true",
        "FedMLAC w/o ML=fedmlac:fedmlac.ml=false,model.heterogeneous=true",
        "FedMLAC w/o LPA=fedmlac:fedmlac.lpa=false,model.heterogeneous=true",
        "FedMLAC=fedmlac:model.heterogeneous=true",
    ],
    "baselines": [
        "FedAvg=fedavg",
        "FedProx=fedprox",
        "FedAdam=fedadam",
        "FedYogi=fedyogi",
        "FedAdagrad=fedadagrad",
        "FedAvgM=fedavgm",
    ],
    # FedKWS-UI's Fig. 2 methods, its ALT-only ablation and the two-head control (FedAvg on the
    # two-head model, mu = lambda = 0, no ALT); FedOpt as torch's server SGD momentum;
    # FedProx in the official code's smooth-L1 form with its script's weight.
    "fedkws": [
        "FedAvg=fedavg",
        "FedProx=fedprox:fedprox.form=smooth_l1,fedprox.mu=0.0001",
        "FedMMD=fedmmd",
        "FedOpt=fedavgm:fedopt.form=torch",
        "FedKWS-UI=fedkwsui",
        "ALT only=fedkwsui:fedkwsui.ls_mu=0,fedkwsui.adv_lambda=0",
        "Two-head FedAvg=fedkwsui:fedkwsui.ls_mu=0,fedkwsui.adv_lambda=0,fedkwsui.alt=false",
        # the same two methods with Kaiming-initialised heads: with PyTorch's default the encoder's
        # gradient through the two heads is 0.13-0.23x the one-head network's (fedkwsui.head_init)
        "FedKWS-UI (Kaiming heads)=fedkwsui:fedkwsui.head_init=kaiming",
        "Two-head FedAvg (Kaiming "
        "heads)=fedkwsui:fedkwsui.ls_mu=0,fedkwsui.adv_lambda=0,fedkwsui.alt=false,fedkwsui.head_init=kaiming",
    ],
}
#: Settings a preset gives every one of its methods, before `--set` (which wins). FedKWS-UI's paper
#: and code average every method's uploads unweighted: its table does, all methods under one setting
#: (`--set aggregation.weighting=n_k` weights them all by n_k).
PRESET_SETTINGS: dict[str, list[str]] = {
    "fedkws": ["aggregation.weighting=uniform", "fedkwsui.aggregation=general"],
}
#: The table's columns: one per kind of model and split, never mixed (report.FINAL_KEYS says what
#: each is).
COLUMNS = {
    "accuracy": "Shared model: test acc.",
    "macro_f1": "Shared model: test macro-F1",
    "client_accuracy_mean": "Shared model: clients' held-out acc.",
    "personalized_local_accuracy_mean": "Own models: clients' held-out acc.",
    "personalized_accuracy_mean": "Own models: test acc.",
}
METRICS = tuple(COLUMNS)
#: Further results.json `final` keys that summary.json's mean_std also averages, for the runs that
#: have them (FedKWS-UI's FA / FR, last-5 mean and clean-test accuracy; UAR for emotion sets).
EXTRA_METRICS = (
    "uar",
    "fa",
    "fr",
    "test_last5_mean",
    "clean_accuracy",
    "client_accuracy_worst10",
    "personalized_local_accuracy_worst10",
)
#: `fedac compare --worst`: columns of the worst 10 % of clients' held-out accuracy (results.json's
#: per_client spreads, metrics.spread), after the columns of their means.
WORST_COLUMNS = {
    "client_accuracy_worst10": "Shared model: worst 10 % clients' held-out acc.",
    "personalized_local_accuracy_worst10": "Own models: worst 10 % clients' held-out acc.",
}
#: per_client spread -> the run's key for it
WORST_SOURCES = {
    "accuracy": "client_accuracy_worst10",
    "own_accuracy": "personalized_local_accuracy_worst10",
}


@dataclass
class Method:
    label: str
    algorithm: str
    overrides: list[str]


def parse_method(text: str) -> Method:
    if "=" not in text:
        raise ConfigError(f"method {text!r} must look like LABEL=ALGORITHM[:key=value,...]")
    label, rest = text.split("=", 1)
    algorithm, _, settings = rest.partition(":")
    overrides = [s.strip() for s in settings.split(",") if s.strip()]
    for item in overrides:
        parse_override(item)
    return Method(label.strip(), algorithm.strip(), overrides)


@dataclass(frozen=True)
class Cell:
    """One method's column over its seeds: mean and std over the runs that have a value (`seeds`
    of them), or, where none has, why not."""

    mean: float | None
    std: float | None
    seeds: int
    why: str | None = None

    def text(self) -> str:
        """'mean ± std' in %; one seed has no spread to show; no value says why."""
        if self.mean is None or self.std is None:
            return f"n/a ({self.why})"
        if self.seeds == 1:
            return f"{100 * self.mean:.2f}"
        return f"{100 * self.mean:.2f} ± {100 * self.std:.2f}"


def why_missing(key: str, runs: list[dict]) -> str:
    """Why no run of a method has a value for `key`: a run's own reason (results.json's
    `unavailable`) where it gives one, else what the method or task lacks."""
    for run in runs:
        if run.get("unavailable", {}).get(key):
            return str(run["unavailable"][key])
    who = runs[0].get("algorithm", "the method") if runs else "the method"
    if key.startswith("personalized_"):
        return f"{who} keeps no own model per client"
    if runs and not any(run.get("has_global_model", True) for run in runs):
        return f"{who} has no shared model"
    if any(run.get("wer") is not None for run in runs):
        return "a CTC task has no clip accuracy"
    if key in WORST_COLUMNS:
        return "its runs record no per-client spread"
    return "no run of it has this metric"


def finished_results(run_dir: Path, rounds: int | None = None) -> dict | None:
    """The results.json of a run that ended, or None (never started, killed before its end, or
    ended before round `rounds`: a table whose schedule grew continues it, `check_same_config`)."""
    path = run_dir / "results.json"
    if not path.is_file():
        return None
    results = json.loads(path.read_text())
    return None if rounds is not None and results.get("rounds", rounds) < rounds else results


HOW_TO_COMPUTE = (
    "runtime.device",
    "runtime.devices",
    "runtime.threads",
    "runtime.execution",
    "runtime.cohort_chunk",
    "runtime.cohort_workers",
    "runtime.client_memory",
    "runtime.keep_freed_memory",
    "runtime.gru_kernel",
    "runtime.dist_timeout",
    "train.checkpoint_every",
)
"""Settings documented (config.py) to leave a run's numbers unchanged, to float rounding: the
`runtime` section but its arithmetic (`precision`, `deterministic`), and checkpoints' spacing."""


def check_same_config(cfg: Config, run_dir: Path) -> bool:
    """A run directory is reused only for the configuration it was made for. The saved file is read
    as a config (settings added to fedac since then take their defaults), so upgrading fedac does
    not orphan a half-finished table; a setting whose value differs still refuses. `out`, the folder
    the run was written to, is not a setting of the run: a moved or copied run directory (a
    committed table copied back to resume it, a run shared by two experiments of the same settings)
    is read back. Nor are the settings that only say how this machine computes the same numbers
    (`HOW_TO_COMPUTE`): a table begun with two cohort workers may be finished with one, or on a
    machine of more cores. A run of fewer `train.rounds` and otherwise the same settings is one the
    table's longer schedule continues from its last checkpoint (`train_run`): True then."""
    saved = run_dir / "config.yaml"

    def settings(config: dict, rounds: bool) -> dict:
        kept = {k: dict(v) if isinstance(v, dict) else v for k, v in config.items() if k != "out"}
        for key in HOW_TO_COMPUTE + (() if rounds else ("train.rounds",)):
            section, name = key.split(".")
            kept.get(section, {}).pop(name, None)
        return kept

    if not saved.is_file():
        return False
    made = load_config(str(saved), algorithm_defaults=False)
    grown = made.train.rounds < cfg.train.rounds
    if settings(made.to_dict(), not grown) != settings(
        yaml.safe_load(yaml.safe_dump(cfg.to_dict())), not grown
    ):
        raise ConfigError(
            f"{run_dir} holds a run of other settings (see its config.yaml); "
            "choose another --out or remove that directory"
        )
    return grown


def read_back(cfg: Config, run_dir: Path) -> dict | None:
    """The results of the run in `run_dir` if it ended (None otherwise), once its settings are
    checked."""
    check_same_config(cfg, run_dir)
    return finished_results(run_dir, cfg.train.rounds)


def _has(run: dict, key: str) -> bool:
    value = run.get(key)
    return value is not None and value == value  # (NaN: a run kept in memory has no value)


def runs_mean_std(runs: dict[str, list[dict]]) -> dict[str, dict[str, Cell]]:
    """Each method's mean and std over its seeds of every METRICS column, and of each EXTRA_METRICS
    key that some run has; a run without a value (a key absent, or None where the task has no such
    metric: CTC runs have no client accuracy) is left out, and a column no run has says why."""
    extra = [k for k in EXTRA_METRICS if any(_has(r, k) for rs in runs.values() for r in rs)]
    stats: dict[str, dict[str, Cell]] = {}
    for label, rs in runs.items():
        stats[label] = {}
        for key in (*METRICS, *extra):
            values = [r[key] for r in rs if _has(r, key)]
            stats[label][key] = (
                Cell(*mean_std(values), seeds=len(values))
                if values
                else Cell(None, None, 0, why_missing(key, rs))
            )
    return stats


def with_mean_std(summary: dict) -> dict:
    """summary.json's contents, strict JSON: each method's `mean_std` column as [mean, std] or,
    where no run has a value, null with its reason under `unavailable`; a run's NaN as null
    (report.json_safe)."""
    from fedac.engine.report import json_safe  # lazy: start-up time (the engine package)

    stats = runs_mean_std(summary["runs"])
    table = {
        label: {k: None if c.mean is None else [c.mean, c.std] for k, c in cells.items()}
        for label, cells in stats.items()
    }
    why = {
        label: {k: c.why for k, c in cells.items() if c.why}
        for label, cells in stats.items()
        if any(c.why for c in cells.values())
    }
    return json_safe({**summary, "mean_std": table, "unavailable": why})


def runs_wall_seconds(runs: dict[str, list[dict]]) -> float:
    """The runs' own wall times, summed: what training took, however many sittings or readings it
    spanned."""
    return sum(r["wall_seconds"] for rs in runs.values() for r in rs)


@contextmanager
def run_lock(run_dir: Path, wait: bool):
    """An exclusive lock on a run directory, held while one process trains that run: two copies of
    the same comparison (one per core) then share its runs instead of training one twice. `flock` on
    the directory itself, so a killed process leaves no stale lock. Yields False when `wait` is
    False and another process holds it. Without fcntl (Windows) runs are not locked."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover
        yield True
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # closing the descriptor releases the lock


@contextmanager
def claim(run_dir: Path, wait: bool, rounds: int | None = None):
    """`run_lock` taken by rank 0 alone under torchrun (this process otherwise), and what it then
    sees, on every rank: (held, the results of a run that ended meanwhile, whether a checkpoint is
    there to resume). Every rank thus trains, reads back or passes over the same runs; the others
    wait in the broadcast, at most `runtime.dist_timeout`, while rank 0 waits for another copy of
    the command."""
    from fedac.engine.checkpoint import CHECKPOINT  # lazy: start-up time (the engine imports torch)
    from fedac.engine.distributed import current_world

    world = current_world()
    if not world.writes:
        yield world.from_rank0(None, "sharing which runs to train")
        return
    with run_lock(run_dir, wait) as held:
        seen = (
            held,
            finished_results(run_dir, rounds) if held else None,
            held and (run_dir / CHECKPOINT).is_file(),
        )
        yield world.from_rank0(seen, "sharing which runs to train")


def cell_folder(label: str) -> str:
    """The folder of one cell (row) of a table of comparisons, named after its label."""
    return label.replace(" ", "_").replace("%", "pct")


def comparison_passes(finished_only: bool) -> list[bool]:
    """`wait_for_others` for each pass of a table made of several comparisons (cells). The first
    pass trains, in every cell, what no other copy of the command holds; only the second waits for
    the rest. Two copies of one command thus keep two cores busy across cells, where waiting at the
    end of each cell would leave a core idle whenever a cell has fewer runs left than copies."""
    return [True] if finished_only else [False, True]


def shared_data(
    built: dict[tuple[int, str], FederatedData], cfg: Config, progress: bool
) -> FederatedData:
    """The federated data of `cfg`, built once per seed and data settings: methods that share them
    share the tensors. `built` holds one seed's data; a new seed drops the last one's."""
    from fedac.engine.data import build_federated_data  # lazy: the engine imports torch

    key = (
        cfg.seed,
        json.dumps([cfg.dataset, asdict(cfg.data), asdict(cfg.features)], sort_keys=True),
    )
    if key not in built:
        if any(seed != cfg.seed for seed, _ in built):
            built.clear()  # a new seed: the last one's data are not needed again
        built[key] = build_federated_data(cfg, progress)
    return built[key]


def train_run(
    cfg: Config,
    run_dir: Path,
    label: str,
    seen: tuple[bool, dict | None, bool],
    built: dict[tuple[int, str], FederatedData],
    progress: bool,
) -> dict:
    """Train (or resume) one run of a comparison that `claim` handed to this process, and return its
    results on every rank; `seen` is `claim`'s (held, results, resume)."""
    # lazy: start-up time (the engine imports torch; the parser does not)
    from fedac.engine.checkpoint import continue_to
    from fedac.engine.distributed import cleanup, current_world, scratch_run_dir
    from fedac.engine.simulator import Simulator
    from fedac.settings.compatibility import check as check_combination

    _, results, resume = seen
    if results is not None:  # it ended between the first look and the lock
        return results
    world = current_world()
    if world.writes and check_same_config(cfg, run_dir):
        continue_to(run_dir, cfg)  # the table's schedule grew: on from its last checkpoint
    check_combination(cfg)  # (before its data)
    data = shared_data(built, cfg, progress)
    if progress:
        print(f"== {label} (seed {cfg.seed}){' resumed' if resume else ''}")
    world.run_dir, where = str(run_dir), scratch_run_dir(world, run_dir)
    try:
        results = Simulator(cfg, where, data=data, progress=progress).run(resume=resume)
    except RunInterrupted as exc:  # the whole comparison continues, not this run alone
        exc.continue_with = (
            "the same command again (runs that ended are read back, this one resumes "
            "from its checkpoint)"
        )
        raise
    finally:
        cleanup(world, where)
        before_run_starts()  # (the next run's estimate counts from here)
    return world.from_rank0(results, "sharing a run's results")  # (rank 0 alone returns them)


def run_row(cfg: Config, run_dir: Path, results: dict) -> dict:
    """One run's row of a comparison: its final metrics, the worst clients' means, what it could not
    compute, its wall time and the source it ran."""
    # (runs written before results.json held per-client spreads have none)
    spreads = results.get("per_client", {}).get("spreads", {})
    worst = {
        key: spreads[metric]["worst10_mean"]
        for metric, key in WORST_SOURCES.items()
        if metric in spreads
    }
    return {
        "seed": cfg.seed,
        "run_dir": str(run_dir),
        "algorithm": results["algorithm"],
        **results["final"],
        **worst,
        "unavailable": results.get("unavailable", {}),
        "wall_seconds": results["wall_seconds"],
        "source_sha256": results.get("code_version", {}).get("source_sha256"),
    }


def method_config(
    base: Config,
    method: Method,
    seed: int,
    run_dir: Path,
    config_path: str | None,
    overrides: list[str],
    last: Sequence[str],
) -> Config:
    """The config of `method`'s run with `seed`. One schedule for every method (no per-algorithm
    defaults): like is compared with like."""
    cfg = load_config(
        config_path,
        # (a method's own settings replace the table's, as a tuned method's do: no repeated --set)
        last_settings(overrides + method.overrides) + list(last),
        algorithm_defaults=False,
        algorithm=method.algorithm,
        dataset=base.dataset,
        seed=seed,
        **{"train.rounds": base.train.rounds},
    )
    cfg.out = str(run_dir)
    # the clients and fraction its run will fit to a small dataset, as config.yaml has them
    fit_user_data(cfg)
    return cfg


def run_comparison(
    base: Config,
    methods: list[Method],
    seeds: list[int],
    out: Path,
    overrides: list[str],
    config_path: str | None,
    progress: bool = True,
    last: Sequence[str] = (),
    on_run: Callable[[dict[str, list[dict]]], None] | None = None,
    finished_only: bool = False,
    wait_for_others: bool = True,
) -> dict:
    """Every method x seed, each in its own run directory under `out`. Runs that already ended are
    read back, and a run killed midway resumes from its checkpoint, so a killed comparison is
    completed by running the same command again. A run another process is training (`run_lock`) is
    passed over and waited for at the end, so the same command started twice uses two cores and each
    copy ends with the whole table. `on_run` sees the runs so far after each one (partial tables).
    `finished_only` trains nothing: the summary holds the runs that have ended (the rest are left
    out) and, as `wall_seconds`, the sum of their own wall times. Without `wait_for_others` the runs
    another process holds are left out instead of waited for (see `comparison_passes`)."""
    # lazy: start-up time (the engine imports torch; the parser does not)
    from fedac.engine.distributed import current_world

    # torchrun: every rank runs the same runs in the same order (each trains its share of every
    # round); rank 0 decides what to train from its disk, writes the run directories and the
    # summary, and prints.
    world = current_world()
    progress = progress and world.writes
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    runs: dict[str, list[dict]] = {m.label: [] for m in methods}
    built: dict[tuple[int, str], FederatedData] = {}

    def record(label: str, cfg: Config, run_dir: Path, results: dict) -> None:
        runs[label].append(run_row(cfg, run_dir, results))
        runs[label].sort(key=lambda r: seeds.index(r["seed"]))
        if on_run is not None:
            on_run(runs)

    elsewhere = []  # runs another process was training when this one reached them
    for seed in seeds:
        for method in methods:
            run_dir = out / f"{method.label.replace(' ', '_').replace('/', '')}-s{seed}"
            cfg = method_config(base, method, seed, run_dir, config_path, overrides, last)
            results = world.on_rank0(partial(read_back, cfg, run_dir), "reading a run's results")
            if results is None and finished_only:
                continue
            if results is None:
                with claim(run_dir, wait=False, rounds=cfg.train.rounds) as seen:
                    if not seen[0]:
                        if progress:
                            print(
                                f"== {method.label} (seed {seed}): another process is training it"
                            )
                        elsewhere.append((method.label, cfg, run_dir))
                        continue
                    results = train_run(cfg, run_dir, method.label, seen, built, progress)
            record(method.label, cfg, run_dir, results)
    for label, cfg, run_dir in elsewhere if wait_for_others else ():
        # until the other process ends it (or dies: then resume it here)
        with claim(run_dir, wait=True, rounds=cfg.train.rounds) as seen:
            results = train_run(cfg, run_dir, label, seen, built, progress)
        record(label, cfg, run_dir, results)
    # With finished_only nothing ran here: report what the runs themselves took.
    wall = runs_wall_seconds(runs) if finished_only else time.perf_counter() - started
    summary = with_mean_std(
        {
            "methods": [m.__dict__ for m in methods],
            "seeds": seeds,
            "runs": runs,
            "wall_seconds": wall,
        }
    )
    if world.writes:
        text = json.dumps(summary, indent=2, default=float, allow_nan=False)
        (out / "summary.json").write_text(text)
        (out / "table.md").write_text(markdown_table(runs))
    return summary


def markdown_table(runs: dict[str, list[dict]], worst: bool = False) -> str:
    """The table of every METRICS column (mean ± std over seeds); `worst` adds the WORST_COLUMNS
    that some run has (n/a for a method whose runs have none)."""
    columns = dict(COLUMNS)
    if worst:
        columns.update(
            {
                k: v
                for k, v in WORST_COLUMNS.items()
                if any(r.get(k) is not None for rs in runs.values() for r in rs)
            }
        )
    lines = ["| Method | " + " | ".join(columns.values()) + " |", "|---" * (len(columns) + 1) + "|"]
    for label, stats in runs_mean_std(runs).items():  # the same cells as summary.json's mean_std
        cells = [
            stats[k].text() if k in stats else f"n/a ({why_missing(k, runs[label])})"
            for k in columns
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def evaluated_rows(run: dict) -> list[dict[str, str]]:
    """The rows of a run's metrics.csv that hold a validation accuracy; none when the run directory
    has no metrics.csv (a run read back from its results.json alone)."""
    import csv

    path = Path(run["run_dir"]) / "metrics.csv"
    if not path.is_file():
        return []
    with open(path, newline="") as handle:
        return [r for r in csv.DictReader(handle) if r.get("val_accuracy")]


UPLOAD_PLOT = "accuracy_vs_upload.png"


def plot_accuracy_vs_upload(runs: dict[str, list[dict]], out: Path) -> Path:
    """`fedac compare --plot-bytes`: each run's validation accuracy at every evaluated round against
    the bytes its clients had uploaded by then (metrics.csv's upload_bytes_total), one colour per
    method."""
    from fedac.engine.report import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for index, (label, rs) in enumerate(runs.items()):
        for k, run in enumerate(rs):
            rows = [r for r in evaluated_rows(run) if r.get("upload_bytes_total")]
            ax.plot(
                [float(r["upload_bytes_total"]) / 2**20 for r in rows],
                [float(r["val_accuracy"]) for r in rows],
                marker="o",
                ms=3,
                color=f"C{index % 10}",
                alpha=0.8,
                label=label if k == 0 else None,
            )
    ax.set_xlabel("cumulative upload (MiB, all clients)"), ax.set_ylabel("validation accuracy")
    ax.grid(alpha=0.3), ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / UPLOAD_PLOT, dpi=100)
    plt.close(fig)
    return out / UPLOAD_PLOT


CURVES_PLOT = "accuracy_curves.png"


def on_virtual_clock(runs: dict[str, list[dict]]) -> bool:
    """Whether every run compared logged the virtual clock (metrics.csv's virtual_time_s)."""
    every = [run for rs in runs.values() for run in rs]
    return bool(every) and all(
        any(r.get("virtual_time_s") for r in evaluated_rows(run)) for run in every
    )


def plot_accuracy_curves(runs: dict[str, list[dict]], path: Path, title: str = "") -> Path:
    """Each run's validation accuracy at every evaluated round, one colour per method: against the
    round (a server update in the asynchronous modes) and, when the runs are on the virtual clock
    (`on_virtual_clock`), beside it against virtual time (metrics.csv's virtual_time_s)."""
    from fedac.engine.report import pyplot

    plt = pyplot()
    axes_x = [("round", "round (server update in the asynchronous modes)")]
    if on_virtual_clock(runs):
        axes_x.append(("virtual_time_s", "virtual time (s)"))
    fig, axes = plt.subplots(1, len(axes_x), figsize=(6 * len(axes_x), 4.5), squeeze=False)
    for index, (label, rs) in enumerate(runs.items()):
        for k, run in enumerate(rs):
            rows = evaluated_rows(run)
            for ax, (column, _) in zip(axes[0], axes_x):
                ax.plot(
                    [float(r[column]) for r in rows],
                    [100 * float(r["val_accuracy"]) for r in rows],
                    marker="o",
                    ms=2,
                    color=f"C{index % 10}",
                    alpha=0.8,
                    label=label if k == 0 else None,
                )
    for ax, (_, xlabel) in zip(axes[0], axes_x):
        ax.set_xlabel(xlabel), ax.set_ylabel("validation accuracy (%)"), ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


#: How a comparison or table over several processes goes on after a failed collective
#: (engine/distributed.py).
AGAIN = (
    "the same `fedac %s` command (runs that ended are read back, the one under way resumes from "
    "its checkpoint)"
)


def cmd_compare(args: argparse.Namespace) -> int:
    texts = list(args.methods or [])
    if args.preset:
        if args.preset not in PRESETS:
            raise ConfigError(f"unknown preset '{args.preset}'. Presets: {', '.join(PRESETS)}")
        texts = PRESETS[args.preset] + texts
    if not texts:
        raise ConfigError("give --preset NAME or --method LABEL=ALGORITHM[:k=v,...] (repeatable)")
    methods = [parse_method(t) for t in texts]
    overrides = PRESET_SETTINGS.get(args.preset, []) + list(args.overrides)
    base = load_config(
        args.config, overrides, dataset=args.dataset, **{"train.rounds": args.rounds}
    )
    # as `fedac run`: a short comparison evaluates at least MIN_EVALUATIONS times, all methods alike
    changed = fit_eval_schedule(base)
    if changed:
        overrides.append(f"train.eval_every={base.train.eval_every}")
        if not args.quiet:
            print(f"fedac: {changed}", file=sys.stderr)
    from fedac.engine import distributed  # lazy: start-up time (torch)

    # torchrun: every rank runs the same runs; rank 0 alone writes and prints
    # (engine/distributed.py)
    with distributed.joined(
        base.runtime.dist_timeout, base.runtime.device, AGAIN % "compare"
    ) as world:
        out = Path(
            world.from_rank0(
                args.out or f"runs/compare-{time.strftime('%Y%m%d-%H%M%S')}", "naming --out"
            )
        )
        summary = run_comparison(
            base,
            methods,
            args.seeds,
            out,
            overrides,
            args.config,
            progress=not args.quiet,
            finished_only=args.finished_only,
        )
    if not world.writes:
        return 0
    if args.worst:
        (out / "table.md").write_text(markdown_table(summary["runs"], worst=True))
    if args.plot_bytes:
        print(f"accuracy against upload bytes: {plot_accuracy_vs_upload(summary['runs'], out)}")
    if args.plot_curves or on_virtual_clock(summary.get("runs", {})):  # (no runs: nothing to draw)
        drawn = plot_accuracy_curves(summary["runs"], out / CURVES_PLOT)
        print(f"accuracy against rounds (and virtual time, on the clock): {drawn}")
    print((out / "table.md").read_text())
    took = (
        "the runs' own wall times, summed"
        if args.finished_only
        else "this command's wall time, data building included"
    )
    print(
        f"{len(methods)} methods x {len(args.seeds)} seeds in {summary['wall_seconds']:.0f} s "
        f"({took}); results in {out}"
    )
    return 0


def add_grid_arguments(p: argparse.ArgumentParser, out_help: str) -> None:
    """The options that `compare` and `reproduce` share."""
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--rounds", type=int)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", help=out_help)
    p.add_argument("--quiet", action="store_true")
    p.add_argument(
        "--finished-only",
        action="store_true",
        help="train nothing: write the tables from the runs in --out that have ended",
    )


def add_compare_parser(sub) -> None:
    p = sub.add_parser("compare", help="several methods x seeds, summarised as mean ± std")
    p.add_argument("--preset", help=f"named method list: {', '.join(PRESETS)}")
    p.add_argument(
        "--method",
        dest="methods",
        action="append",
        metavar="LABEL=ALGO[:k=v,...]",
        help="a method (repeatable), e.g. FedAvg+LPA=fedavg:aggregation.method=lpa; ALGO is one "
        f"of {', '.join(ALGORITHMS)}",
    )
    p.add_argument("--config")
    p.add_argument(
        "--dataset", metavar="NAME", help=f"one of {', '.join(DATASETS)} (default {Config.dataset})"
    )
    add_grid_arguments(
        p, "output folder (default runs/compare-<time>); rerun to complete a killed comparison"
    )
    p.add_argument(
        "--worst",
        action="store_true",
        help="table.md adds the worst 10 %% of clients' held-out accuracy (mean ± std over seeds)",
    )
    p.add_argument(
        "--plot-bytes",
        action="store_true",
        help=f"also draw {UPLOAD_PLOT}: validation accuracy against cumulative upload bytes",
    )
    p.add_argument(
        "--plot-curves",
        action="store_true",
        help=f"also draw {CURVES_PLOT}: validation accuracy against rounds, and beside it against "
        "virtual time when the runs are on the virtual clock (system.*; then it is drawn unasked)",
    )
    p.set_defaults(func=cmd_compare)
