"""Server-side combination of uploaded models: n_k-weighted mean (fedmlac.md Eq. 3) and Layer-wise
Pruning Aggregation (LPA, fedmlac.md Eq. 10-14, Algorithm 2).

An upload is a dict of tensors with the same keys and shapes for every client of a cohort. Integer
entries (counters) are copied from the first upload.
"""

from __future__ import annotations

import logging
import math
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass

import torch

from fedac.config import AggregationConfig
from fedac.errors import ConfigError
from fedac.registry import Entry, Registry

Params = dict[str, torch.Tensor]
log = logging.getLogger(__name__)


def weighted_mean(uploads: list[tuple[Params, int]]) -> Params:
    """sum_k n_k / n * theta_k for every entry (Eq. 3)."""
    if not uploads:
        raise ValueError("cannot aggregate an empty cohort")
    device = next(iter(uploads[0][0].values())).device  # the mean is taken where the uploads are
    weights = torch.tensor([float(n) for _, n in uploads], dtype=torch.float64, device=device)
    weights = weights / weights.sum()
    out: Params = {}
    for name, first in uploads[0][0].items():
        if not first.is_floating_point():
            out[name] = first.clone()
            continue
        stacked = torch.stack([params[name].to(torch.float64) for params, _ in uploads])
        out[name] = torch.tensordot(weights, stacked, dims=1).to(first.dtype)
    return out


def layer_groups(names: list[str], unit: str) -> dict[str, list[str]]:
    """LPA "layers" (Eq. 10-14 prune per layer l). `module` (the default): a layer's tensors together,
    e.g. a conv's weight and bias, or one recurrent layer (`rnn.*_l0`, both directions); `tensor`:
    every parameter tensor on its own, so a layer's weight and bias may be pruned from different clients."""
    if unit not in ("tensor", "module"):
        raise ConfigError(f"aggregation.layer_unit must be 'tensor' or 'module', got {unit!r}")
    groups: dict[str, list[str]] = defaultdict(list)
    for name in names:
        if unit == "tensor":
            groups[name].append(name)
            continue
        module, _, leaf = name.rpartition(".")
        layer = _RNN_LAYER.search(leaf)
        groups[f"{module}.l{layer.group(1)}" if layer else module].append(name)
    return dict(groups)


_RNN_LAYER = re.compile(r"_l(\d+)(?:_reverse)?$")
DEVIATIONS = ("raw", "per_step", "cosine")


def trusted_clients(deviations: torch.Tensor, v_l: float, v_h: float) -> list[int]:
    """Eq. 12-13: drop the floor(v_h*|S|) largest and floor(v_l*|S|) smallest deviations.

    Ties are broken by client order (stable sort). If nothing would remain, the median-deviation
    client is kept (and a warning logged) so the layer is still defined.
    """
    size = len(deviations)
    order = torch.sort(deviations, stable=True).indices.tolist()
    low, high = math.floor(v_l * size), math.floor(v_h * size)
    kept = order[low : size - high]
    if not kept:
        log.warning("LPA: v_l=%s, v_h=%s prune all %d clients of a layer; keeping the median-deviation client",
                    v_l, v_h, size)
        kept = [order[(size - 1) // 2]]
    return kept


@dataclass
class LayerPruning:
    """One layer's LPA decision: each client's deviation score and the trusted clients (indices)."""

    deviations: torch.Tensor
    trusted: list[int]


def layer_deviation(stacked: dict[str, torch.Tensor], kind: str = "raw", reference: Params | None = None,
                    steps: torch.Tensor | None = None) -> torch.Tensor:
    """One score per client for a layer whose tensors are stacked along dim 0 (clients).

    - raw: Eq. 10-11 as written, ||theta_k^l - mean_j theta_j^l||_2 (unweighted cohort mean).
    - per_step (beyond the paper): the same distance between updates divided by the client's local
      step count, (theta_k - theta_global) / s_k. A client's distance from the mean grows with its
      number of SGD steps, which grows with n_k, so raw deviations rank data-rich clients as outliers.
    - cosine (beyond the paper): 1 - cos(theta_k^l - theta_global^l, mean_j of those updates), free of
      the update's length altogether.
    """
    if kind not in DEVIATIONS:
        raise ConfigError(f"aggregation.deviation must be one of {', '.join(DEVIATIONS)}, got {kind!r}")
    rows = dict(stacked)
    if kind != "raw":
        if reference is None:
            raise ConfigError(f"aggregation.deviation={kind} needs the round's global model (reference)")
        rows = {name: s - reference[name].to(torch.float64) for name, s in stacked.items()}
    if kind == "per_step":
        if steps is None:
            raise ConfigError("aggregation.deviation=per_step needs each client's local step count")
        rows = {name: d / steps.view(-1, *([1] * (d.dim() - 1))) for name, d in rows.items()}
    flat = torch.cat([r.flatten(1) for r in rows.values()], dim=1)
    mean = flat.mean(dim=0, keepdim=True)
    if kind == "cosine":
        return 1 - torch.nn.functional.cosine_similarity(flat, mean.expand_as(flat), dim=1, eps=1e-30)
    return (flat - mean).square().sum(dim=1).sqrt()


def lpa_layers(uploads: list[tuple[Params, int]], v_l: float, v_h: float, unit: str = "module",
               deviation: str = "raw", reference: Params | None = None,
               steps: list[int] | None = None) -> tuple[Params, dict[str, LayerPruning]]:
    """Layer-wise Pruning Aggregation with each layer's deviations kept (see `lpa`)."""
    if not uploads:
        raise ValueError("cannot aggregate an empty cohort")
    if not (0 <= v_l < 1 and 0 <= v_h < 1):
        raise ConfigError(f"LPA pruning fractions must lie in [0, 1): v_l={v_l}, v_h={v_h}")
    first = uploads[0][0]
    float_names = [name for name, value in first.items() if value.is_floating_point()]
    out: Params = {name: value.clone() for name, value in first.items() if not value.is_floating_point()}
    device = first[float_names[0]].device if float_names else None
    step_counts = None if steps is None else torch.tensor([max(float(s), 1.0) for s in steps], dtype=torch.float64,
                                                          device=device)
    layers: dict[str, LayerPruning] = {}
    for layer, names in layer_groups(float_names, unit).items():
        stacked = {name: torch.stack([p[name].to(torch.float64) for p, _ in uploads]) for name in names}
        scores = layer_deviation(stacked, deviation, reference, step_counts)
        kept = trusted_clients(scores, v_l, v_h)
        layers[layer] = LayerPruning(scores, kept)
        # Eq. 14: n_k-weighted mean over the trusted set of this layer.
        weights = torch.tensor([float(uploads[k][1]) for k in kept], dtype=torch.float64, device=device)
        weights = weights / weights.sum()
        for name, s in stacked.items():
            out[name] = torch.tensordot(weights, s[kept], dims=1).to(first[name].dtype)
    return {name: out[name] for name in first}, layers


def lpa(uploads: list[tuple[Params, int]], v_l: float, v_h: float, unit: str = "module", deviation: str = "raw",
        reference: Params | None = None, steps: list[int] | None = None) -> tuple[Params, dict[str, list[int]]]:
    """Layer-wise Pruning Aggregation. Returns the aggregate and, per layer, the trusted client indices."""
    params, layers = lpa_layers(uploads, v_l, v_h, unit, deviation, reference, steps)
    return params, {layer: p.trusted for layer, p in layers.items()}


def pruning_bias(layers: dict[str, LayerPruning], sizes: list[int]) -> dict[str, float]:
    """Whether LPA prunes the data-rich clients: how much of the round's data the trusted sets keep,
    how often the top quarter of clients by n_k is pruned against the rest, and the Spearman rank
    correlation of n_k with the deviation score (averaged over layers)."""
    # Diagnostics, computed on the host once per round.
    n = torch.tensor([float(s) for s in sizes], dtype=torch.float64, device="cpu")
    count = len(sizes)
    rich = torch.zeros(count, dtype=torch.bool, device="cpu")
    rich[torch.argsort(n, descending=True, stable=True)[: max(1, count // 4)]] = True
    kept_share, rich_pruned, rest_pruned, corr = [], [], [], []
    for p in layers.values():
        pruned = torch.ones(count, dtype=torch.bool, device="cpu")
        pruned[p.trusted] = False
        kept_share.append(float(n[~pruned].sum() / n.sum()))
        rich_pruned.append(float(pruned[rich].double().mean()))
        if (~rich).any():
            rest_pruned.append(float(pruned[~rich].double().mean()))
        corr.append(spearman(n, p.deviations.cpu()))
    mean = lambda v: float(sum(v) / len(v)) if v else float("nan")  # noqa: E731
    out = {"lpa_trusted_fraction": mean([len(p.trusted) / count for p in layers.values()]),
           "lpa_kept_data_share": mean(kept_share), "lpa_rich_pruned": mean(rich_pruned),
           "lpa_rest_pruned": mean(rest_pruned), "lpa_size_deviation_rank_corr": mean(corr)}
    # Undefined values (equal sizes, a one-client cohort) are left out rather than logged as NaN.
    return {k: v for k, v in out.items() if math.isfinite(v)}


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman's rho with average ranks for ties; nan when either side is constant."""
    from scipy.stats import spearmanr

    if len(a) < 2 or bool((a == a[0]).all()) or bool((b == b[0]).all()):
        return float("nan")
    return float(spearmanr(a.numpy(), b.numpy()).statistic)


WEIGHTINGS = ("n_k", "uniform")


def weighted_uploads(uploads: list[tuple[Params, int]], weighting: str) -> list[tuple[Params, int]]:
    """The uploads with the weights `aggregation.weighting` gives them: n_k as uploaded, or 1 each."""
    if weighting not in WEIGHTINGS:
        raise ConfigError(f"aggregation.weighting must be one of {', '.join(WEIGHTINGS)}, got {weighting!r}")
    return uploads if weighting == "n_k" else [(params, 1) for params, _ in uploads]


def aggregate(uploads: list[tuple[Params, int]], cfg: AggregationConfig, use_lpa: bool | None = None,
              reference: Params | None = None, steps: list[int] | None = None, weighting: str | None = None,
              ) -> tuple[Params, dict[str, float], dict[str, LayerPruning] | None]:
    """The configured combination (`cfg.method`, or LPA forced on/off by `use_lpa`) with summary metrics
    and, for LPA, each layer's pruning (None for the mean). `reference` (the round's global model) and
    `steps` (each client's local SGD steps) feed the deviations that need them (`cfg.deviation`).
    `weighting` (None: `cfg.weighting`) uniform gives every upload weight 1 in each mean; LPA's pruning
    bias still reads n_k."""
    sizes = [n for _, n in uploads]
    uploads = weighted_uploads(uploads, weighting or cfg.weighting)
    if cfg.method not in ("mean", "lpa"):  # any other registered rule also replaces FedMLAC's LPA switch
        metrics = norm_bound_metrics(uploads, reference, cfg.clip_norm) if cfg.method == "norm_bound" else {}
        return robust_aggregate(uploads, cfg, reference), metrics, None
    method = ("lpa" if use_lpa else "mean") if use_lpa is not None else cfg.method
    if method == "mean":
        return weighted_mean(uploads), {}, None
    if method == "lpa":
        params, layers = lpa_layers(uploads, cfg.v_l, cfg.v_h, cfg.layer_unit, cfg.deviation, reference, steps)
        return params, pruning_bias(layers, sizes), layers
    raise ConfigError(f"unknown aggregation.method '{method}'; use mean, lpa or one of {', '.join(ROBUST_METHODS)}")


def finite(params: Params) -> bool:
    return all(bool(torch.isfinite(v).all()) for v in params.values() if v.is_floating_point())


# --- Byzantine-robust rules (issue 13) -------------------------------------------------------------
# Each takes the cohort's uploads like `weighted_mean` and returns one model; integer entries are
# copied from the first upload. Median, trimmed mean, Krum and Bulyan ignore n_k, as their papers and
# Flower's functions (flwr.server.strategy.aggregate) do; Multi-Krum averages its selection n_k-weighted,
# as Flower does. tests/test_robust_aggregation.py checks each against Flower's function.

ROBUST_METHODS = ("median", "trimmed_mean", "krum", "multikrum", "bulyan", "norm_bound")


def _coordinatewise(uploads: list[tuple[Params, int]], rule) -> Params:
    """`rule` applied to each floating entry stacked over clients (dim 0)."""
    if not uploads:
        raise ValueError("cannot aggregate an empty cohort")
    out: Params = {}
    for name, first in uploads[0][0].items():
        if not first.is_floating_point():
            out[name] = first.clone()
            continue
        out[name] = rule(torch.stack([p[name].to(torch.float64) for p, _ in uploads])).to(first.dtype)
    return out


def _median(stacked: torch.Tensor) -> torch.Tensor:
    """The coordinate-wise median; for an even count the mean of the two middle values (numpy's)."""
    ordered = stacked.sort(dim=0).values
    size = ordered.shape[0]
    return (ordered[(size - 1) // 2] + ordered[size // 2]) / 2


def coordinate_median(uploads: list[tuple[Params, int]]) -> Params:
    """Coordinate-wise median (Yin et al. 2018)."""
    return _coordinatewise(uploads, _median)


def trimmed_mean(uploads: list[tuple[Params, int]], fraction: float) -> Params:
    """Coordinate-wise beta-trimmed mean (Yin et al. 2018): per coordinate, drop the floor(beta * n)
    largest and smallest values and average the rest."""
    if not 0 <= fraction < 0.5:
        raise ConfigError(f"aggregation.trim_fraction must lie in [0, 0.5), got {fraction}")

    def rule(stacked: torch.Tensor) -> torch.Tensor:
        cut = int(fraction * stacked.shape[0])
        return stacked.sort(dim=0).values[cut: stacked.shape[0] - cut].mean(dim=0)

    return _coordinatewise(uploads, rule)


def _flat(uploads: list[tuple[Params, int]]) -> torch.Tensor:
    """(clients, coordinates): every floating entry of each upload, flattened in key order."""
    names = [n for n, v in uploads[0][0].items() if v.is_floating_point()]
    return torch.stack([torch.cat([p[n].to(torch.float64).flatten() for n in names]) for p, _ in uploads])


def krum_scores(flat: torch.Tensor, num_malicious: int) -> torch.Tensor:
    """Krum's score (Blanchard et al. 2017): each upload's summed squared distance to its n - f - 2
    nearest other uploads (at least one, as in Flower)."""
    size = flat.shape[0]
    if size == 1:
        return flat.new_zeros(1)
    distances = torch.cdist(flat, flat).square()
    distances.fill_diagonal_(float("inf"))
    closest = min(max(1, size - num_malicious - 2), size - 1)
    return distances.sort(dim=1).values[:, :closest].sum(dim=1)


def _check_f(num_malicious: int) -> None:
    if num_malicious < 0:
        raise ConfigError(f"aggregation.num_malicious must be >= 0, got {num_malicious}")


def krum(uploads: list[tuple[Params, int]], num_malicious: int) -> Params:
    """The single upload with the lowest Krum score."""
    _check_f(num_malicious)
    best = int(torch.argmin(krum_scores(_flat(uploads), num_malicious)))
    return {name: value.clone() for name, value in uploads[best][0].items()}


def multikrum(uploads: list[tuple[Params, int]], num_malicious: int, keep: int | None = None) -> Params:
    """Multi-Krum: the n_k-weighted mean of the `keep` uploads with the lowest Krum scores (None:
    n - f, Blanchard et al.'s m)."""
    _check_f(num_malicious)
    keep = len(uploads) - num_malicious if keep is None else keep
    if not 1 <= keep <= len(uploads):
        raise ConfigError(f"aggregation.multikrum_keep must lie in [1, cohort size {len(uploads)}], got {keep}; "
                          "lower it or sample more clients per round (train.fraction)")
    order = torch.sort(krum_scores(_flat(uploads), num_malicious), stable=True).indices[:keep].tolist()
    return weighted_mean([uploads[i] for i in order])


def bulyan(uploads: list[tuple[Params, int]], num_malicious: int) -> Params:
    """Bulyan (El Mhamdi et al. 2018) over Krum: pick theta = n - 2f uploads by Krum one at a time
    (re-scored on the uploads left), then per coordinate average the beta = theta - 2f values closest
    to the selection's median. Needs n >= 4f + 3."""
    _check_f(num_malicious)
    size, f = len(uploads), num_malicious
    if size < 4 * f + 3:
        raise ConfigError(f"aggregation.method=bulyan needs a cohort of at least 4 * num_malicious + 3 = {4 * f + 3} "
                          f"clients, got {size}; lower aggregation.num_malicious or raise train.fraction")
    flat = _flat(uploads)
    left, chosen = list(range(size)), []
    for _ in range(size - 2 * f):
        pick = left[int(torch.argmin(krum_scores(flat[left], f)))]
        chosen.append(pick)
        left.remove(pick)
    beta = len(chosen) - 2 * f

    def rule(stacked: torch.Tensor) -> torch.Tensor:
        closest = (stacked - _median(stacked)).abs().argsort(dim=0, stable=True)[:beta]
        return stacked.gather(0, closest).mean(dim=0)

    return _coordinatewise([uploads[i] for i in chosen], rule)


def norm_bound(uploads: list[tuple[Params, int]], reference: Params | None, clip_norm: float) -> Params:
    """Norm bounding (Sun et al. 2019): each update theta_k - theta_global scaled to L2 norm at most
    `clip_norm` (over all floating entries), then the n_k-weighted mean of the bounded models."""
    if reference is None:
        raise ConfigError("aggregation.method=norm_bound needs the round's global model (reference)")
    if not clip_norm > 0:
        raise ConfigError(f"aggregation.clip_norm must be > 0, got {clip_norm}")
    return weighted_mean([(clip_update(p, reference, clip_norm), n) for p, n in uploads])


def norm_bound_metrics(uploads: list[tuple[Params, int]], reference: Params | None, clip_norm: float) -> dict[str, float]:
    """The round's update norms against `clip_norm` (metrics.csv): their median and the share of the
    cohort clipped, for choosing `aggregation.clip_norm`. At the robustness table's Speech Commands protocol
    the honest median grows from 1.1 (round 5) to 2.4 (round 40), so the default 1.0 clips every update
    from round 20 on (docs/results/norm-bound-update-norms)."""
    if reference is None or not uploads:
        return {}
    norms = [_deltas_and_norm(p, reference)[1] for p, _ in uploads]
    return {"update_norm_median": statistics.median(norms),
            "clipped_share": sum(n > clip_norm for n in norms) / len(norms)}


def _deltas_and_norm(params: Params, reference: Params) -> tuple[Params, float]:
    """params - reference (float64) per floating entry, and their L2 norm taken together."""
    deltas = {n: v.to(torch.float64) - reference[n].to(torch.float64) for n, v in params.items() if v.is_floating_point()}
    return deltas, float(torch.sqrt(sum(d.square().sum() for d in deltas.values()))) if deltas else 0.0


def clip_update(params: Params, reference: Params, clip_norm: float) -> Params:
    """reference + (params - reference) * min(1, clip_norm / ||params - reference||_2), the norm taken
    over every floating entry together; integer entries are kept."""
    deltas, norm = _deltas_and_norm(params, reference)
    scale = min(1.0, clip_norm / norm) if norm > 0 else 1.0
    return {n: (reference[n].to(torch.float64) + deltas[n] * scale).to(v.dtype) if n in deltas else v.clone()
            for n, v in params.items()}


# --- the aggregator registry (fedac/registry.py; plug-ins: the `fedac.aggregators` entry-point group) -----
# Every rule is called as rule(uploads, cfg: AggregationConfig, reference) -> Params, where `uploads` are
# (params, weight) pairs already weighted by `aggregation.weighting` and `reference` is the round's global
# model (None where a runtime has none). `aggregate` takes mean and LPA itself (LPA also reports pruning).

def mean_rule(uploads: list[tuple[Params, int]], cfg: AggregationConfig, reference: Params | None = None) -> Params:
    return weighted_mean(uploads)


def lpa_rule(uploads: list[tuple[Params, int]], cfg: AggregationConfig, reference: Params | None = None) -> Params:
    return lpa_layers(uploads, cfg.v_l, cfg.v_h, cfg.layer_unit, cfg.deviation, reference)[0]


def median_rule(uploads: list[tuple[Params, int]], cfg: AggregationConfig, reference: Params | None = None) -> Params:
    return coordinate_median(uploads)


def trimmed_mean_rule(uploads: list[tuple[Params, int]], cfg: AggregationConfig, reference: Params | None = None) -> Params:
    return trimmed_mean(uploads, cfg.trim_fraction)


def krum_rule(uploads: list[tuple[Params, int]], cfg: AggregationConfig, reference: Params | None = None) -> Params:
    return krum(uploads, cfg.num_malicious)


def multikrum_rule(uploads: list[tuple[Params, int]], cfg: AggregationConfig, reference: Params | None = None) -> Params:
    return multikrum(uploads, cfg.num_malicious, cfg.multikrum_keep)


def bulyan_rule(uploads: list[tuple[Params, int]], cfg: AggregationConfig, reference: Params | None = None) -> Params:
    return bulyan(uploads, cfg.num_malicious)


def norm_bound_rule(uploads: list[tuple[Params, int]], cfg: AggregationConfig, reference: Params | None = None) -> Params:
    return norm_bound(uploads, reference, cfg.clip_norm)


AGGREGATORS = Registry("aggregator", {
    "mean": Entry("fedac.aggregation:mean_rule", "n_k-weighted mean of the uploads (FedAvg, fedmlac.md Eq. 3)"),
    "lpa": Entry("fedac.aggregation:lpa_rule", "Layer-wise Pruning Aggregation: per layer, drop the v_l / v_h "
                 "least / most deviating clients (Eq. 10-14)"),
    "median": Entry("fedac.aggregation:median_rule", "coordinate-wise median (Yin et al. 2018)"),
    "trimmed_mean": Entry("fedac.aggregation:trimmed_mean_rule", "coordinate-wise trimmed mean, trim_fraction cut "
                          "at each end (Yin et al. 2018)"),
    "krum": Entry("fedac.aggregation:krum_rule", "Krum: the upload closest to its neighbours (Blanchard et al. 2017)"),
    "multikrum": Entry("fedac.aggregation:multikrum_rule", "Multi-Krum: the mean of the multikrum_keep best Krum scores"),
    "bulyan": Entry("fedac.aggregation:bulyan_rule", "Bulyan: Krum selection, then a trimmed mean (El Mhamdi et al. 2018)"),
    "norm_bound": Entry("fedac.aggregation:norm_bound_rule", "updates scaled to at most clip_norm, then the mean "
                        "(Sun et al. 2019)"),
}, setting="aggregation.method")


def robust_aggregate(uploads: list[tuple[Params, int]], cfg: AggregationConfig, reference: Params | None = None) -> Params:
    """The rule `cfg.method` names (any registered aggregator, plug-ins included) with its settings."""
    return AGGREGATORS.load(cfg.method)(uploads, cfg, reference)


# --- early-exit aggregation (issue 17) --------------------------------------------------------------
# Uploads carry different key sets: a client at depth L_i uploads the tensors it trained (front end,
# encoder.layers[:L_i], the head at L_i) and its depth under "depth" (algorithms/earlyexit.py).

EXIT_AGGREGATIONS = ("depth_weighted", "layerwise", "fedavg")


def exit_aggregate(uploads: list[tuple[Params, int]], reference: Params, mode: str = "depth_weighted") -> Params:
    """The next global model from uploads with different key sets (early-exit paper, Eq. 1).

    - depth_weighted (Eq. 1): each tensor w_l = sum_{i in S_l} n_i L_i w_{l,i} / sum_{j in S_l} n_j L_j
      over S_l, the clients that uploaded it; the paper writes S_l = {i : L_i >= l} for layers and
      {i : L_i = e} for the head of exit e, which is exactly who uploads them. Eq. 1 speaks of local
      updates; with weights summing to 1 averaging weights equals adding the averaged update.
    - layerwise (HeteroFL's rule, the paper's ablation): the same with weights n_i.
    - fedavg (the paper's heterogeneous FedAvg baseline): every client stands for a full model whose
      untrained tensors are the received `reference`, averaged with weights n_i over the whole cohort,
      so a deep layer's update is diluted by the clients that did not train it.
    A tensor nobody uploaded keeps its `reference` value (S_l empty).
    """
    if mode not in EXIT_AGGREGATIONS:
        raise ConfigError(f"earlyexit.aggregation must be one of {', '.join(EXIT_AGGREGATIONS)}, got {mode!r}")
    if not uploads:
        raise ValueError("cannot aggregate an empty cohort")
    out: Params = {}
    for name, current in reference.items():
        if mode == "fedavg":
            members = [(p.get(name, current), float(n)) for p, n in uploads]
        else:
            members = [(p[name], float(n) * (int(p["depth"]) if mode == "depth_weighted" else 1))
                       for p, n in uploads if name in p]
        if not members or not current.is_floating_point():
            out[name] = current.clone()
            continue
        weights = torch.tensor([w for _, w in members], dtype=torch.float64, device=current.device)
        stacked = torch.stack([v.to(torch.float64) for v, _ in members])
        out[name] = torch.tensordot(weights / weights.sum(), stacked, dims=1).to(current.dtype)
    return out
