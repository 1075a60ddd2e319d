"""Split a manifest's training clips over clients: natural id, Dirichlet over labels, or IID.

Each client also keeps a local held-out part of its clips for personalized evaluation
(`data.local_holdout`). All choices derive from (seed, purpose), so a partition is reproducible.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from fedac.config import DataConfig
from fedac.data.manifest import Manifest
from fedac.errors import ConfigError, DatasetError
from fedac.seeding import numpy_rng

MAX_DIRICHLET_TRIES = 1000


@dataclass
class ClientSplit:
    name: str
    train: list[int] = field(default_factory=list)
    """Manifest indices the client trains on."""
    holdout: list[int] = field(default_factory=list)
    """Manifest indices kept back for the client's personalized evaluation."""

    @property
    def num_samples(self) -> int:
        return len(self.train)


def _units(
    manifest: Manifest, indices: list[int], grouped: bool
) -> tuple[list[list[int]], np.ndarray]:
    """Clips bundled into indivisible units (one source recording when grouped) with each unit's
    label."""
    if not grouped:
        return [[i] for i in indices], np.array([manifest.clips[i].label for i in indices])
    bundles: dict[str, list[int]] = defaultdict(list)
    for i in indices:
        bundles[manifest.clips[i].source].append(i)
    units = list(bundles.values())
    labels = np.array(
        [np.bincount([manifest.clips[i].label for i in unit]).argmax() for unit in units]
    )
    return units, labels


def dirichlet_assign(
    unit_labels: np.ndarray,
    unit_sizes: np.ndarray,
    num_clients: int,
    alpha: float,
    min_size: int,
    rng: np.random.Generator,
) -> list[list[int]]:
    """Units per client with label proportions ~ Dirichlet(alpha), redrawn until every client has
    min_size clips.

    Per class c, p_c ~ Dir(alpha * 1_K) splits that class's units over the K clients (Hsu et al.
    2019, the protocol FedAudio uses); clients already above the mean size get no more units of
    later classes, which keeps sizes bounded without changing the label skew.
    """
    if alpha <= 0:
        raise ConfigError(f"data.alpha must be > 0, got {alpha}")
    total = int(unit_sizes.sum())
    if num_clients * min_size > total:
        raise ConfigError(
            f"cannot give {num_clients} clients at least {min_size} clips each from {total} "
            "training clips: lower data.num_clients or data.min_client_size"
        )
    for _ in range(MAX_DIRICHLET_TRIES):
        assigned: list[list[int]] = [[] for _ in range(num_clients)]
        sizes = np.zeros(num_clients)
        for label in np.unique(unit_labels):
            members = rng.permutation(np.flatnonzero(unit_labels == label))
            share = rng.dirichlet(np.full(num_clients, alpha))
            share = share * (sizes < total / num_clients)
            share = (
                share / share.sum() if share.sum() > 0 else np.full(num_clients, 1 / num_clients)
            )
            cuts = (np.cumsum(share) * len(members)).astype(int)[:-1]
            for client, part in enumerate(np.split(members, cuts)):
                assigned[client].extend(part.tolist())
                sizes[client] += unit_sizes[part].sum()
        if sizes.min() >= min_size:
            return assigned
    raise DatasetError(
        f"no Dirichlet(alpha={alpha}) split over {num_clients} clients gave every client >= "
        f"{min_size} clips in {MAX_DIRICHLET_TRIES} draws: raise data.alpha or lower "
        "data.min_client_size / data.num_clients"
    )


def partition(
    manifest: Manifest, cfg: DataConfig, seed: int, default_scheme: str = "natural"
) -> list[ClientSplit]:
    """Training clients of `manifest` under `cfg.partition` (or `default_scheme`), each with its
    local held-out part."""
    scheme = cfg.partition or default_scheme
    train = manifest.split_indices("train")
    if not train:
        raise DatasetError(f"dataset {manifest.name} at {manifest.root} has no training clips")
    rng = numpy_rng(seed, "partition", scheme)
    if scheme == "natural":
        by_id: dict[str, list[int]] = defaultdict(list)
        for i in train:
            by_id[manifest.clips[i].client].append(i)
        groups = [
            (name, by_id[name])
            for name in sorted(by_id)
            if len(by_id[name]) >= cfg.min_speaker_clips
        ]
        if not groups:
            raise DatasetError(
                f"no client of {manifest.name} holds "
                f"data.min_speaker_clips={cfg.min_speaker_clips} training clips (the largest holds "
                f"{max(map(len, by_id.values()))}); lower it"
            )
    elif scheme in ("dirichlet", "iid"):
        units, labels = _units(manifest, train, scheme == "dirichlet" and cfg.group_by_source)
        sizes = np.array([len(u) for u in units])
        if scheme == "dirichlet":
            owners = dirichlet_assign(
                labels, sizes, cfg.num_clients, cfg.alpha, cfg.min_client_size, rng
            )
        else:
            if cfg.num_clients > len(units):
                raise ConfigError(
                    f"data.num_clients={cfg.num_clients} exceeds the {len(units)} training clips"
                )
            owners = [
                part.tolist()
                for part in np.array_split(rng.permutation(len(units)), cfg.num_clients)
            ]
        groups = [
            (f"client{k:03d}", sorted(i for u in owned for i in units[u]))
            for k, owned in enumerate(owners)
        ]
    # one client holding every training clip: centralised training (--algorithm central)
    elif scheme == "pooled":
        groups = [("pooled", list(train))]
    else:
        raise ConfigError(
            f"unknown data.partition '{scheme}'; use natural, dirichlet, iid or pooled"
        )

    if cfg.max_clients is not None and cfg.max_clients < len(groups):
        keep = sorted(
            numpy_rng(seed, "max-clients").choice(len(groups), cfg.max_clients, replace=False)
        )
        groups = [groups[k] for k in keep]
    if not 0 <= cfg.local_holdout < 1:
        raise ConfigError(f"data.local_holdout must lie in [0, 1), got {cfg.local_holdout}")
    return [holdout_split(name, indices, cfg.local_holdout, seed) for name, indices in groups]


def holdout_split(name: str, indices: list[int], local_holdout: float, seed: int) -> ClientSplit:
    """A client's clips (in manifest order) cut into training and local held-out parts, drawn from
    (seed, name) only, so a device holding the same clips in the same order draws the same
    hold-out."""
    order = numpy_rng(seed, "holdout", name).permutation(indices).tolist()
    cut = int(np.floor(local_holdout * len(order)))
    return ClientSplit(name, sorted(order[cut:]), sorted(order[:cut]))


def class_entropy(labels: list[int] | np.ndarray, num_classes: int) -> float:
    """Shannon entropy (bits) of a client's label histogram; log2(C) is perfectly balanced."""
    counts = np.bincount(np.asarray(labels, dtype=int), minlength=num_classes).astype(float)
    if counts.sum() == 0:
        return 0.0
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log2(p)).sum())
