"""`fedac reproduce [NAME]`: with no name, every paper table fedac reproduces (catalog.listing:
name, paper, table or figure, estimated cost); with a name, that table's runs and its table.md,
results.csv and figure (runner.run_experiment on the spec), on the stand-ins or on real copies with
`--set data.root=...`.

Every run keeps its run directory under `--out` (default runs/reproduce-<NAME>), so running the same
command again completes a killed table. An option the experiment does not read
(`Experiment.options`) is refused, not silently dropped.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from fedac.config import load_config
from fedac.errors import ConfigError
from fedac.experiments.catalog import EXPERIMENTS, experiment_named, listing
from fedac.experiments.compare import AGAIN, add_grid_arguments
from fedac.experiments.fedmlac import STAND_INS
from fedac.experiments.runner import GRID, run_experiment
from fedac.experiments.spec import Request


def request_from_args(args: argparse.Namespace) -> Request:
    return Request(
        out=Path(args.out or f"runs/reproduce-{args.experiment}"),
        seeds=args.seeds,
        overrides=list(args.overrides),
        datasets=args.datasets,
        rounds=args.rounds,
        command="fedac " + " ".join(shlex.quote(a) for a in args.argv),
        progress=not args.quiet,
        methods=args.methods,
        finished_only=args.finished_only,
        attacks=args.attacks,
        fractions=args.fractions,
        aggregators=args.aggregators,
        central_epochs=args.central_epochs,
        worst=args.worst,
    )


def cmd_reproduce(args: argparse.Namespace) -> int:
    if args.experiment is None:
        print(listing())
        return 0
    spec = experiment_named(args.experiment)
    given = {
        "--methods": args.methods,
        "--finished-only": args.finished_only,
        "--attacks": args.attacks,
        "--fractions": args.fractions,
        "--aggregators": args.aggregators,
        "--central-epochs": args.central_epochs is not None,
        "--worst": args.worst,
    }
    # --worst adds tables to the default writer's table.md; a table with a writer of its own has no
    # such tables.
    options = (
        spec.options
        if spec.layout in (None, GRID)
        else tuple(o for o in spec.options if o != "--worst")
    )
    unused = [option for option, value in given.items() if value and option not in options]
    if unused:
        hint = (
            " (rerun the same command to complete a killed table)"
            if "--finished-only" in unused
            else ""
        )
        raise ConfigError(f"{args.experiment} does not use {', '.join(unused)}{hint}")
    request = request_from_args(args)
    from fedac.engine import distributed  # lazy: start-up time (torch)

    # torchrun: every rank runs the same runs; rank 0 alone writes and prints
    # (engine/distributed.py)
    train = load_config(None, request.user).train
    with distributed.joined(train.dist_timeout, train.device, AGAIN % "reproduce") as world:
        request.progress = request.progress and world.writes
        summary = run_experiment(spec, request)
    if not world.writes:
        return 0
    runs = sum(len(rs) for by_method in summary["runs"].values() for rs in by_method.values())
    print((request.out / "table.md").read_text())
    print(
        f"{len(summary['cells'])} cells, {runs} runs in {summary['wall_seconds']:.0f} s (this "
        f"command's wall time); table.md, results.csv, {summary['figure']} in {request.out}"
    )
    return 0


def add_reproduce_parser(sub) -> None:
    p = sub.add_parser(
        "reproduce",
        help="a paper's table: FedMLAC's Tables 4-7 and Figs. 2-3, FedKWS-UI's, the "
        "robustness grid, the early-exit and zero-shot papers' tables; with no "
        "name, the list of them with their cost",
    )
    p.add_argument(
        "experiment", nargs="?", help=f"one of: {', '.join(EXPERIMENTS)} (none: list them)"
    )
    p.add_argument(
        "--datasets",
        nargs="+",
        help=f"default the experiment's (FedMLAC's: {' '.join(STAND_INS)}); "
        "a real copy: --set data.root=DIR",
    )
    p.add_argument(
        "--methods",
        nargs="+",
        metavar="LABEL",
        help="only these of the experiment's methods (by label; robustness: its algorithms)",
    )
    p.add_argument(
        "--attacks", nargs="+", help="robustness: attack rows (default all kinds of attack.kind)"
    )
    p.add_argument(
        "--fractions",
        nargs="+",
        type=float,
        help="robustness: malicious fractions (default 0.1 0.2 0.3)",
    )
    p.add_argument(
        "--aggregators",
        nargs="+",
        help="robustness: aggregator columns (default all; quote names with spaces)",
    )
    p.add_argument(
        "--central-epochs",
        type=int,
        help="earlyexit-table1: the centralised rows' epochs (default: "
        "rounds x train.fraction, the clips an FL row trains on in all)",
    )
    p.add_argument(
        "--worst",
        action="store_true",
        help="table.md adds the worst 10 %% of clients' held-out accuracy (mean ± std over seeds)",
    )
    add_grid_arguments(p, "output folder (default runs/reproduce-<experiment>); rerun to resume")
    p.set_defaults(func=cmd_reproduce)
