"""Zero-shot FL with new classes (Gudur & Perepu, Interspeech 2021): score sharing on a public set
D0, anonymized data impressions of reported new classes, k-medoids registration of new labels.

No weights are averaged. Each round every user trains its current architecture from scratch (seeded
by (seed, round, user)) on its fresh clips and predicts softmax scores over its own labels l_m on
the rows R = evaluation rows (official validation + test clips, labels used only for metrics) + D0
rows.

Choice 1 (no unregistered class in the user's data), Alg. 1:
- local alpha-update `alpha_update`: f_m <- f_G[:, l_m] + alpha f_m with alpha = |D_m^i| / |D0| (the
  paper's f_G^I is read as f_G^i, the round's table). Default `zeroshot.score_rule=normalized`:
  (f_G[:, c] + alpha f_m[:, c]) / (1 + alpha) for columns c already set in f_G, f_m[:, c] otherwise.
  `literal` keeps Alg. 1's unnormalised sum.
- global beta-aggregation `beta_aggregate`, label by label: f_G[:, c] = sum_m beta_m f_m[:, c] over
  the senders of c; beta_m = 1 when one user sent c, else acc_m, the accuracy of m's alpha-updated
  scores on the D0 rows of its labels (argmax over l_m). `normalized` divides by sum beta_m (Section
  2.3c's "label-based averaging"; the unnormalised sums grow about 1.8x per round on overlapping
  labels and new columns start at 0, so argmax favours old overlapping labels). Columns nobody sent
  keep their value.

Choice 2 (the user's data hold a local id no label is registered for):
- the user trains its architecture on D0 (labels Y) and its data (its labels plus the new local ids
  as extra outputs) and uploads the whole model: Eq. 3 needs the model, not only "the weights of the
  last layer" Alg. 1 names. It sends no scores that round.
- `class_similarity` (Eq. 1) from the model's `head.weight`; `dirichlet_targets` (Eq. 2, as in ZSKD,
  Nayak et al. 2019): row k of the CSM min-max scaled to [0, 1], concentration beta * c + 1e-4, half
  of the impressions at each beta in `zeroshot.di_betas` (1.0, 0.1); beta is applied after scaling
  (the ZSKD authors' code divides before re-normalising, which makes its beta=0.1 half equal to
  beta=1).
- `synthesize_impressions` (Eq. 3): x from N(0, 1), Adam (lr 0.01) on the soft cross-entropy of
  softmax(M(x) / tau), tau = 20, 1500 steps, batches of 100; after every step x is re-normalised per
  coefficient over time like every real input (fedac's per-utterance z-score; ZSKD rescales to [0,
  1]). All batches of all new classes of a report are optimised in one tensor
  (`optimize_impressions`: the same per-row paths, one forward/backward per step instead of one per
  batch); several reports run on `workers` threads (the engine's `runtime.cohort_workers`).
- `group_new_classes`: k-medoids (kmedoids.pam) over this round's impressions plus anchors (the
  stored impressions of new labels registered earlier) into #registered + l_new clusters. Each
  report goes to the cluster holding most of its impressions. A cluster whose medoid is an anchor
  keeps that anchor's label; a cluster holding anchors but whose medoid is a new impression takes
  its anchors' majority label (with more new impressions than anchors the medoid is often new, which
  would register a known class again); other clusters get fresh labels |Y|, |Y|+1, ... Under
  `zeroshot.identity=anonymous` (the default) the server never learns which reports share a class
  except through this clustering.
- `zeroshot.identity=reported` (the other reading of Alg. 1, whose "Average DI" over M_Sk needs to
  know which reports share a class before any clustering): a report names its new classes,
  `labels_by_name` gives every report of one name that name's label (a fresh one the first time),
  and the clustering (l_new = the number of new names) is kept only as a diagnostic (ARI, purity,
  Fig. 3).
- a label's impressions of this round are averaged index by index over its reports (the paper's
  "Average DI", `zeroshot.di_merge=mean`; `concat` keeps them all) and added to D0 with the label as
  their hard label; Y, the users' l_m and f_G (zero columns, zero rows for the impressions) grow.

A round with reports runs Choice 1 over the other users' scores and Choice 2 for the reporters (Alg.
1 lists only Choice 2). `zeroshot.num_new=oracle` sets l_new to the number of truly new classes
reported (the paper: "number of clusters = number of new labels"; the driver supplies that count,
nothing else of the truth); `auto` picks it by the medoid silhouette.
"""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields, replace
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from fedac.algorithms.base import Algorithm, ClientData, ClientResult, model_params
from fedac.algorithms.zeroshot_kmedoids import pairwise_distances, pam
from fedac.data.streams import NEW_ID
from fedac.errors import CheckpointError, ConfigError
from fedac.models import build_model
from fedac.seeding import derive_seed, numpy_rng, torch_generator
from fedac.training.local import train_supervised

DIRICHLET_EPS = 1e-4


@dataclass
class StreamClientData(ClientData):
    """One user's data of one round, with the architecture it trains that round."""

    architecture: str = ""
    names: dict[int, str] = field(default_factory=dict)
    """The names of its new classes by local id; given only under `zeroshot.identity=reported`."""


@dataclass(frozen=True)
class SharedRows:
    """What the driver gives the algorithm when it builds it: the initial D0 (windows and labels)
    and the evaluation rows scored every round (their labels stay with the driver)."""

    public_x: torch.Tensor
    public_y: torch.Tensor
    eval_x: torch.Tensor


@dataclass(frozen=True)
class Grouping:
    """A registration round's grouping of the reported classes (diagnostics the driver scores and
    saves; never part of the server state)."""

    keys: list[tuple[str, int]]
    """(user, local id) of every reported class, in report order."""
    labels: list[int]
    """The global label each reported class got."""
    owner: np.ndarray
    """The reported class (its index in `keys`) of each impression point."""
    cluster: np.ndarray
    """The k-medoids cluster of each impression point."""
    points: np.ndarray
    anchor_cluster: np.ndarray
    """The cluster of each anchor (an earlier round's impressions in D0)."""
    anchors: np.ndarray
    similarity: dict[tuple[str, int], torch.Tensor]
    """Each report's class-similarity matrix, by its first (user, local id)."""

    def record(self) -> dict[str, Any]:
        """The fields as a dict (what impressions/round<r>.pt holds, with the driver's truth
        added)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class ZeroShotServer:
    """The global state (`ZeroShotFL.init_server` / `update`). The rows R of the score table are the
    evaluation rows (official validation + test clips) followed by the rows of D0."""

    scores: torch.Tensor
    """f_G, the global score table: (|R|, |Y|) scores, a column per registered label."""
    is_set: torch.Tensor
    """(|Y|,) bool: whether some user has sent column c yet (`alpha_update` mixes only those)."""
    public_x: torch.Tensor
    """D0's windows: the public clips', then the registered labels' data impressions."""
    public_y: torch.Tensor
    """D0's labels (an impression's is the label it registered)."""
    public_di: torch.Tensor
    """(|D0|,) bool: which D0 rows are data impressions (the anchors of later groupings)."""
    registry: dict[tuple[str, int], int]
    """(user, local id) of each reported new class -> the global label registered for it."""
    names: dict[str, int] = field(default_factory=dict)
    """Class name -> label, under `zeroshot.identity=reported` (empty otherwise)."""

    @classmethod
    def from_saved(cls, saved: dict[str, Any]) -> ZeroShotServer:
        """The state from a checkpoint's dict of its fields (engine/state.py
        `RunState.to_checkpoint` writes it; earlier fedac kept that dict as the state itself)."""
        known = {f.name for f in fields(cls)}
        required = {f.name for f in fields(cls) if f.name != "names"}  # (names came later)
        unknown, missing = sorted(set(saved) - known), sorted(required - set(saved))
        if unknown or missing:
            raise CheckpointError(
                f"the checkpoint's zero-shot server state has unknown entries {unknown} and lacks "
                f"{missing}: it was written by another fedac version; resume it with that "
                "version, or start the run again"
            )
        return cls(**saved)


@dataclass(frozen=True)
class ZeroShotBroadcast:
    """What every user receives in a round: the global state and the rows it scores."""

    server: ZeroShotServer
    rows: torch.Tensor
    """R's windows: the evaluation rows, then D0's (`server.public_x`)."""


@dataclass(frozen=True)
class ScoreUpload:
    """Choice 1's upload: the user's alpha-updated scores on its labels."""

    user: str
    labels: list[int]
    """l_m: the global labels the user's data hold (the columns of `scores`)."""
    scores: torch.Tensor
    """(|R|, |l_m|): f_m after `alpha_update`."""
    acc: float
    """acc_m: the accuracy of `scores` on the D0 rows of l_m (its beta in `beta_aggregate`)."""


@dataclass(frozen=True)
class ClassReport:
    """Choice 2's upload: a user whose data hold unregistered local ids reports them with the model
    it trained on D0 and its data (for the server's impressions)."""

    user: str
    arch: str
    """The model's architecture (the zoo's name)."""
    state: dict[str, torch.Tensor]
    """The model's weights: outputs 0..num_known-1 are the labels Y, then one per local id."""
    num_known: int
    """|Y| when the user trained."""
    local_ids: list[int]
    """The user's unregistered local ids, in the order of the model's extra outputs."""
    names: list[str | None]
    """Each new class's name (`zeroshot.identity=reported`), else None."""


#: What a user uploads in a round.
ZeroShotUpload = ScoreUpload | ClassReport


@dataclass(frozen=True)
class ZeroShotUpdate:
    """One server update's outcome: the new state, the round's metrics and, in a round with reports
    under choice 2, its grouping."""

    server: ZeroShotServer
    metrics: dict[str, float]
    grouping: Grouping | None = None


# --- Choice 1: score tables ----------------------------------------------------------------------


def alpha_update(
    global_cols: torch.Tensor,
    local: torch.Tensor,
    alpha: float,
    is_set: torch.Tensor,
    rule: str = "normalized",
) -> torch.Tensor:
    """Alg. 1 local update of a user's scores (R, |l_m|) against f_G[:, l_m] (see the module
    docstring)."""
    if rule == "literal":
        return global_cols + alpha * local
    if rule != "normalized":
        raise ConfigError(f"zeroshot.score_rule must be normalized or literal, got {rule!r}")
    mixed = (global_cols + alpha * local) / (1.0 + alpha)
    return torch.where(is_set.view(1, -1), mixed, local)


def beta_aggregate(
    scores: torch.Tensor,
    is_set: torch.Tensor,
    uploads: list[tuple[torch.Tensor, list[int], float]],
    rule: str = "normalized",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Alg. 1 global update, label by label, from (scores (R, |l_m|), l_m, acc_m) per sender."""
    if rule not in ("normalized", "literal"):
        raise ConfigError(f"zeroshot.score_rule must be normalized or literal, got {rule!r}")
    scores, is_set = scores.clone(), is_set.clone()
    senders: dict[int, list[tuple[torch.Tensor, float]]] = {}
    for table, labels, acc in uploads:
        for j, c in enumerate(labels):
            senders.setdefault(int(c), []).append((table[:, j], float(acc)))
    for c, sent in senders.items():
        betas = [1.0] if len(sent) == 1 else [acc for _, acc in sent]
        total: torch.Tensor | float = sum(b * col for b, (col, _) in zip(betas, sent))
        if rule == "normalized":
            weight = sum(betas)
            total = total / weight if weight > 0 else sum(col for col, _ in sent) / len(sent)
        scores[:, c] = total
        is_set[c] = True
    return scores, is_set


# --- Choice 2: impressions and registration ------------------------------------------------------


def class_similarity(weight: torch.Tensor) -> torch.Tensor:
    """Eq. 1: C(i, j) = w_i . w_j / (|w_i| |w_j|) over the rows of the last layer's weight (K,
    d)."""
    w = weight.detach().double()
    unit = w / w.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return unit @ unit.T


def dirichlet_targets(
    similarity_row: np.ndarray, count: int, betas: list[float], rng: np.random.Generator
) -> np.ndarray:
    """Eq. 2: `count` soft targets for one class, split equally over `betas` (the first ones take
    the remainder); concentration beta * minmax(row) + 1e-4. A sample that underflows to a
    non-finite or all-zero vector becomes one-hot on its largest concentration."""
    row = np.asarray(similarity_row, dtype=np.float64)
    span = row.max() - row.min()
    scaled = (row - row.min()) / span if span > 0 else np.ones_like(row)
    sizes = [count // len(betas) + (i < count % len(betas)) for i in range(len(betas))]
    parts = []
    for beta, size in zip(betas, sizes):
        concentration = beta * scaled + DIRICHLET_EPS
        y = rng.dirichlet(concentration, size)
        bad = ~np.isfinite(y).all(axis=1) | (y.sum(axis=1) <= 0)
        y[bad] = np.eye(len(row))[concentration.argmax()]
        parts.append(y)
    return np.concatenate(parts).astype(np.float32)


def zscore(x: torch.Tensor) -> torch.Tensor:
    """Per-sample, per-coefficient normalisation over time, as engine.data.normalize does to real
    inputs (repeated here: algorithms sit below the engine)."""
    mean = x.mean(dim=2, keepdim=True)
    std = x.std(dim=2, keepdim=True, unbiased=False)
    return (x - mean) / (std + 1e-5)


def batch_sizes(count: int, batch: int) -> list[int]:
    """The sizes of Eq. 3's batches of `count` impressions (the last one holds the remainder)."""
    return [min(batch, count - start) for start in range(0, count, batch)]


def batch_weights(count: int, batch: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """w_i = 1 / |batch of row i|: summed, the mean loss of every batch (see
    `optimize_impressions`)."""
    return torch.cat([torch.full((n,), 1.0 / n, device=device) for n in batch_sizes(count, batch)])


def initial_impressions(
    count: int,
    shape: tuple[int, ...],
    batch: int,
    generator: torch.Generator,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Eq. 3's starting points: N(0, 1), z-scored, drawn batch by batch (the draw order of
    optimising one batch after another, so the batched path starts where the one-by-one path did).
    Drawn on the CPU (the seeded stream any device reproduces), then moved to `device`."""
    draws = [
        zscore(torch.randn((n, *shape), generator=generator, device="cpu"))
        for n in batch_sizes(count, batch)
    ]
    return torch.cat(draws).to(device)


def optimize_impressions(
    model: nn.Module,
    x0: torch.Tensor,
    targets: torch.Tensor,
    weights: torch.Tensor,
    tau: float,
    lr: float,
    steps: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eq. 3 for all rows in one tensor: Adam on sum_i w_i CE(y_i, softmax(M(x_i) / tau)), x
    re-z-scored after every step. Returns the impressions and each row's cross-entropy at the first
    and last step.

    Why one tensor gives the paper's batches: M is in eval mode (rows do not interact) and Adam acts
    per element, so with w_i = 1 / |batch of row i| every row gets the gradient, and so the path, it
    gets when its batch of `zeroshot.di_batch` is optimised alone on its mean loss; one forward and
    backward over all rows (all batches and all new classes of a report) replaces one per batch, and
    the zscore, the optimizer and the Python loop run once per step instead of once per batch."""
    model.eval()
    frozen = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    x = x0.clone().requires_grad_()
    optimizer = torch.optim.Adam([x], lr=lr)
    first = last = x0.new_zeros(len(x0))
    try:
        for step in range(steps):
            ce = -(targets * torch.log_softmax(model(x) / tau, dim=1)).sum(1)
            optimizer.zero_grad(set_to_none=True)
            (weights * ce).sum().backward()
            optimizer.step()
            with torch.no_grad():
                x.copy_(zscore(x))
            if step == 0:
                first = ce.detach()
            last = ce.detach()
    finally:
        for p, flag in zip(model.parameters(), frozen):
            p.requires_grad_(flag)
    return x.detach(), first, last


def synthesize_impressions(
    model: nn.Module,
    targets: torch.Tensor,
    shape: tuple[int, int],
    tau: float,
    lr: float,
    steps: int,
    batch: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, list[float]]:
    """Eq. 3: x = argmin_x CE(y, softmax(M(x) / tau)) per target row y, Adam on the mean loss of
    batches of `batch` rows (all batches optimised at once, `optimize_impressions`). Returns the
    impressions (N, F, T) and the mean loss at the first and the last step of each batch."""
    sizes = batch_sizes(len(targets), batch)
    device = targets.device
    x0 = initial_impressions(len(targets), shape, batch, generator, device)
    x, first, last = optimize_impressions(
        model, x0, targets, batch_weights(len(targets), batch, device), tau, lr, steps
    )
    losses = []
    for start, end in zip(first.cpu().split(sizes), last.cpu().split(sizes)):
        losses += [float(start.mean()), float(end.mean())]
    return x, losses


def group_new_classes(
    points: np.ndarray,
    owner: np.ndarray,
    anchors: np.ndarray,
    anchor_labels: np.ndarray,
    num_new: int,
    next_label: int,
) -> tuple[list[int], np.ndarray]:
    """Cluster this round's impressions (points (P, D), owner = report index per point) with the
    anchors (A, D) into len(set(anchor_labels)) + num_new clusters; returns each report's label and
    each point's cluster (anchors last). See the module docstring for the labelling rule."""
    data = np.concatenate([points, anchors]) if len(anchors) else points
    known = sorted(set(anchor_labels.tolist()))
    k = min(max(1, len(known) + num_new), len(data))
    medoids, cluster = pam(pairwise_distances(data), k)
    P = len(points)
    label_of: dict[int, int] = {}
    for c, m in enumerate(medoids):
        held = anchor_labels[cluster[P:] == c] if len(anchors) else np.array([], dtype=int)
        if m >= P:
            label_of[c] = int(anchor_labels[m - P])
        elif len(held):
            label_of[c] = Counter(held.tolist()).most_common(1)[0][0]
    reports = int(owner.max()) + 1 if len(owner) else 0
    labels = []
    for g in range(reports):
        c = int(np.bincount(cluster[:P][owner == g], minlength=k).argmax())
        if c not in label_of:
            label_of[c] = next_label
            next_label += 1
        labels.append(label_of[c])
    return labels, cluster


def labels_by_name(
    names: list[str], known: dict[str, int], next_label: int
) -> tuple[list[int], dict[str, int]]:
    """`zeroshot.identity=reported`: each report's label is the one its name holds; a name not
    registered yet gets the next fresh label |Y|, |Y|+1, ... (in order of first report). Returns the
    labels and the grown name map."""
    known = dict(known)
    for name in names:
        if name not in known:
            known[name] = next_label
            next_label += 1
    return [known[name] for name in names], known


def merge_impressions(members: list[torch.Tensor], mode: str = "mean") -> torch.Tensor:
    """One label's impressions of a round: averaged index by index over its reports (the paper's
    "Average DI", Alg. 1 X^i = sum over M_Sk, read as a mean) and z-scored again, or concatenated.

    Why z-score the mean: a mean of several impressions has a smaller spread than one, so averaged
    impressions (later the anchors) would sit near the origin, nearer to every new impression than
    those are to each other, and k-medoids would map every later report to an anchor's label. (On
    the stand-ins round 8's second new class still joins the first one's label with this step: the
    impressions of these small models do not separate the classes; README, zero-shot section.)"""
    if mode == "mean":
        return zscore(torch.stack(members).mean(0)) if len(members) > 1 else members[0]
    if mode == "concat":
        return torch.cat(members)
    raise ConfigError(f"zeroshot.di_merge must be mean or concat, got {mode!r}")


def choose_num_new(
    points: np.ndarray, anchors: np.ndarray, anchor_labels: np.ndarray, reports: int
) -> int:
    """`zeroshot.num_new=auto`: the l_new in 1..reports whose clustering has the best silhouette."""
    from sklearn.metrics import silhouette_score

    data = np.concatenate([points, anchors]) if len(anchors) else points
    d = pairwise_distances(data)
    known = len(set(anchor_labels.tolist()))
    best, best_score = 1, -np.inf
    for n in range(1, reports + 1):
        k = known + n
        if k < 2 or k >= len(data):
            continue
        _, cluster = pam(d, k)
        if len(set(cluster.tolist())) > 1:
            score = silhouette_score(d, cluster, metric="precomputed")
            if score > best_score:
                best, best_score = n, score
    return best


# --- the algorithm -------------------------------------------------------------------------------


class ZeroShotFL(Algorithm):
    name = "zeroshot"
    personalized = True
    streaming = True

    def __init__(self, cfg, task, runtime=None, rows: SharedRows | None = None):
        """`rows`: D0 and the evaluation rows (the driver's, engine/zeroshot.py); without them the
        algorithm checks its settings but cannot start a server."""
        super().__init__(cfg, task, runtime)
        if rows is not None:
            self.public_x, self.public_y, self.eval_x = rows.public_x, rows.public_y, rows.eval_x
        zs = cfg.zeroshot
        for key, value, allowed in (
            ("score_rule", zs.score_rule, ("normalized", "literal")),
            ("num_new", zs.num_new, ("oracle", "auto")),
            ("di_merge", zs.di_merge, ("mean", "concat")),
            ("optimizer", zs.optimizer, ("adam", "sgd")),
            ("identity", zs.identity, ("anonymous", "reported")),
        ):
            # checked before any training, not when the first report arrives
            if value not in allowed:
                raise ConfigError(f"zeroshot.{key} must be {' or '.join(allowed)}, got {value!r}")
        if (
            not zs.di_betas
            or min(zs.di_betas) <= 0
            or min(zs.di_steps, zs.di_batch) < 1
            or zs.di_tau <= 0
        ):
            raise ConfigError(
                "zeroshot.di_betas must be positive numbers, zeroshot.di_steps and di_batch at "
                f"least 1, zeroshot.di_tau positive; got {zs.di_betas}, {zs.di_steps}, "
                f"{zs.di_batch}, {zs.di_tau}"
            )

    # The contract's methods take and return this method's typed state where the base class types a
    # dict (hence the ignores).
    def init_server(self) -> ZeroShotServer:
        if not hasattr(self, "eval_x"):
            raise ConfigError(
                "ZeroShotFL(cfg, task, runtime, rows) starts a server only with the driver's "
                "SharedRows (D0 and the evaluation rows): build it as engine/zeroshot.py does"
            )
        K = self.task.num_classes
        rows = len(self.eval_x) + len(self.public_x)
        device = self.device
        return ZeroShotServer(
            scores=torch.zeros(rows, K, device=device),
            is_set=torch.zeros(K, dtype=torch.bool, device=device),
            public_x=self.public_x,
            public_y=self.public_y,
            public_di=torch.zeros(len(self.public_y), dtype=torch.bool, device=device),
            registry={},
            names={},
        )

    def restore_server(self, saved: Any) -> ZeroShotServer:
        """The state from a checkpoint: its plain dict of fields (`ZeroShotServer.from_saved`, also
        the form earlier fedac kept the state in) rebuilt, a `ZeroShotServer` as it is."""
        if isinstance(saved, ZeroShotServer):
            return saved
        if not isinstance(saved, dict):
            raise CheckpointError(
                f"the checkpoint's zero-shot server state is a {type(saved).__name__}, not a dict: "
                "it was written by another fedac version; resume it with that version, or start "
                "the run again"
            )
        return ZeroShotServer.from_saved(saved)

    def broadcast(self, server: ZeroShotServer) -> ZeroShotBroadcast:
        return ZeroShotBroadcast(server, torch.cat([self.eval_x, server.public_x]))

    def init_client_state(self, client: str) -> Any:
        return None  # every round trains a fresh model (Alg. 1 "Build")

    def global_model(self, server: ZeroShotServer) -> nn.Module | None:
        return None  # the global "model" is the score table f_G

    def personalized_model(self, client: str, state: Any) -> nn.Module | None:
        return None

    def _fresh_model(self, arch: str, outputs: int, *ids: object) -> nn.Module:

        # drawn on the CPU, trained on self.device
        with torch.random.fork_rng(), torch.device("cpu"):
            torch.manual_seed(derive_seed(self.cfg.seed, "zeroshot-init", *ids))
            return build_model(arch, self.task.num_features, outputs).to(self.device)

    def _optimizer(self, model: nn.Module) -> torch.optim.Optimizer | None:
        """Adam at train.lr (`zeroshot.optimizer=adam`), or None for local.py's SGD."""
        name = self.cfg.zeroshot.optimizer
        if name not in ("adam", "sgd"):
            raise ConfigError(f"zeroshot.optimizer must be adam or sgd, got {name!r}")
        return (
            torch.optim.Adam(model.parameters(), lr=self.cfg.train.lr) if name == "adam" else None
        )

    @torch.no_grad()
    def _scores(self, model: nn.Module, rows: torch.Tensor) -> torch.Tensor:
        model.eval()
        return torch.cat(
            [
                torch.softmax(model(chunk), dim=1)
                for chunk in rows.split(self.cfg.train.eval_batch_size)
            ]
        )

    def client_update(
        self,
        payload: ZeroShotBroadcast,
        state: Any,
        data: ClientData,
        round_idx: int,
        generator: torch.Generator,
    ) -> ClientResult:
        # feature tensors: the zero-shot driver's (engine/zeroshot.py client_data)
        assert isinstance(data.x, torch.Tensor) and isinstance(data.y, torch.Tensor)
        server = payload.server
        registry, K = server.registry, server.scores.shape[1]
        ids = sorted(set(data.y.tolist()))
        mapping = {i: (registry.get((data.name, i)) if i >= NEW_ID else i) for i in ids}
        unknown = [i for i in ids if mapping[i] is None]
        user = cast(StreamClientData, data)  # the zero-shot driver's (engine/zeroshot.py)
        arch = user.architecture
        if unknown and self.cfg.zeroshot.choice2:
            outputs = {
                **{i: m for i, m in mapping.items() if m is not None},
                **{i: K + j for j, i in enumerate(unknown)},
            }
            x = torch.cat([server.public_x, data.x])
            y = torch.cat(
                [
                    server.public_y,
                    torch.tensor([outputs[int(i)] for i in data.y], device=data.y.device),
                ]
            )
            model = self._fresh_model(arch, K + len(unknown), "report", round_idx, data.name)
            metrics = train_supervised(
                model, x, y, self.cfg.train, generator, optimizer=self._optimizer(model)
            )
            report = ClassReport(
                user=data.name,
                arch=arch,
                state=model_params(model),
                num_known=K,
                local_ids=unknown,
                names=[user.names.get(i) for i in unknown],
            )
            return ClientResult(report, None, {**metrics, "reported": float(len(unknown))})
        device = data.y.device
        keep = torch.tensor(
            [mapping[int(i)] is not None for i in data.y], dtype=torch.bool, device=device
        )
        mapped = torch.tensor(
            [mapping[int(i)] if mapping[int(i)] is not None else -1 for i in data.y], device=device
        )[keep]
        labels = sorted(set(mapped.tolist()))
        position = {c: j for j, c in enumerate(labels)}
        model = self._fresh_model(arch, len(labels), "local", round_idx, data.name)
        metrics = train_supervised(
            model,
            data.x[keep],
            torch.tensor([position[int(c)] for c in mapped], device=device),
            self.cfg.train,
            generator,
            optimizer=self._optimizer(model),
        )
        local = self._scores(model, payload.rows)
        n_public = len(server.public_y)
        alpha = int(keep.sum()) / n_public
        cols = torch.tensor(labels, device=device)
        updated = alpha_update(
            server.scores[:, cols],
            local,
            alpha,
            server.is_set[cols],
            self.cfg.zeroshot.score_rule,
        )
        rows = len(local) - n_public
        local_acc = labelled_accuracy(local[rows:], server.public_y, labels)
        acc = labelled_accuracy(updated[rows:], server.public_y, labels)
        return ClientResult(
            ScoreUpload(user=data.name, labels=labels, scores=updated, acc=acc),
            None,
            {**metrics, "local_acc": local_acc, "acc": acc, "n": float(keep.sum())},
        )

    def server_update(
        self, server: ZeroShotServer, uploads: list[tuple[Any, int]], round_idx: int
    ) -> tuple[ZeroShotServer, dict[str, float]]:
        """The contract's form of `update` (no oracle count: `zeroshot.num_new=oracle` rounds with
        reports need the driver's `update`)."""
        step = self.update(server, uploads, round_idx)
        return step.server, step.metrics

    def update(
        self,
        server: ZeroShotServer,
        uploads: list[tuple[ZeroShotUpload, int]],
        round_idx: int,
        num_new: int | None = None,
    ) -> ZeroShotUpdate:
        """Choice 1's score aggregation and, with reports, choice 2's registration. `num_new`: the
        number of truly new classes among the reports, which only the driver knows
        (`zeroshot.num_new=oracle`)."""
        zs = self.cfg.zeroshot
        shared = [(u.scores, u.labels, u.acc) for u, _ in uploads if isinstance(u, ScoreUpload)]
        reports = [u for u, _ in uploads if isinstance(u, ClassReport)]
        scores, is_set = beta_aggregate(server.scores, server.is_set, shared, zs.score_rule)
        server = replace(server, scores=scores, is_set=is_set, registry=dict(server.registry))
        metrics = {"reports": float(sum(len(r.local_ids) for r in reports))}
        if not reports:
            return ZeroShotUpdate(server, metrics)
        registered, grouping = self._register(server, reports, round_idx, num_new)
        return ZeroShotUpdate(server, {**metrics, **registered}, grouping)

    def _impressions(
        self, report: ClassReport, round_idx: int
    ) -> tuple[list[torch.Tensor], float, torch.Tensor]:
        """Each new class's impressions from a reporter's model, their self-consistency and the
        model's class-similarity matrix."""

        zs = self.cfg.zeroshot
        K, new = report.num_known, report.local_ids
        with torch.device("cpu"):
            model = build_model(report.arch, self.task.num_features, K + len(new))
        model = model.to(self.device)
        model.load_state_dict(report.state)
        similarity = class_similarity(model.head.weight).cpu().numpy()
        count = zs.di_per_class or int(np.bincount(self.public_y).max())
        shape = tuple(self.public_x.shape[1:])
        targets, x0, weights = [], [], []
        # every class seeded on its own, all optimised in one tensor
        for j, local_id in enumerate(new):
            rng = numpy_rng(self.cfg.seed, "zeroshot-dirichlet", round_idx, report.user, local_id)
            targets.append(
                torch.from_numpy(dirichlet_targets(similarity[K + j], count, zs.di_betas, rng)).to(
                    self.device
                )
            )
            gen = torch_generator(
                self.cfg.seed, "zeroshot-impressions", round_idx, report.user, local_id
            )
            x0.append(initial_impressions(count, shape, zs.di_batch, gen, self.device))
            weights.append(batch_weights(count, zs.di_batch, self.device))
        x, _, _ = optimize_impressions(
            model,
            torch.cat(x0),
            torch.cat(targets),
            torch.cat(weights),
            zs.di_tau,
            zs.di_lr,
            zs.di_steps,
        )
        out = list(x.split(count))
        predicted = self._scores(model, x).argmax(1).view(len(new), count)
        hits = int(
            (predicted == (K + torch.arange(len(new), device=predicted.device)).view(-1, 1)).sum()
        )
        return out, hits / max(1, count * len(new)), torch.from_numpy(similarity)

    def synthesize_reports(
        self, reports: list[ClassReport], round_idx: int, workers: int | None = None
    ) -> list[tuple[list[torch.Tensor], float, torch.Tensor]]:
        """`_impressions` of every report, on `workers` threads (default the runtime's,
        `runtime.cohort_workers`; torch releases the GIL inside its ops, so each report keeps one
        core busy). Each report's randomness is its own: the numbers do not depend on the thread
        count."""
        workers = self.runtime.workers if workers is None else workers
        synthesize = lambda report: self._impressions(report, round_idx)  # noqa: E731
        if workers > 1 and len(reports) > 1:
            with ThreadPoolExecutor(
                min(workers, len(reports)), thread_name_prefix="fedac-impressions"
            ) as pool:
                return list(pool.map(synthesize, reports))
        return list(map(synthesize, reports))

    def _new_class_labels(
        self,
        server: ZeroShotServer,
        reports: list[ClassReport],
        keys: list[tuple[str, int]],
        points: np.ndarray,
        owner: np.ndarray,
        anchors: np.ndarray,
        anchor_labels: np.ndarray,
        groups: int,
        oracle: int | None,
    ) -> tuple[list[int], np.ndarray]:
        """The global label of each reported class and k-medoids' clusters: by the reported names
        (`zeroshot.identity=reported`; the grouping is then a diagnostic only), else by grouping the
        impressions into the oracle's or the chosen number of new classes (updates `server.names`
        in place); `groups` is the number of impressions (one per reported class)."""
        zs = self.cfg.zeroshot
        K = server.scores.shape[1]
        if zs.identity == "reported":
            names = [name for r in reports for name in r.names]
            if None in names:
                user, local_id = keys[names.index(None)]
                raise ConfigError(
                    f"zeroshot.identity=reported, but {user}'s report of local class {local_id} "
                    "names no class: the driver must give each new class's name (or use "
                    "identity=anonymous)"
                )
            num_new = len(set(names) - set(server.names))
            labels, server.names = labels_by_name(cast(list[str], names), server.names, K)
            _, cluster = group_new_classes(
                points, owner, anchors, anchor_labels, max(1, num_new), K
            )  # diagnostic
        else:
            if zs.num_new == "oracle":
                if oracle is None:
                    raise ConfigError(
                        "zeroshot.num_new=oracle: a round with reports needs the driver's count of "
                        "truly new classes (ZeroShotFL.update(..., num_new=)); use "
                        "zeroshot.num_new=auto without it"
                    )
                num_new = oracle
            elif zs.num_new == "auto":
                num_new = choose_num_new(points, anchors, anchor_labels, groups)
            else:
                raise ConfigError(f"zeroshot.num_new must be oracle or auto, got {zs.num_new!r}")
            labels, cluster = group_new_classes(points, owner, anchors, anchor_labels, num_new, K)
        return labels, cluster

    def _add_public_classes(
        self,
        server: ZeroShotServer,
        impressions: list[torch.Tensor],
        keys: list[tuple[str, int]],
        labels: list[int],
        is_di: torch.Tensor,
    ) -> int:
        """Register each reported class under its label and add the merged impressions of each
        label to the server's public set, with zero scores and unset columns for the new labels
        (updates `server` in place); returns the new number of labels."""
        zs = self.cfg.zeroshot
        K = server.scores.shape[1]
        new_x, new_y = [], []
        for label in sorted(set(labels)):
            merged = merge_impressions(
                [x for x, lab in zip(impressions, labels) if lab == label], zs.di_merge
            )
            new_x.append(merged)
            new_y.append(torch.full((len(merged),), label, dtype=torch.long, device=merged.device))
        for key, label in zip(keys, labels):
            server.registry[key] = label
        added = torch.cat(new_x)
        width = max(K, max(labels) + 1)
        server.public_x = torch.cat([server.public_x, added])
        server.public_y = torch.cat([server.public_y, torch.cat(new_y)])
        server.public_di = torch.cat(
            [is_di, torch.ones(len(added), dtype=torch.bool, device=is_di.device)]
        )
        scores = server.scores.new_zeros(len(server.scores) + len(added), width)
        scores[: len(server.scores), :K] = server.scores
        server.scores = scores
        server.is_set = torch.cat([server.is_set, server.is_set.new_zeros(width - K)])
        return width

    def _register(
        self,
        server: ZeroShotServer,
        reports: list[ClassReport],
        round_idx: int,
        oracle: int | None,
    ) -> tuple[dict[str, float], Grouping]:
        """Choice 2 on the server: impressions, grouping, registration (updates `server` in
        place)."""
        started = time.perf_counter()
        impressions, keys, consistency, similarity = [], [], [], {}
        for report, (xs, share, matrix) in zip(
            reports, self.synthesize_reports(reports, round_idx)
        ):
            impressions += xs
            keys += [(report.user, i) for i in report.local_ids]
            consistency.append(share)
            similarity[(report.user, report.local_ids[0])] = matrix
        di_seconds = time.perf_counter() - started
        points = torch.cat(impressions).flatten(1).cpu().numpy()  # k-medoids runs on the host
        owner = np.concatenate([np.full(len(x), g) for g, x in enumerate(impressions)])
        is_di = server.public_di
        anchors = server.public_x[is_di].flatten(1).cpu().numpy()
        anchor_labels = server.public_y[is_di].cpu().numpy()
        K = server.scores.shape[1]
        labels, cluster = self._new_class_labels(
            server, reports, keys, points, owner, anchors, anchor_labels, len(impressions), oracle
        )
        width = self._add_public_classes(server, impressions, keys, labels, is_di)
        grouping = Grouping(
            keys,
            labels,
            owner,
            cluster[: len(points)],
            points,
            cluster[len(points) :],
            anchors,
            similarity,
        )
        return {
            "di_seconds": di_seconds,
            "di_seconds_per_class": di_seconds / len(impressions),
            "di_self_consistency": float(np.mean(consistency)),
            "new_labels": float(width - K),
        }, grouping


def labelled_accuracy(scores: torch.Tensor, truth: torch.Tensor, labels: list[int]) -> float:
    """Accuracy of argmax over `labels` (the columns of `scores`) on the rows whose truth is in
    `labels`."""
    cols = torch.tensor(labels, device=truth.device)
    mask = torch.isin(truth, cols)
    if not bool(mask.any()):
        return float("nan")
    predicted = cols[scores[mask].argmax(1)]
    return float((predicted == truth[mask]).float().mean())
