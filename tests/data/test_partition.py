"""Client partitions: natural id, IID, Dirichlet (min size, grouped by source), local holdout,
max_clients."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from fedac.config import DataConfig
from fedac.data.manifest import Clip, Manifest
from fedac.data.partition import class_entropy, dirichlet_assign, partition
from fedac.errors import ConfigError, DatasetError


def manifest_of(clips: list[Clip], classes: int = 4) -> Manifest:
    return Manifest("toy", "/toy", [f"c{i}" for i in range(classes)], clips)


def speaker_manifest() -> Manifest:
    """Speakers a (5 clips), b (3), c (8), d (4) in train; plus val/test clips that must never be
    assigned."""
    clips = []
    for speaker, count in (("b", 3), ("a", 5), ("d", 4), ("c", 8)):
        for n in range(count):
            clips.append(Clip(f"/toy/{speaker}{n}.wav", n % 4, speaker, "train"))
    clips += [Clip("/toy/v.wav", 0, "v", "val"), Clip("/toy/t.wav", 1, "t", "test")]
    return manifest_of(clips)


def grouped_manifest(groups: int = 60, per_group: int = 3, classes: int = 4) -> Manifest:
    """`groups` source recordings of `per_group` clips each; a recording has one label."""
    clips = []
    for g in range(groups):
        for n in range(per_group):
            clips.append(
                Clip(f"/toy/g{g}_{n}.wav", g % classes, f"src{g}", "train", group=f"fs{g}")
            )
    return manifest_of(clips, classes)


def all_indices(clients) -> list[int]:
    return sorted(i for c in clients for i in c.train + c.holdout)


def test_natural_partition_is_one_client_per_id():
    m = speaker_manifest()
    clients = partition(m, DataConfig(partition="natural", local_holdout=0.0), seed=0)
    assert [c.name for c in clients] == ["a", "b", "c", "d"]
    assert [c.num_samples for c in clients] == [5, 3, 8, 4]
    for c in clients:
        assert {m.clips[i].client for i in c.train} == {c.name}
        assert all(m.clips[i].split == "train" for i in c.train)
    assert all_indices(clients) == m.split_indices("train")
    # None falls back to the dataset's default scheme
    assert [
        c.name for c in partition(m, DataConfig(partition=None), 0, default_scheme="natural")
    ] == ["a", "b", "c", "d"]


def test_local_holdout_fraction_and_disjointness():
    m = speaker_manifest()
    clients = partition(m, DataConfig(partition="natural", local_holdout=0.25), seed=3)
    # floor(0.25 * n) held out: a 5 -> 1, b 3 -> 0, c 8 -> 2, d 4 -> 1
    assert [len(c.holdout) for c in clients] == [1, 0, 2, 1]
    assert [c.num_samples for c in clients] == [4, 3, 6, 3]
    for c in clients:
        assert not set(c.train) & set(c.holdout)
        assert {m.clips[i].client for i in c.train + c.holdout} == {c.name}
    assert all_indices(clients) == m.split_indices("train")
    # reproducible by seed, and the held-out choice depends on it
    again = partition(m, DataConfig(partition="natural", local_holdout=0.25), seed=3)
    assert [c.holdout for c in again] == [c.holdout for c in clients]
    picks = {
        tuple(partition(m, DataConfig(partition="natural", local_holdout=0.25), seed=s)[2].holdout)
        for s in range(8)
    }
    assert len(picks) > 1


def test_iid_sizes():
    m = speaker_manifest()  # 20 training clips
    clients = partition(m, DataConfig(partition="iid", num_clients=6, local_holdout=0.0), seed=0)
    # np.array_split of 20 into 6: 4, 4, 3, 3, 3, 3
    assert [c.num_samples for c in clients] == [4, 4, 3, 3, 3, 3]
    assert [c.name for c in clients] == [f"client{k:03d}" for k in range(6)]
    assert all_indices(clients) == m.split_indices("train")


def test_iid_too_many_clients():
    with pytest.raises(ConfigError, match="data.num_clients=30"):
        partition(speaker_manifest(), DataConfig(partition="iid", num_clients=30), seed=0)


def test_dirichlet_min_size_and_reproducibility():
    m = grouped_manifest(groups=120, per_group=1, classes=4)
    cfg = DataConfig(
        partition="dirichlet",
        num_clients=8,
        alpha=0.3,
        min_client_size=5,
        local_holdout=0.0,
        group_by_source=False,
    )
    clients = partition(m, cfg, seed=1)
    assert len(clients) == 8
    assert min(c.num_samples for c in clients) >= 5
    assert all_indices(clients) == m.split_indices("train")
    assert [c.train for c in partition(m, cfg, seed=1)] == [c.train for c in clients]
    assert [c.train for c in partition(m, cfg, seed=2)] != [c.train for c in clients]
    # small alpha skews the labels: mean class entropy well below the balanced log2(4) = 2 bits
    entropy = np.mean([class_entropy([m.clips[i].label for i in c.train], 4) for c in clients])
    assert entropy < 1.8


def test_dirichlet_alpha_controls_skew():
    m = grouped_manifest(groups=400, per_group=1, classes=4)

    def mean_entropy(alpha: float) -> float:
        cfg = DataConfig(
            partition="dirichlet",
            num_clients=10,
            alpha=alpha,
            min_client_size=2,
            local_holdout=0.0,
            group_by_source=False,
        )
        return float(
            np.mean(
                [
                    class_entropy([m.clips[i].label for i in c.train], 4)
                    for c in partition(m, cfg, seed=0)
                ]
            )
        )

    assert mean_entropy(0.1) < mean_entropy(100.0)
    assert mean_entropy(100.0) > 1.9


def test_grouped_dirichlet_never_splits_a_source():
    m = grouped_manifest(groups=60, per_group=3)
    cfg = DataConfig(
        partition="dirichlet",
        num_clients=5,
        alpha=0.5,
        min_client_size=6,
        local_holdout=0.2,
        group_by_source=True,
    )
    clients = partition(m, cfg, seed=0)
    owner: dict[str, set[str]] = defaultdict(set)
    for c in clients:
        for i in c.train + c.holdout:
            owner[m.clips[i].group].add(c.name)
    assert len(owner) == 60
    assert all(len(names) == 1 for names in owner.values())
    # every client's size is a multiple of the recording size
    assert all((c.num_samples + len(c.holdout)) % 3 == 0 for c in clients)
    assert all_indices(clients) == m.split_indices("train")


def test_ungrouped_dirichlet_may_split_sources():
    m = grouped_manifest(groups=60, per_group=3)
    cfg = DataConfig(
        partition="dirichlet",
        num_clients=5,
        alpha=0.5,
        min_client_size=6,
        local_holdout=0.0,
        group_by_source=False,
    )
    owner: dict[str, set[str]] = defaultdict(set)
    for c in partition(m, cfg, seed=0):
        for i in c.train:
            owner[m.clips[i].group].add(c.name)
    assert any(len(names) > 1 for names in owner.values())


def test_max_clients_keeps_a_seeded_subset():
    m = speaker_manifest()
    clients = partition(
        m, DataConfig(partition="natural", max_clients=2, local_holdout=0.0), seed=0
    )
    assert len(clients) == 2
    assert {c.name for c in clients} <= {"a", "b", "c", "d"}
    sizes = {"a": 5, "b": 3, "c": 8, "d": 4}
    assert all(c.num_samples == sizes[c.name] for c in clients)
    assert [
        c.name for c in partition(m, DataConfig(partition="natural", max_clients=2), seed=0)
    ] == [c.name for c in clients]
    assert len(partition(m, DataConfig(partition="natural", max_clients=10), seed=0)) == 4


def test_impossible_dirichlet_min_size_is_a_config_error():
    m = grouped_manifest(groups=20, per_group=1)
    cfg = DataConfig(partition="dirichlet", num_clients=5, min_client_size=5)
    with pytest.raises(ConfigError) as info:
        partition(m, cfg, seed=0)
    message = str(info.value)
    assert "5 clients" in message and "20 training clips" in message
    assert "data.num_clients" in message and "data.min_client_size" in message


def test_unreachable_dirichlet_split_is_a_dataset_error():
    # exactly enough clips for every client at min size: with alpha 0.01 no draw balances them
    m = grouped_manifest(groups=40, per_group=1, classes=2)
    cfg = DataConfig(
        partition="dirichlet", num_clients=4, alpha=0.01, min_client_size=10, group_by_source=False
    )
    with pytest.raises(DatasetError, match="raise data.alpha"):
        partition(m, cfg, seed=0)


def test_bad_partition_settings():
    m = speaker_manifest()
    with pytest.raises(ConfigError, match="data.alpha"):
        partition(
            m,
            DataConfig(partition="dirichlet", alpha=0.0, num_clients=2, min_client_size=1),
            seed=0,
        )
    with pytest.raises(ConfigError, match="unknown data.partition 'speaker'"):
        partition(m, DataConfig(partition="speaker"), seed=0)
    with pytest.raises(ConfigError, match="data.local_holdout"):
        partition(m, DataConfig(partition="natural", local_holdout=1.0), seed=0)
    no_train = manifest_of([Clip("/toy/v.wav", 0, "v", "val")])
    with pytest.raises(DatasetError, match="no training clips"):
        partition(no_train, DataConfig(), seed=0)


def test_dirichlet_assign_covers_every_unit_once():
    rng = np.random.default_rng(0)
    labels = np.array([0] * 30 + [1] * 30 + [2] * 30)
    owners = dirichlet_assign(labels, np.ones(90, dtype=int), 6, 1.0, 5, rng)
    flat = [u for part in owners for u in part]
    assert sorted(flat) == list(range(90))
    assert min(len(p) for p in owners) >= 5


def test_class_entropy_by_hand():
    assert class_entropy([0, 1, 2, 3], 4) == pytest.approx(2.0)
    assert class_entropy([0, 0, 0, 0], 4) == 0.0
    assert class_entropy([0, 0, 1, 1], 4) == pytest.approx(1.0)
    # p = (3/4, 1/4): -(0.75 log2 0.75 + 0.25 log2 0.25)
    assert class_entropy([2, 2, 2, 1], 4) == pytest.approx(
        -(0.75 * np.log2(0.75) + 0.25 * np.log2(0.25))
    )
    assert class_entropy([], 4) == 0.0
