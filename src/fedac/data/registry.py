"""Dataset names -> loaders, and the embedded synthetic stand-ins used when no root is given.

The registry's table (`DATASETS`, `DatasetSpec`) lives in fedac/settings/datasets.py, torch-free, so
a dataset's name and settings are checked when the config loads; it is re-exported here."""

from __future__ import annotations

import fcntl
import logging
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

from fedac.config import Config
from fedac.data.layout import MIN_DEALT_CLIPS, dealt_client_count, redeal
from fedac.data.manifest import Manifest
from fedac.errors import ConfigError
from fedac.registry import resolve
from fedac.settings.datasets import DATASETS, DatasetSpec  # re-exported: the registry's table

log = logging.getLogger(__name__)


def dataset_spec(name: str) -> DatasetSpec:
    # a ConfigError naming the registered datasets when `name` is none of them
    return DATASETS[name]


def synthetic_root(cfg: Config) -> Path:
    """Where the embedded stand-in for `cfg.dataset` lives (generated once, then reused)."""
    # lazy: start-up time (features imports torch; DATASETS feeds --help)
    from fedac.data.features import cache_root

    size = "-".join(
        f"{k}{v}" for k, v in sorted(dataset_spec(cfg.dataset).synth_kwargs(cfg.data).items())
    )
    return cache_root(cfg.data.cache_dir) / "synthetic" / f"{cfg.dataset}-{size}-seed0"


def resolve_root(cfg: Config, progress: bool = True) -> Path:
    """data.root, or the embedded synthetic dataset (generating it on first use)."""
    spec = dataset_spec(cfg.dataset)
    if cfg.data.root is not None:
        return Path(cfg.data.root).expanduser()
    if spec.synthesizer is None:
        raise ConfigError(f"dataset '{cfg.dataset}' has no embedded stand-in: set data.root=DIR")
    root = synthetic_root(cfg)
    root.parent.mkdir(parents=True, exist_ok=True)
    # Two runs started together on a fresh cache would write (and clear) the same folder at once:
    # the second waits for the first, then finds its completion marker. The embedded data set uses a
    # fixed seed: run seeds vary training, not the corpus.
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        synthesizer(spec)(root, seed=0, progress=progress, **spec.synth_kwargs(cfg.data))
    return root


def synthesizer(spec: DatasetSpec) -> Callable:
    if spec.synthesizer is None:
        raise ConfigError("this dataset has no synthetic stand-in")
    return resolve(spec.synthesizer)


def load_manifest(cfg: Config, progress: bool = True) -> Manifest:
    """The dataset's manifest; when its loader dealt the clients (no client column), fitted to its
    size by `fit_dealt_clients`, which may change cfg.data.num_clients and cfg.train.fraction."""
    manifest = dataset_spec(cfg.dataset).load_fn()(resolve_root(cfg, progress), cfg.data)
    return fit_dealt_clients(cfg, manifest) if manifest.dealt else manifest


MIN_COHORT = 5
"""Clients a round trains at the least (all of them when fewer) when train.fraction is left at its
default and the clients are dealt: the 5 that the defaults (train.fraction=0.1 of 50) sample."""


def fit_user_data(cfg: Config) -> None:
    """`cfg` fitted to its dataset as a run of it will be (`fit_dealt_clients`), before any run: for
    a user's dataset (no stand-in: audiofolder, hf) by listing its clips; built-in datasets are not
    fitted."""
    if dataset_spec(cfg.dataset).synthesizer is None and cfg.data.root is not None:
        load_manifest(cfg, progress=False)


def explicit(cfg: Config, key: str) -> bool:
    """Whether setting `key` (e.g. "data.num_clients") was given by a config file, a flag or --set
    to load_config; for a Config built by hand, whether it differs from its default."""
    given = getattr(cfg, "_given", None)
    if given is not None:
        return key in given
    section, name = key.split(".")
    default = next(f for f in fields(type(getattr(cfg, section))) if f.name == name).default
    return getattr(getattr(cfg, section), name) != default


def fit_dealt_clients(cfg: Config, manifest: Manifest) -> Manifest:
    """Defaults fitted to a dataset whose training clips are dealt at random (IID) because it names
    no clients (audiofolder, hf), so that a small one learns at the defaults; never a value the user
    set:

    - data.num_clients, left at its default: `layout.dealt_client_count` (one client per 40 training
      clips, 2 to 50), the clips dealt again over that many (`layout.redeal`). 50 clients of 180
      clips would hold 2-3 clips each: one SGD step per local epoch, and no clip for the local
      hold-out.
    - train.fraction, left at its default: raised so that each round trains at least MIN_COHORT
      clients (all when there are fewer).
    - train.rounds is not changed: a small dataset's rounds are cheap, and fewer rounds are the
      user's choice.

    Writes the values into `cfg` (the run's config.yaml records them, a resumed run reads them back)
    and logs one line saying what was dealt, what was changed and why. Natural clients are never
    touched."""
    # one client holds everything (central training)
    if (cfg.data.partition or "natural") == "pooled":
        return manifest
    train = len(manifest.split_indices("train"))
    where, changed = f"{cfg.dataset} {manifest.root}", []
    if not explicit(cfg, "data.num_clients"):
        count = dealt_client_count(train, cfg.data.num_clients)
        if count != cfg.data.num_clients:
            changed.append(
                f"data.num_clients {cfg.data.num_clients} -> {count} (left at its default; a dealt "
                f"client holds at least {MIN_DEALT_CLIPS} training clips, {cfg.data.num_clients} "
                "clients would hold "
                f"{train // cfg.data.num_clients}-{-(-train // cfg.data.num_clients)} each)"
            )
            cfg.data.num_clients = count
            manifest = redeal(manifest, count)
    clients = min(cfg.data.num_clients, train, cfg.data.max_clients or train)
    cohort = min(clients, MIN_COHORT)
    if not explicit(cfg, "train.fraction") and max(1, round(cfg.train.fraction * clients)) < cohort:
        fraction = cohort / clients
        changed.append(
            f"train.fraction {cfg.train.fraction:g} -> {fraction:.4g} (left at its default; every "
            f"round trains at least {cohort} of the {clients} clients)"
        )
        cfg.train.fraction = fraction
    scheme = cfg.data.partition or "natural"
    what = (
        f"{train} training clips dealt at random (IID) over "
        f"data.num_clients={cfg.data.num_clients} clients"
        if scheme == "natural"
        else f"data.partition={scheme} over data.num_clients={cfg.data.num_clients} clients"
    )
    if changed:
        log.warning(
            "%s: the data names no clients; %s, adapted to its size: %s; set a value yourself to "
            "keep it (docs/datasets.md, 'Small datasets')",
            where,
            what,
            "; ".join(changed),
        )
    elif scheme == "natural":
        log.warning(
            "%s: the data names no clients; %s; a client column gives natural ones", where, what
        )
    return manifest
