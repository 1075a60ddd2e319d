"""FedKWS-UI's data statistics for `fedac data stats`: the columns of the paper's Table 1 (K, N, avg
and max n_k, M) and its Fig. 1 (right) scatter of each client's training-sample count n_k against
its class entropy, coloured by ALT's r0 * rbar_k.

n_k counts a client's training clips after `data.local_holdout` (the paper keeps no local hold-out:
`--set data.local_holdout=0` gives its n_k). The entropy is ALT's, normalised by ln C (1 =
balanced).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedac.algorithms.base import Task
from fedac.algorithms.fedkwsui import FedKWSUI, alt_statistics, normalized_entropy
from fedac.config import Config
from fedac.data.manifest import Manifest
from fedac.data.partition import ClientSplit, partition
from fedac.data.registry import dataset_spec, load_manifest


def training_counts(manifest: Manifest, clients: list[ClientSplit]) -> list[list[int]]:
    """Each client's training clips per class (after the local hold-out): ALT's n_k and class
    mix."""
    return [
        np.bincount(
            [manifest.clips[i].label for i in c.train], minlength=manifest.num_classes
        ).tolist()
        for c in clients
    ]


def alt_summary(cfg: Config, manifest: Manifest, clients: list[ClientSplit]) -> dict[str, float]:
    """fedkwsui.alt_statistics over the clients' training clips (`fedac data stats`, KWS table
    notes)."""
    return alt_statistics(
        cfg, manifest.num_classes, [c.name for c in clients], training_counts(manifest, clients)
    )


def mean_alt_steps(cfg: Config) -> float:
    """The mean of ALT's s_k = floor(r0 rbar_k E) over the clients a run with `cfg` (its seed
    included: data.max_clients draws them) holds: what its table's notes report next to E."""
    manifest = load_manifest(cfg, progress=False)
    clients = partition(manifest, cfg.data, cfg.seed, dataset_spec(cfg.dataset).default_partition)
    return alt_summary(cfg, manifest, clients)["mean_steps"]


def client_table(
    cfg: Config, manifest: Manifest, clients: list[ClientSplit]
) -> dict[str, np.ndarray]:
    """Per client with training clips: n_k, normalised class entropy and r0 * rbar_k."""
    counts = [n for n, c in zip(training_counts(manifest, clients), clients) if c.train]
    names = [c.name for c in clients if c.train]
    alt = FedKWSUI(cfg, Task(0, manifest.num_classes, names, counts))
    return {
        "n_k": np.array([sum(n) for n in counts]),
        "entropy": np.array([normalized_entropy(n) for n in counts]),
        "r": np.array([alt.r0 * alt.ratios[name] for name in names]),
    }


def table1_line(manifest: Manifest, table: dict[str, np.ndarray]) -> str:
    """Table 1's columns: K clients, N training clips, avg / max n_k, M test clips."""
    n_k, tests = table["n_k"], len(manifest.split_indices("test"))
    return (
        f"  Table 1 (FedKWS-UI): K {len(n_k)}, N {int(n_k.sum())}, avg n_k {n_k.mean():.1f}, "
        f"max n_k {int(n_k.max())}, M {tests}"
    )


def plot_scatter(path: str | Path, table: dict[str, np.ndarray], title: str) -> Path:
    """Fig. 1 (right): one point per client, n_k against class entropy, colour r0 * rbar_k."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4))
    points = ax.scatter(table["n_k"], table["entropy"], c=table["r"], cmap="viridis", s=10)
    bar = fig.colorbar(points, ax=ax)
    bar.set_label("r0 * rbar_k (ALT's local-step ratio)")
    bar.set_ticks([float(table["r"].min()), float(table["r"].max())])
    ax.set_xlabel("n_k (training clips)")
    ax.set_ylabel("class entropy / ln C")
    ax.set_title(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def report(
    cfg: Config, manifest: Manifest, clients: list[ClientSplit], scatter: str | None
) -> None:
    """Print Table 1's line; write the scatter to `scatter` when given."""
    table = client_table(cfg, manifest, clients)
    if not len(table["n_k"]):
        return
    print(table1_line(manifest, table))
    if scatter:
        title = f"{manifest.name}, {manifest.num_classes} classes: {len(table['n_k'])} clients"
        print(
            "  Fig. 1 scatter (n_k vs class entropy, colour r0 * rbar_k): "
            f"{plot_scatter(scatter, table, title)}"
        )
