"""Streaming scenarios of zero-shot FL with new classes (Gudur & Perepu, Section 3, Tables 1-2).

Each round every user draws fresh clips of the labels it holds; new classes arrive at scheduled
(user, round) points; a user's architecture can change at a scheduled round. The server's public set
D0 is drawn (seeded) from training clips of the 8 old classes; users draw from the other training
clips; evaluation uses the official validation and test clips of the 10 classes. A CREMA-D variant
(not in the paper) keeps 3 old emotions (NEU HAP SAD) and brings ANG as the new class.

What the algorithm sees and what it does not: a user's clips carry *user ids*. An old class keeps
its task id (0..7, the order of `OLD`). Every injection gets a fresh local id `NEW_ID + j` (j-th
injection of that user), because a user cannot tell that new data are a class it reported before:
telling repeat reports apart is the server's job (anchors, algorithms/zeroshot.py). The true class
of each (user, local id) stays in `Stream.truth`, used only for metrics.

Choices (the paper is silent):
- Counts are clips; a clip longer than the 1 s model window (UrbanSound8K) brings all its windows.
- Per round and held label, n ~ U{lo..hi} clips drawn without replacement from the label's pool,
  independently per round (reuse across rounds is unavoidable: 10 rounds x 250 exceeds the pools).
- An injected class keeps streaming in the user's later rounds like its other labels, under the
  local id of its latest injection; in an injection round the injected clips replace that class's
  draw.
- Heterogeneous users 4-10: label sets drawn from the 8 old labels (seeded, redrawn until every
  label is held by at least two users), architectures drawn from Table 1's three.
- `zeroshot.scale` multiplies every count; 0 picks the largest scale <= 1 the pools allow.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedac.config import Config
from fedac.data.manifest import Manifest
from fedac.errors import ConfigError, DatasetError
from fedac.seeding import numpy_rng
from fedac.settings.zeroshot import scenario_rounds

NEW_ID = 1000
"""Local ids of unregistered new classes start here (above any global label id)."""
TABLE1_MODELS = ("cnn2_softmax", "cnn3_relu", "dscnn3_relu")

# Per dataset: 8 old classes, 2 new ones (task ids 0..7 and 8, 9), D0 clips per class, per-round
# draw range.
DATASET_CLASSES = {
    "speech_commands": (
        "yes no up down left right on off".split(),
        ["stop", "go"],
        300,
        (200, 300),
        (400, 500),
    ),
    "urbansound8k": (
        "air_conditioner car_horn children_playing dog_bark drilling engine_idling gun_shot "
        "jackhammer".split(),
        ["siren", "street_music"],
        50,
        (40, 50),
        (50, 50),
    ),
    # Not in the paper: 3 old emotions and 1 new one (ANG), so every injection brings ANG and round
    # 8's second report of the homogeneous preset is a repeat. Clips of a few seconds, like
    # UrbanSound8K's: its counts (a clip brings all its 1 s windows, and D0's windows per class set
    # the impressions).
    "cremad": (["NEU", "HAP", "SAD"], ["ANG"], 50, (40, 50), (50, 50)),
}
# Table 1 label sets (indices into the old classes).
TABLE1_LABELS = {
    "speech_commands": [[0, 1, 2, 3], [2, 3, 4, 5], [4, 5, 6, 7]],
    "urbansound8k": [[0, 1, 2], [2, 3, 4], [4, 5, 6, 7]],
    "cremad": [[0, 1], [1, 2], [2, 0]],  # overlapping pairs, as Table 1's sets overlap
}
# Heterogeneous users 4-10: how many old labels each holds (None: 3 or 4 at random).
EXTRA_LABELS = {"speech_commands": 4, "urbansound8k": None, "cremad": 2}


@dataclass(frozen=True)
class Injection:
    user: str
    round: int
    cls: int
    """Task id of the new class (8 or 9; CREMA-D: 3)."""
    size: int


@dataclass
class Scenario:
    name: str
    classes: list[str]
    """Task classes: the old ones (8; CREMA-D 3), then the new ones (2; CREMA-D 1)."""
    users: list[str]
    rounds: int
    labels: dict[str, list[int]]
    """Old task ids each user holds from round 1."""
    architectures: dict[str, dict[int, str]]
    """Per user, round -> architecture from that round on (round 1 always present)."""
    injections: list[Injection]
    public_per_class: int
    draw: tuple[int, int]
    num_old: int = 8
    scale: float = 1.0
    """The factor every count was scaled by (zeroshot.scale, or the automatic choice)."""

    def architecture(self, user: str, round_idx: int) -> str:
        schedule = self.architectures[user]
        return schedule[max(r for r in schedule if r <= round_idx)]


def _scaled(n: int, scale: float) -> int:
    return max(1, int(round(n * scale)))


def build_scenario(dataset: str, name: str, scale: float, seed: int) -> Scenario:
    """The paper's presets: homogeneous (Table 3) and heterogeneous (Table 4) on one dataset."""
    if dataset not in DATASET_CLASSES:
        raise ConfigError(
            f"zeroshot scenarios exist for {', '.join(DATASET_CLASSES)}, not '{dataset}'; "
            f"choose one with --dataset"
        )
    old, new, public, (lo, hi), (first, second) = DATASET_CLASSES[dataset]
    # the first and the second new class (one: the same)
    stop, go = len(old), len(old) + len(new) - 1
    rounds = scenario_rounds(name)  # refuses an unknown scenario
    if name == "homogeneous":
        users = ["u1", "u2", "u3"]
        labels = dict(zip(users, TABLE1_LABELS[dataset]))
        archs = {u: {1: m} for u, m in zip(users, TABLE1_MODELS)}
        inject = [
            ("u1", 4, stop, first),
            ("u2", 4, stop, first),
            ("u1", 8, stop, second),
            ("u2", 8, go, second),
        ]
    else:
        users = [f"u{i}" for i in range(1, 11)]
        labels = dict(zip(users, TABLE1_LABELS[dataset]))
        size, n_old = EXTRA_LABELS[dataset], len(old)
        for attempt in range(1000):
            rng = numpy_rng(seed, "zeroshot-labels", dataset, attempt)
            extra = {
                u: sorted(
                    rng.choice(n_old, size or int(rng.integers(3, 5)), replace=False).tolist()
                )
                for u in users[3:]
            }
            held = np.bincount(
                [c for ls in [*labels.values(), *extra.values()] for c in ls], minlength=n_old
            )
            if held.min() >= 2:
                break
        labels.update(extra)
        rng = numpy_rng(seed, "zeroshot-architectures", dataset)
        archs = {u: {1: m} for u, m in zip(users, TABLE1_MODELS)}
        archs.update({u: {1: TABLE1_MODELS[int(rng.integers(3))]} for u in users[3:]})
        archs["u1"].update({6: "ann3_relu", 8: "cnn1_softmax"})
        archs["u2"].update({4: "cnn3_softmax"})
        archs["u3"].update({5: "cnn4_softmax"})
        inject = [
            ("u2", 4, stop, first),
            ("u2", 6, stop, first),
            ("u4", 3, go, first),
            ("u4", 7, go, first),
            ("u6", 3, stop, first),
            ("u6", 5, stop, first),
            ("u9", 4, stop, first),
        ]
    return Scenario(
        name,
        old + new,
        users,
        rounds,
        labels,
        archs,
        [Injection(u, r, c, _scaled(n, scale)) for u, r, c, n in inject],
        _scaled(public, scale),
        (_scaled(lo, scale), _scaled(hi, scale)),
        num_old=len(old),
        scale=scale,
    )


@dataclass
class Stream:
    """A scenario on a manifest: D0, the users' pools, the per-round draws and the hidden truth."""

    scenario: Scenario
    public: list[int]
    """Manifest clip indices of D0."""
    public_labels: list[int]
    pools: dict[int, list[int]]
    """Task class -> training clip indices users draw from."""
    val: list[int]
    test: list[int]
    task_label: dict[int, int]
    """Manifest clip index -> task class (the 10 classes only)."""
    seed: int
    truth: dict[tuple[str, int], int] = field(default_factory=dict)
    """(user, local id) -> true task class of an injected new class. Metrics only."""

    def local_id(self, injection: Injection) -> int:
        """NEW_ID + j for the user's j-th injection (in schedule order)."""
        own = [
            i
            for i in sorted(self.scenario.injections, key=lambda i: i.round)
            if i.user == injection.user
        ]
        return NEW_ID + own.index(injection)

    def draw(self, user: str, round_idx: int) -> tuple[list[int], list[int]]:
        """Clip indices and user ids of one user's data in one round."""
        held = {c: c for c in self.scenario.labels[user]}
        injected = []
        for inj in sorted(self.scenario.injections, key=lambda i: i.round):
            if inj.user == user and inj.round < round_idx:
                held[inj.cls] = self.local_id(inj)  # keeps streaming under its latest local id
            if inj.user == user and inj.round == round_idx:
                injected.append(inj)
                held.pop(inj.cls, None)
        clips, ids = [], []
        lo, hi = self.scenario.draw
        for cls, uid in sorted(held.items()):
            rng = numpy_rng(self.seed, "zeroshot-draw", user, round_idx, cls)
            n = min(int(rng.integers(lo, hi + 1)), len(self.pools[cls]))
            clips += rng.choice(self.pools[cls], n, replace=False).tolist()
            ids += [uid] * n
        for inj in injected:
            rng = numpy_rng(self.seed, "zeroshot-inject", user, round_idx, inj.cls)
            n = min(inj.size, len(self.pools[inj.cls]))
            clips += rng.choice(self.pools[inj.cls], n, replace=False).tolist()
            ids += [self.local_id(inj)] * n
        return clips, ids


def auto_scale(dataset: str, manifest: Manifest) -> float:
    """The largest scale <= 1 at which every old class holds D0 plus one full draw, and every new
    class its largest injection, among its training clips."""
    old, new, public, (_, hi), (first, second) = DATASET_CLASSES[dataset]
    counts = _train_counts(manifest, old + new)
    need = [public + hi] * len(old) + [max(first, second)] * len(new)
    return min(1.0, min(c / n for c, n in zip(counts, need)))


def _train_counts(manifest: Manifest, names: list[str]) -> list[int]:
    index = {name: i for i, name in enumerate(manifest.classes)}
    return [
        sum(1 for c in manifest.clips if c.split == "train" and c.label == index[n]) for n in names
    ]


def build_stream(cfg: Config, manifest: Manifest) -> Stream:
    """The configured scenario on `manifest` (its classes must include the scenario's 10)."""
    dataset = cfg.dataset
    if dataset not in DATASET_CLASSES:
        raise ConfigError(
            f"zeroshot scenarios exist for {', '.join(DATASET_CLASSES)}, not '{dataset}'"
        )
    old, new, *_ = DATASET_CLASSES[dataset]
    missing = [n for n in old + new if n not in manifest.classes]
    if missing:
        raise DatasetError(
            f"dataset at {manifest.root} lacks the classes {missing} the zeroshot scenario needs "
            f"(Speech Commands: use data.task=35)"
        )
    scale = cfg.zeroshot.scale or auto_scale(dataset, manifest)
    scenario = build_scenario(dataset, cfg.zeroshot.scenario, scale, cfg.seed)
    # load_config's choice: train.rounds / zeroshot.rounds as given, else the preset
    scenario.rounds = cfg.train.rounds
    to_task = {manifest.classes.index(n): t for t, n in enumerate(old + new)}
    task_label = {i: to_task[c.label] for i, c in enumerate(manifest.clips) if c.label in to_task}
    train = {
        t: [i for i, t2 in task_label.items() if t2 == t and manifest.clips[i].split == "train"]
        for t in range(len(old + new))
    }
    public, public_labels, pools = [], [], {}
    for t, clips in train.items():
        if t < len(old):
            picked = set(
                numpy_rng(cfg.seed, "zeroshot-d0", t)
                .choice(clips, min(scenario.public_per_class, len(clips)), replace=False)
                .tolist()
            )
            public += sorted(picked)
            public_labels += [t] * len(picked)
            clips = [i for i in clips if i not in picked]
        pools[t] = clips
    need = {t: scenario.draw[1] for t in range(len(old))}
    for inj in scenario.injections:
        need[inj.cls] = max(need.get(inj.cls, 0), inj.size)
    short = [
        f"{(old + new)[t]} ({len(pools[t])} < {n})" for t, n in need.items() if len(pools[t]) < n
    ]
    short += [
        f"{old[t]} D0 ({len(train[t])} < {scenario.public_per_class})"
        for t in range(len(old))
        if len(train[t]) < scenario.public_per_class
    ]
    if short:
        raise DatasetError(
            f"dataset at {manifest.root} holds too few training clips for the {scenario.name} "
            f"scenario at zeroshot.scale={scale:g}: {', '.join(short)}. Lower zeroshot.scale "
            f"(0 picks the largest that fits) or use a larger corpus (data.synth_speakers)"
        )
    split = {s: [i for i in task_label if manifest.clips[i].split == s] for s in ("val", "test")}
    stream = Stream(
        scenario, public, public_labels, pools, split["val"], split["test"], task_label, cfg.seed
    )
    for inj in scenario.injections:
        stream.truth[(inj.user, stream.local_id(inj))] = inj.cls
    return stream
