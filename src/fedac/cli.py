"""The `fedac` command line: run, data, models, list (and compare, reproduce, report, memory,
pretrain: experiments/).

Building the parser loads no torch, scipy, scikit-learn, matplotlib, transformers or Flower (the
modules imported here are light, tests/test_cli_startup.py checks it): `fedac --help` starts at
once, and each command loads what it needs when it runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from fedac.algorithms import ALGORITHMS
from fedac.config import Config, fit_eval_schedule, load_config, save_config
from fedac.data.partition import class_entropy, partition
from fedac.data.registry import DATASETS, dataset_spec, load_manifest, synthesizer
from fedac.data.traces import FEDSCALE_REFERENCE_GFLOPS, import_fedscale, write_synthetic
from fedac.engine.report import format_table
from fedac.errors import ConfigError, FedacError, RunInterrupted
from fedac.experiments.compare import add_compare_parser
from fedac.experiments.exit_memory import add_memory_parser
from fedac.experiments.figures import add_report_parser
from fedac.experiments.pretrain_settings import add_pretrain_parser
from fedac.experiments.reproduce import add_reproduce_parser
from fedac.experiments.sweep import add_sweep_parser
from fedac.export.commands import add_export_parsers
from fedac.progress import before_run_starts


def _add_experiment_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML config file (e.g. a run directory's config.yaml)")
    parser.add_argument(
        "--algorithm",
        metavar="NAME",
        help=f"one of {', '.join(ALGORITHMS)} (default {Config.algorithm})",
    )
    parser.add_argument(
        "--dataset", metavar="NAME", help=f"one of {', '.join(DATASETS)} (default {Config.dataset})"
    )
    parser.add_argument("--rounds", type=int, help="communication rounds")
    parser.add_argument("--seed", type=int, help="run seed")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any setting, e.g. --set train.fraction=0.1 --set data.root=/data/gsc (repeatable)",
    )


def _experiment_config(args: argparse.Namespace) -> Config:
    return load_config(
        args.config,
        args.overrides,
        algorithm=args.algorithm,
        dataset=args.dataset,
        seed=args.seed,
        **{"train.rounds": args.rounds},
    )


def default_run_dir(cfg: Config) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{stamp}-{cfg.algorithm}-{cfg.dataset}-s{cfg.seed}"


def chosen_run_dir(args: argparse.Namespace, cfg: Config) -> tuple[Path, str | None]:
    """A new run's directory: --out, else `out` of the config file or --set where it holds no run
    yet, else runs/<time>-... A run's own config.yaml, run again, writes the repeat to a new
    directory (the line returned says so); any other `out` that holds a run is refused, never
    overwritten nor silently replaced."""
    if args.out:
        return Path(args.out), None
    if not cfg.out:
        return default_run_dir(cfg), None
    out = Path(cfg.out)
    if not (out / "config.yaml").exists():
        return out, None
    if args.config and Path(args.config).resolve() == (out / "config.yaml").resolve():
        run_dir = default_run_dir(cfg)
        return (
            run_dir,
            f"{out} holds the run this config.yaml came from; the repeat writes {run_dir}",
        )
    raise ConfigError(
        f"out: {out} (from {args.config or '--set'}) holds a run already; continue it with "
        f"`fedac run --resume {out}`, or give another --out"
    )


def resumed_run(args: argparse.Namespace) -> tuple[Path, Config]:
    """`--resume DIR`: the run to continue and its config. `--rounds N` continues it to round N (a
    finished run too: 100 more rounds of a table's run); `--out NEW` continues a copy in NEW and
    leaves DIR as it was. Settings that would make it another run are refused."""
    run_dir = Path(args.resume)
    if not (run_dir / "config.yaml").is_file():
        raise FedacError(f"{run_dir} is not a fedac run directory (no config.yaml)")
    given = [
        flag
        for flag, value in (
            ("--config", args.config),
            ("--algorithm", args.algorithm),
            ("--dataset", args.dataset),
            ("--seed", args.seed),
            ("--set", args.overrides),
        )
        if value not in (None, [])
    ]
    if given:
        raise ConfigError(
            f"--resume continues the run in {run_dir} with its own config.yaml: {', '.join(given)} "
            "would make it another run (only --rounds, --out, --quiet and --stop-after go with it)"
        )
    cfg = load_config(run_dir / "config.yaml")
    if args.rounds is not None and args.rounds < cfg.train.rounds:
        raise ConfigError(
            f"--rounds {args.rounds}: the run in {run_dir} has {cfg.train.rounds} rounds; a "
            "resumed run goes on to as many or more"
        )
    copied = bool(args.out) and Path(args.out).resolve() != run_dir.resolve()
    extended = args.rounds is not None and args.rounds > cfg.train.rounds
    if (copied or extended) and os.environ.get("WORLD_SIZE", "1") != "1":
        raise ConfigError(
            "--resume with --rounds or --out changes the run directory before it trains: start "
            "it in one process, without torchrun"
        )
    if copied:
        copy = Path(args.out)
        if copy.exists():
            raise ConfigError(f"--out {copy} exists; a copy of {run_dir} goes to a new directory")
        shutil.copytree(run_dir, copy)
        run_dir = copy
    cfg.out = str(run_dir)
    if extended:
        from fedac.engine.checkpoint import continue_to  # lazy: the engine imports torch

        cfg.train.rounds = args.rounds
        continue_to(run_dir, cfg)
    elif copied:
        save_config(cfg, run_dir / "config.yaml")  # (its `out`)
    return run_dir, cfg


def cmd_run(args: argparse.Namespace) -> int:
    changed = moved = None
    if args.resume:
        run_dir, cfg = resumed_run(args)
    else:
        cfg = _experiment_config(args)
        changed = fit_eval_schedule(cfg)
        run_dir, moved = chosen_run_dir(args, cfg)
        cfg.out = str(run_dir)
    from fedac.engine import distributed  # lazy: start-up time (after the settings are checked)
    from fedac.engine.runner import runner_for

    # torchrun: every rank trains its share of each round; rank 0 alone writes and prints
    # (engine/distributed.py)
    world = distributed.start(cfg.runtime.dist_timeout, cfg.runtime.device)
    # (named in its errors; rank 0 writes it, the other ranks a scratch folder)
    world.run_dir = str(run_dir)
    try:
        if not world.writes:
            logging.getLogger().setLevel(logging.ERROR)  # (rank 0 logs the run's warnings)
        elif world.distributed and not args.quiet:
            print(
                f"fedac: {world.size} processes ({world.backend}); rank 0 writes {run_dir}",
                file=sys.stderr,
            )
        for line in (changed, moved) if world.writes and not args.quiet else ():
            if line:
                print(f"fedac: {line}", file=sys.stderr)
        runner, final_table = runner_for(cfg)
        where = distributed.scratch_run_dir(world, run_dir)
        try:
            results = runner(cfg, where, progress=not args.quiet and world.writes).run(
                resume=bool(args.resume), stop_after=args.stop_after
            )
        finally:
            distributed.cleanup(world, where)
    finally:
        distributed.stop()
    if not world.writes:
        return 0
    if results is None:
        print(f"stopped after round {args.stop_after}; continue with: fedac run --resume {run_dir}")
        return 0
    print(final_table(results))
    print(f"run directory: {run_dir}")
    return 0


def shape_only(name: str, num_features: int, num_classes: int):
    """Model `name` built on torch's meta device: its parameters' shapes without memory, values or
    initialisation (w2v2_base's 90 M parameters in milliseconds), and an SSL encoder at its named
    size without reading its checkpoint. A builder that cannot build there (a plug-in that loads
    weights) builds for real."""
    import torch  # lazy: start-up time

    from fedac.config import ModelConfig
    from fedac.models import build_model

    try:
        with torch.device("meta"):
            return build_model(
                name, num_features, num_classes, options=ModelConfig(encoder_path="random")
            )
    except Exception:  # (any builder's failure: the real build says what is wrong)
        return build_model(name, num_features, num_classes)


#: Frames of a 1 s clip at the default 10 ms hop (the FLOPs column).
FRAMES_1S = 101


def feature_model_row(name: str, args: argparse.Namespace) -> tuple[int, float, str]:
    """(parameters, forward FLOPs of one 1 s clip (models/flops.py), stacked path) of a feature
    network, built for real (the largest has 0.34 M parameters: milliseconds; the meta device would
    load torch's compiler for its initialisers)."""
    import torch  # lazy: start-up time

    from fedac.models import build_model, count_parameters
    from fedac.models.flops import count_forward_flops
    from fedac.training.functional import stacked_support

    # (training mode: in eval mode KWT's encoder takes torch's fused fast path, one function the
    # formulas do not see; no zoo network's forward FLOPs differ between the modes otherwise)
    model = build_model(name, args.num_features, args.num_classes).train()
    try:
        flops = count_forward_flops(model, torch.zeros(1, args.num_features, FRAMES_1S))
    except Exception:  # (a plug-in that reads other inputs: no figure)
        flops = float("nan")
    return count_parameters(model), flops, stacked_support(name, model)


class ModelRows:
    """`feature_model_row` of each built-in feature network, kept in $FEDAC_HOME/models/ keyed by
    the training code's sha256 (version.py), torch's version and the sizes asked for: a second
    `fedac models` then loads no torch (building and counting the zoo takes about a second). A
    plug-in's row is always computed (its code is not in the key)."""

    def __init__(self, args: argparse.Namespace):
        import hashlib
        from importlib.metadata import version

        from fedac.version import source_sha256

        key = f"{source_sha256()}|{version('torch')}|{args.num_features}|{args.num_classes}"
        home = Path(os.environ.get("FEDAC_HOME") or Path.home() / ".cache" / "fedac")
        self.path = home / "models" / f"rows-{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"
        self.args, self.changed = args, False
        try:
            self.rows = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.rows = {}

    def get(self, name: str, plugin: bool) -> tuple[int, float, str]:
        if plugin or name not in self.rows:
            row = feature_model_row(name, self.args)
            if plugin:
                return row
            self.rows[name], self.changed = list(row), True
        params, flops, stacked = self.rows[name]
        return int(params), float(flops), str(stacked)

    def ssl_note(self) -> str:
        if "_ssl" not in self.rows:
            self.rows["_ssl"], self.changed = _ssl_stacked_note(), True
        return str(self.rows["_ssl"])

    def save(self) -> None:
        if self.changed:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
                tmp.write_text(json.dumps(self.rows))
                os.replace(tmp, self.path)
            except OSError:  # (a read-only home: the next call counts again)
                pass


def cmd_models(args: argparse.Namespace) -> int:
    from fedac.models.ssl_sizes import ssl_counts  # lazy: start-up time (no torch)
    from fedac.settings.models import MODELS as TABLE
    from fedac.settings.models import SSL_NAMES

    print(
        f"fedac: sizing the {len(TABLE)} models (the SSL encoders from their measured table, "
        "models/ssl_sizes.py)",
        file=sys.stderr,
        flush=True,
    )
    MODELS = TABLE  # (the torch-free registry table: names, descriptions, plug-ins)
    notes: list[str] = []
    rows = []
    cache = ModelRows(args)
    for name, _ in MODELS.items():
        if name in SSL_NAMES:
            c = ssl_counts(name, args.num_classes)
            params, flops, stacked = c["params"], float(c["flops"]), cache.ssl_note()
        else:
            params, flops, stacked = cache.get(name, MODELS.is_plugin(name))
        if stacked.startswith("no"):
            if stacked not in notes:
                notes.append(stacked)
            stacked = f"no [{notes.index(stacked) + 1}]"
        mflops = f"{flops / 1e6:,.1f}" if flops == flops else "?"
        rows.append(
            (
                name,
                f"{params:,}",
                f"{4 * params / 1e6:.3f}",
                mflops,
                stacked,
                MODELS.description(name),
            )
        )
    print(
        f"models for {args.num_features} input features and {args.num_classes} classes: "
        "parameters, their fp32 size (MB), forward MFLOPs of one 1 s clip, and how the stacked "
        "path trains each (docs/extending.md):"
    )
    cache.save()
    table = format_table([(n, "  ".join(cells)) for n, *cells in _aligned(rows)])
    print("\n".join(line.rstrip() for line in table.splitlines()))
    for i, note in enumerate(notes, 1):
        print(f"[{i}] {note.removeprefix('no: ')}")
    ssl = [name for name, _ in MODELS.items() if name in SSL_NAMES]
    if ssl:
        print(
            "[*] SSL encoders: the model a client holds; the CNN feature encoder is frozen "
            "(model.freeze_cnn), runs once per clip when the data is built, and is counted apart: "
            + ", ".join(f"{n} {ssl_counts(n, 1)['cnn']:,}" for n in ssl)
            + " (w2v2_s: 2,536,611 + 263,680 = docs/ssl.md's 2.79 M, the whole encoder); its "
            "FLOPs are not in the figure"
        )
        print(
            "\nSSL encoders by model.peft: trainable parameters / upload of a client training the "
            "whole model (fp32; lora: r 8 on q_proj, v_proj; ia3: k_proj, v_proj, output_dense; "
            "docs/ssl.md):"
        )
        print(format_table([(name, peft_footprint(name, args)) for name in ssl]))
    return 0


def _aligned(rows: list) -> list[tuple[str, ...]]:
    """Numbers right-aligned and headed, per column."""
    heads = ("", "parameters", "MB", "MFLOPs", "stacked", "")
    rows = [heads, *rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(heads))]
    return [
        (
            r[0],
            *(
                c.rjust(w) if i < 3 else c.ljust(w) if i == 3 else c
                for i, (c, w) in enumerate(zip(r[1:], widths[1:]))
            ),
        )
        for r in rows
    ]


def _ssl_stacked_note() -> str:
    """Why the stacked path does not train the SSL encoders (training/functional.py's reasons)."""
    from fedac.training.functional import SSL_MEASURED

    return f"no: {SSL_MEASURED}; has its own task_loss (padded waveform batches)"


def peft_footprint(name: str, args: argparse.Namespace) -> str:
    """Each `model.peft` choice's trainable parameters and upload (fp32) for SSL model `name`,
    from the measured table (models/ssl_sizes.py)."""
    from fedac.models.ssl_sizes import ssl_counts
    from fedac.settings.models import PEFT_METHODS

    counts = ssl_counts(name, args.num_classes)
    return "   ".join(f"{m} {counts[m]:>10,} / {4 * counts[m] / 1e6:7.3f} MB" for m in PEFT_METHODS)


#: `fedac list`: each kind's registry, as "module:attribute": the torch-free tables of settings/,
#: loaded when listed (a part's description comes from its table or its source, never by importing
#: torch).
REGISTRIES = {
    "algorithms": "fedac.settings.algorithms:ALGORITHMS",
    "models": "fedac.settings.models:MODELS",
    "datasets": "fedac.settings.datasets:DATASETS",
    "aggregators": "fedac.settings.aggregation:AGGREGATORS",
    "attacks": "fedac.settings.attacks:ATTACKS",
    "clock_modes": "fedac.settings.clock:CLOCK_MODES",
    "availability": "fedac.settings.clock:AVAILABILITY",
    "codecs": "fedac.settings.codecs:CODECS",
    "selectors": "fedac.settings.selection:SELECTORS",
}


def cmd_list(args: argparse.Namespace) -> int:
    from fedac.registry import resolve  # lazy: start-up time

    unknown = [kind for kind in args.kinds if kind not in REGISTRIES]
    if unknown:
        raise ConfigError(
            f"fedac list: unknown kind(s) {', '.join(unknown)}; choose from {', '.join(REGISTRIES)}"
        )
    for kind in args.kinds or list(REGISTRIES):
        registry = resolve(REGISTRIES[kind])
        rows = [
            (name, ("[plug-in] " if registry.is_plugin(name) else "") + registry.description(name))
            for name, _ in registry.items()
        ]
        print(f"{kind} (entry-point group {registry.group}):")
        print("\n".join("  " + line for line in format_table(rows).splitlines()))
    return 0


def cmd_synth(args: argparse.Namespace) -> int:
    spec = dataset_spec(args.dataset_name)
    kwargs = (
        {spec.synth_size_arg: args.size} if spec.synth_size_arg and args.size is not None else {}
    )
    stats = synthesizer(spec)(Path(args.out), seed=args.seed, progress=not args.quiet, **kwargs)
    print(f"wrote synthetic {args.dataset_name} in its official layout to {args.out}")
    if isinstance(stats, dict):
        for key, value in stats.items():
            print(f"  {key}: {value}")
    return 0


def _data_config(args: argparse.Namespace) -> Config:
    cfg = load_config(args.config, args.overrides, dataset=args.dataset)
    if args.root:
        cfg.data.root = args.root
    return cfg


def cmd_stats(args: argparse.Namespace) -> int:
    cfg = _data_config(args)
    manifest = load_manifest(cfg, progress=not args.quiet)
    clients = partition(manifest, cfg.data, cfg.seed, dataset_spec(cfg.dataset).default_partition)
    sizes = np.array([c.num_samples + len(c.holdout) for c in clients])
    entropy = np.array(
        [
            class_entropy(
                [manifest.clips[i].label for i in c.train + c.holdout], manifest.num_classes
            )
            for c in clients
        ]
    )
    counts = manifest.counts()
    labels = np.bincount([c.label for c in manifest.clips], minlength=manifest.num_classes)
    print(f"dataset {manifest.name} at {manifest.root}")
    print(
        f"  classes: {manifest.num_classes}; clips: train {counts['train']}, val {counts['val']}, "
        f"test {counts['test']}"
    )
    scheme = cfg.data.partition or dataset_spec(cfg.dataset).default_partition
    if manifest.dealt and scheme == "natural":  # no client ids in the data: not natural clients
        print(
            f"  clients: {len(clients)}, dealt at random (IID) over {cfg.data.num_clients} clients "
            "(the data names no clients; data.num_clients)"
        )
    else:
        print(f"  clients ({scheme}): {len(clients)}")
    q = np.percentile(sizes, [0, 25, 50, 75, 100])
    print(
        f"  samples per client: min {q[0]:.0f}, q1 {q[1]:.0f}, median {q[2]:.0f}, q3 {q[3]:.0f}, "
        f"max {q[4]:.0f}, mean {sizes.mean():.1f}"
    )
    e = np.percentile(entropy, [0, 50, 100])
    print(
        f"  class entropy per client (bits, max {np.log2(manifest.num_classes):.2f}): min "
        f"{e[0]:.2f}, median {e[1]:.2f}, max {e[2]:.2f}"
    )
    print(
        "  label distribution: "
        + ", ".join(f"{name} {n}" for name, n in zip(manifest.classes, labels))
    )
    _print_alt_statistics(cfg, manifest, clients)
    from fedac.experiments.kws_stats import report as kws_report  # lazy: start-up time

    kws_report(cfg, manifest, clients, args.scatter)
    return 0


def _print_alt_statistics(cfg: Config, manifest, clients) -> None:
    """FedKWS-UI's ALT over the training clips: max n_k and r0 * rbar_k (paper Table 1 and Fig.
    1)."""
    from fedac.experiments.kws_stats import alt_summary  # lazy: start-up time

    alt = alt_summary(cfg, manifest, clients)
    if alt:
        print(
            f"  FedKWS-UI ALT (training clips, max n_k {alt['max_n_k']:.0f}, cap "
            f"{alt['size_cap']:g}, r0 {alt['r0']:.3f}): r0 * rbar_k min {alt['min']:.3f}, median "
            f"{alt['median']:.3f}, mean {alt['mean']:.3f}, max {alt['max']:.3f}; ALT steps per "
            f"client on average {alt['mean_steps']:.2f} of E = {alt['local_steps']:.0f}"
        )


def cmd_prepare(args: argparse.Namespace) -> int:
    from fedac.data.features import features_of  # lazy: start-up time

    cfg = _data_config(args)
    manifest = load_manifest(cfg, progress=True)
    feats = features_of(manifest, cfg, progress=True)
    print(
        f"features of {len(manifest.clips)} clips ({len(feats)} windows, shape "
        f"{tuple(feats.features.shape[1:])}) cached"
    )
    return 0


def cmd_split_devices(args: argparse.Namespace) -> int:
    from fedac.data.devices import split_devices  # lazy: start-up time

    cfg = _data_config(args)
    stats = split_devices(cfg, Path(args.out), progress=not args.quiet)
    print(
        f"wrote one folder per client of {cfg.dataset} "
        f"({cfg.data.partition or dataset_spec(cfg.dataset).default_partition} partition, seed "
        f"{cfg.seed}) to {args.out}: {stats['clients']} clients, {stats['clips']} clips "
        f"({stats['min_clips']}-{stats['max_clips']} per client)"
    )
    return 0


def cmd_import_trace(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if args.synthetic is not None and args.synthetic < 1:
        raise ConfigError(f"--synthetic {args.synthetic}: give at least one client")
    if args.synthetic is not None:
        clients = [f"client{i:0{len(str(args.synthetic - 1))}d}" for i in range(args.synthetic)]
        stats = write_synthetic(out, clients, args.seed)
        source = (
            f"synthetic devices and availability of {args.synthetic} clients (seed {args.seed})"
        )
    else:
        device_pkl, behaviour_pkl = map(Path, args.fedscale)
        stats = import_fedscale(device_pkl, behaviour_pkl, out, args.reference_gflops)
        source = f"FedScale's {device_pkl} and {behaviour_pkl}"
    print(f"wrote {out / 'devices.csv'} and {out / 'availability.csv'} from {source}:")
    for key, value in stats.items():
        print(f"  {key}: {value}")
    print(
        f"use them with: --set system.devices={out / 'devices.csv'} --set system.availability="
        f"{out / 'availability.csv'}"
    )
    return 0


def cmd_pretrain(args: argparse.Namespace) -> int:
    import torch  # lazy: start-up time

    from fedac.experiments.pretrain import default_out, pretrain  # lazy: start-up time
    from fedac.experiments.pretrain_settings import settings_from_args

    torch.set_num_threads(args.threads)
    s = settings_from_args(args)
    out = Path(args.out) if args.out else default_out(s)
    done = pretrain(s, out, progress=not args.quiet, stop_after=args.stop_after, argv=args.argv)
    if done is None:
        print(
            f"stopped after step {args.stop_after}; the same command continues from "
            f"{out / 'state.pt'}"
        )
        return 0
    summary = json.loads((out / "pretrain.json").read_text())
    print(
        f"encoder in {out} ({summary['parameters']:,} parameters, {summary['wall_seconds']:.0f} s, "
        f"mean loss of the last 100 steps {summary['final_loss_mean_last_100']:.3f}, sha256 "
        f"{summary['sha256'][:16]}...)"
    )
    print(f"use it with: fedac run --set model.name={s.model} --set model.encoder_path={out}")
    return 0


def version_line() -> str:
    """`fedac --version`: the package version and the code version every results.json records
    (version.py): the training code's sha256, and the git commit where the package is a checkout."""
    from fedac.version import code_version  # lazy: start-up time (it hashes the training code)

    v = code_version()
    where = (
        f"git {v['git_commit'][:12]}{' + uncommitted changes' if v['git_dirty'] else ''}"
        if v["git_commit"]
        else "no git checkout"
    )
    return f"fedac {v['fedac']} (training code sha256 {v['source_sha256'][:16]}, {where})"


class VersionAction(argparse.Action):
    """--version computed only when asked (argparse's own takes the text when the parser is
    built)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit()


def _add_run_parser(sub) -> None:
    """`fedac run`: one experiment, its run directory, resume and a simulated kill."""
    run = sub.add_parser("run", help="train one federated experiment and write a run directory")
    _add_experiment_args(run)
    run.add_argument(
        "--out", help="run directory (default runs/<time>-<algorithm>-<dataset>-s<seed>)"
    )
    run.add_argument(
        "--resume",
        metavar="DIR",
        help="continue the killed run in DIR to its end (with --rounds N: to round N, a finished "
        "run too; with --out NEW: in a copy)",
    )
    run.add_argument(
        "--stop-after",
        type=int,
        metavar="N",
        help="stop after round N as if killed (testing resume)",
    )
    run.add_argument("--quiet", action="store_true", help="no progress bars")
    run.set_defaults(func=cmd_run)


def _add_catalog_parsers(sub) -> None:
    """`fedac models` and `fedac list`: what the model zoo and the registries hold."""
    models = sub.add_parser("models", help="list the model zoo with parameter counts")
    models.add_argument("--num-features", type=int, default=40)
    models.add_argument("--num-classes", type=int, default=35)
    models.set_defaults(func=cmd_models)

    listing = sub.add_parser(
        "list",
        help="what is registered (algorithms, models, datasets, aggregators, attacks, clock "
        "modes, availability models, selectors), plug-ins included, with a line on each",
    )
    listing.add_argument(
        "kinds", nargs="*", metavar="KIND", help=f"only these kinds ({', '.join(REGISTRIES)})"
    )
    listing.set_defaults(func=cmd_list)


def _add_synth_parsers(data_sub) -> None:
    """`fedac data <synth command>`: one per dataset that has a synthetic stand-in."""
    for name, spec in DATASETS.items():
        if spec.synth_command is None:
            continue
        synth = data_sub.add_parser(
            spec.synth_command, help=f"write a synthetic {name} in its official layout"
        )
        synth.add_argument("--out", required=True)
        synth.add_argument("--seed", type=int, default=0)
        if spec.synth_size_arg:
            synth.add_argument(f"--{spec.synth_size_arg}", dest="size", type=int)
        synth.add_argument("--quiet", action="store_true")
        synth.set_defaults(func=cmd_synth, dataset_name=name)


def _add_inspect_parsers(data_sub) -> None:
    """`fedac data stats` and `fedac data prepare`: a dataset's clients and its feature cache."""
    for verb, func, text in (
        ("stats", cmd_stats, "clients, samples per client, class entropy, labels"),
        ("prepare", cmd_prepare, "build the feature cache"),
    ):
        p = data_sub.add_parser(verb, help=text)
        p.add_argument(
            "dataset", nargs="?", default=None, help=f"dataset name ({', '.join(DATASETS)})"
        )
        p.add_argument(
            "--root", help="dataset root in its official layout (default: the embedded stand-in)"
        )
        p.add_argument("--config")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
        p.add_argument("--quiet", action="store_true")
        if verb == "stats":
            p.add_argument(
                "--scatter",
                metavar="PNG",
                help="also write FedKWS-UI's Fig. 1 scatter (n_k against "
                "class entropy per client, coloured by r0 * rbar_k) to this file",
            )
        p.set_defaults(func=func)


def _add_split_devices_parser(data_sub) -> None:
    """`fedac data split-devices`: a run's clients as folders for Flower device nodes."""
    split = data_sub.add_parser(
        "split-devices",
        help="one folder per client as the run's partition cuts it "
        "(<client>/<label>/<file>.wav + labels.csv), for Flower device nodes",
    )
    split.add_argument(
        "dataset", nargs="?", default=None, help=f"dataset name ({', '.join(DATASETS)})"
    )
    split.add_argument(
        "--out", required=True, help="folder that receives one sub-folder per client"
    )
    split.add_argument(
        "--root", help="dataset root in its official layout (default: the embedded stand-in)"
    )
    split.add_argument("--config")
    split.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=(
            "the run's data settings, e.g. --set data.partition=iid --set data.num_clients=3 --set "
            "seed=0"
        ),
    )
    split.add_argument("--quiet", action="store_true")
    split.set_defaults(func=cmd_split_devices)


def _add_import_trace_parser(data_sub) -> None:
    """`fedac data import-trace`: device and availability traces in fedac's CSV format."""
    trace = data_sub.add_parser(
        "import-trace",
        help="write a device trace and an availability trace (devices.csv, availability.csv) "
        "for system.devices / system.availability: converted from FedScale's pickles or drawn "
        "by the synthetic model (docs/traces.md)",
    )
    source = trace.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--fedscale",
        nargs=2,
        metavar=("DEVICE.pkl", "BEHAVIOUR.pkl"),
        help="FedScale's device capacity and client behaviour traces. Unpickling runs code: "
        "import only files you trust",
    )
    source.add_argument(
        "--synthetic", type=int, metavar="N", help="N clients (client0..) of the synthetic model"
    )
    trace.add_argument("--out", required=True, help="folder for devices.csv and availability.csv")
    trace.add_argument(
        "--reference-gflops",
        type=float,
        default=FEDSCALE_REFERENCE_GFLOPS,
        metavar="G",
        help="GFLOPs of the one-sample inference whose milliseconds FedScale's computation "
        f"gives (default {FEDSCALE_REFERENCE_GFLOPS}: MobileNet V2 at 224 x 224)",
    )
    trace.add_argument("--seed", type=int, default=0, help="--synthetic: the seed")
    trace.set_defaults(func=cmd_import_trace)


def build_parser() -> argparse.ArgumentParser:
    """The `fedac` command line: one sub-command per verb (run, compare, reproduce, report,
    pretrain, memory, models, list, data)."""
    parser = argparse.ArgumentParser(prog="fedac", description="Federated audio classification.")
    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run_parser(sub)
    add_compare_parser(sub)
    add_reproduce_parser(sub)
    add_sweep_parser(sub)
    add_report_parser(sub)
    add_pretrain_parser(sub, cmd_pretrain)
    add_memory_parser(sub)
    _add_catalog_parsers(sub)
    add_export_parsers(sub)
    data = sub.add_parser(
        "data", help="synthesize, inspect and prepare datasets; write device traces"
    )
    data_sub = data.add_subparsers(dest="data_command", required=True)
    _add_synth_parsers(data_sub)
    _add_inspect_parsers(data_sub)
    _add_split_devices_parser(data_sub)
    _add_import_trace_parser(data_sub)
    return parser


#: The commands torchrun may start over several processes (engine/distributed.py).
TORCHRUN_COMMANDS = ("run", "compare", "reproduce")


def main(argv: list[str] | None = None) -> int:
    before_run_starts()  # (a run's estimate counts the time before its first round)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    # the command line, for records of a run
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if (
            args.command not in TORCHRUN_COMMANDS
            and int(os.environ.get("WORLD_SIZE", "1") or 1) > 1
        ):
            raise ConfigError(
                f"fedac {args.command} runs in one process; torchrun starts `fedac "
                f"{'`, `fedac '.join(TORCHRUN_COMMANDS)}` only (docs/performance.md, 'Several "
                "processes: torchrun')"
            )
        code = args.func(args)
        sys.stdout.flush()  # (inside the try: a closed pipe is met here, not at exit)
        return code
    # The reader of the output has gone (`fedac list | head -1`): end quietly, as a command killed
    # by SIGPIPE does, with the shell's status for it
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # (the interpreter's last flush has nowhere to fail)
        os.close(devnull)
        return 128 + 13
    # SIGINT / SIGTERM in a run's rounds: a checkpoint and the way on, no traceback
    except RunInterrupted as exc:
        print(f"fedac: {exc}", file=sys.stderr)
        return exc.exit_status
    # Ctrl-C outside the rounds (data building, feature extraction): no round was lost
    except KeyboardInterrupt:
        print(
            "fedac: interrupted outside the training rounds; no round was lost: run the same "
            "command again (caches, checkpoints and finished runs are reused)",
            file=sys.stderr,
        )
        return 130
    except FedacError as exc:
        print(f"fedac: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
