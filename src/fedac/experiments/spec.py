"""What a paper table is, as data: `Experiment` (the spec), `Cost` (its measured price), `Cell` (one
comparison of methods x seeds in its own folder), `Layout` (the hooks of a table that needs its own
cells or post-processing) and `Request` (what one `fedac reproduce NAME` command line asks for).

A spec names its table, methods, cells (datasets x variants), protocol settings, table kinds and
cost; runner.py turns any spec into runs and writes table.md, results.csv and its figure. A table
whose rows or columns are not "methods x (dataset, variant)" (the robustness grid, the early-exit
and zero-shot tables) names a `Layout` whose functions build its cells and write its files; the
runner dispatches through the spec, never through the experiment's name. No torch here (the `fedac`
parser reads the specs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedac.config import Config
from fedac.experiments.compare import Method

#: The tables written by default, one per kind of model and split (report.FINAL_KEYS): result key ->
#: title.
TABLES = {
    "accuracy": "Shared model on the test split (accuracy)",
    "personalized_local_accuracy_mean": (
        "Clients' own models on their own held-out data (mean accuracy over clients)"
    ),
    "personalized_accuracy_mean": (
        "Clients' own models on the test split (mean accuracy over clients)"
    ),
}

#: Options of `fedac reproduce` beyond the ones every experiment reads (--seeds, --rounds, --set,
#: --out, --quiet, --datasets); an experiment lists those it reads in `Experiment.options`, the rest
#: are refused.
OPTIONS = (
    "--methods",
    "--finished-only",
    "--attacks",
    "--fractions",
    "--aggregators",
    "--central-epochs",
    "--worst",
)
GRID_OPTIONS = ("--methods", "--finished-only", "--worst")


@dataclass(frozen=True)
class Cost:
    """What the experiment's default command (its default datasets, seeds 0 1 2, every method)
    costs."""

    cpu_minutes: float
    """Summed wall time of its runs, in minutes, on the two-core machine the results were made on
    (each run on one core: two copies of the command side by side finish in about half)."""
    source: str
    """Where the figure comes from: a committed result's wall times (and how they were scaled to the
    default grid), or the documented estimate."""


@dataclass(frozen=True)
class Cell:
    """One comparison of a table: its methods x seeds, each run in `folder/<method>-s<seed>`."""

    label: str
    """The cell's name in the table (a column, or a row of the robustness grid)."""
    dataset: str
    folder: Path
    base: Config
    """Gives the runs their dataset and `train.rounds` (compare.run_comparison)."""
    settings: list[str]
    """Every run's settings before its method's own (the protocol's, the dataset's, the cell's)."""
    methods: list[Method]
    last: list[str] = field(default_factory=list)
    """Settings after the method's own (the user's --set and --rounds, unless `settings` holds
    them)."""


@dataclass
class Request:
    """One `fedac reproduce NAME` command line (reproduce.py builds it from the parsed
    arguments)."""

    out: Path
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    overrides: list[str] = field(default_factory=list)
    datasets: list[str] | None = None
    rounds: int | None = None
    command: str = ""
    progress: bool = True
    methods: list[str] | None = None
    finished_only: bool = False
    attacks: list[str] | None = None
    fractions: list[float] | None = None
    aggregators: list[str] | None = None
    central_epochs: int | None = None
    worst: bool = False
    """table.md adds the worst 10 % of clients' held-out accuracy (compare.WORST_COLUMNS)."""

    @property
    def user(self) -> list[str]:
        """The user's settings, which come last: --set, then --rounds."""
        return list(self.overrides) + (
            [f"train.rounds={self.rounds}"] if self.rounds is not None else []
        )


@dataclass(frozen=True)
class Layout:
    """How a table's cells are built, run and written. runner.GRID is the default: cells = datasets
    x variants, every method in each, written as one Markdown table per `Experiment.tables` key."""

    cells: Callable[[Experiment, Request], list[Cell]]
    write: Callable[[Experiment, Request, list[Cell], dict[str, dict[str, list[dict]]]], None]
    """(spec, request, cells, runs by cell label and method label) -> writes the table's files."""
    run_cell: Callable[[Cell, Request, Callable, bool], Any] | None = None
    """(cell, request, on_run, wait_for_others); None: compare.run_comparison of the cell's
    methods."""
    figure: str = "figure.png"
    """The figure's file name (said when the table is done)."""
    two_passes: bool = True
    """Whether copies of the command share the cells' runs (compare.comparison_passes)."""
    partial_seconds: float = 0.0
    """While training, the files are rewritten after a run at most this often (0: after every
    run)."""


@dataclass(frozen=True)
class Experiment:
    """One paper table or figure, as data."""

    name: str
    """`fedac reproduce NAME`."""
    paper: str
    table: str
    """The paper's table or figure ("Table 4", "Fig. 2"); "-" for a table beyond the paper."""
    title: str
    cost: Cost
    methods: list[str] = field(default_factory=list)
    """`LABEL=ALGORITHM[:key=value,...]` (compare.parse_method); a layout may derive its own."""
    variants: list[tuple[str, list[str]]] = field(default_factory=list)
    """(column label, settings) varied within each dataset; one unlabeled column when empty."""
    datasets: tuple[str, ...] = ()
    """The datasets of the default command (--datasets chooses others)."""
    dataset_settings: dict[str, list[str]] = field(default_factory=dict)
    """The datasets the table runs on, each with its own protocol settings."""
    protocol: list[str] = field(default_factory=list)
    """Settings every run starts from (a cell's, the method's and the user's come after)."""
    tables: dict[str, str] = field(default_factory=lambda: dict(TABLES))
    """The table kinds written: result key -> title."""
    curves: bool = False
    """Also write curves.png: each run's validation (and test) accuracy per round."""
    notes: Callable[[list[str], list[Method], str, list[int]], list[str]] | None = None
    """(settings, methods, dataset, seeds) -> lines written under the table's protocol line."""
    options: tuple[str, ...] = GRID_OPTIONS
    """The `OPTIONS` this experiment reads."""
    layout: Layout | None = None
    """None: runner.GRID."""
    aliases: tuple[str, ...] = ()
    """Other names of the same experiment (the same runs and files)."""
