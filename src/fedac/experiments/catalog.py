"""Every paper table fedac reproduces, by name: the specs of each paper's file, gathered once.

`fedac reproduce` with no name prints `listing()`; `fedac reproduce NAME` runs
`experiment_named(NAME)`. A new table is a new spec in its paper's file (or a new paper file added
to `PAPERS`), never a branch here.
"""

from __future__ import annotations

from fedac.errors import ConfigError
from fedac.experiments import (
    communication,
    earlyexit,
    fedkws,
    fedmlac,
    pfl,
    robustness,
    selection,
    system,
    zeroshot,
)
from fedac.experiments.spec import Experiment

#: The papers' spec files, in the order `fedac reproduce` lists them.
PAPERS = (
    fedmlac,
    fedkws,
    robustness,
    earlyexit,
    zeroshot,
    pfl,
    system,
    selection,
    communication,
)
SPECS: list[Experiment] = [spec for paper in PAPERS for spec in paper.SPECS]
#: Name (and alias) -> spec.
EXPERIMENTS: dict[str, Experiment] = {
    name: spec for spec in SPECS for name in (spec.name, *spec.aliases)
}


def experiment_named(name: str) -> Experiment:
    if name not in EXPERIMENTS:
        raise ConfigError(f"unknown experiment '{name}'. Experiments: {', '.join(EXPERIMENTS)}")
    return EXPERIMENTS[name]


def listing() -> str:
    """One line per experiment: name (aliases), paper, table or figure, estimated cost; then each
    cost's source."""
    header = ("experiment", "paper", "table / figure", "CPU-hours")
    rows = [
        (
            spec.name + "".join(f" ({alias})" for alias in spec.aliases),
            spec.paper,
            spec.table,
            f"{spec.cost.cpu_minutes / 60:,.1f}",
        )
        for spec in SPECS
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
        for row in [header, *rows]
    ]
    lines += [
        "",
        "CPU-hours: the default command's runs (default datasets, seeds 0 1 2, every method), "
        "their wall times summed, on the two-core machine the committed results were made on; two "
        "copies of the command side by side share the runs and finish in about half. Where each "
        "estimate comes from:",
    ]
    lines += [f"  {spec.name}: {spec.cost.source}" for spec in SPECS]
    return "\n".join(lines)
