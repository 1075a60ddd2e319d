"""Server-side combination of uploaded models: n_k-weighted mean (fedmlac.md Eq. 3) and Layer-wise
Pruning Aggregation (LPA, fedmlac.md Eq. 10-14, Algorithm 2) with its deviation scores and
pruning-bias measurements, and `aggregate`, the configured rule (any registered aggregator,
rules/robust.py's included) returning an `Aggregate`.

An upload is a dict of tensors with the same keys and shapes for every client of a cohort. Integer
entries (counters) are copied from the first upload.
"""

from __future__ import annotations

import logging
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch

from fedac.config import AggregationConfig
from fedac.errors import ConfigError
from fedac.rules import AGGREGATORS

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
    """LPA "layers" (Eq. 10-14 prune per layer l). `module` (the default): a layer's tensors
    together, e.g. a conv's weight and bias, or one recurrent layer (`rnn.*_l0`, both directions);
    `tensor`: every parameter tensor on its own, so a layer's weight and bias may be pruned from
    different clients."""
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
        log.warning(
            "LPA: v_l=%s, v_h=%s prune all %d clients of a layer; keeping the median-deviation "
            "client",
            v_l,
            v_h,
            size,
        )
        kept = [order[(size - 1) // 2]]
    return kept


@dataclass
class LayerPruning:
    """One layer's LPA decision: each client's deviation score and the trusted clients (indices)."""

    deviations: torch.Tensor
    trusted: list[int]


def layer_deviation(
    stacked: dict[str, torch.Tensor],
    kind: str = "raw",
    reference: Params | None = None,
    steps: torch.Tensor | None = None,
) -> torch.Tensor:
    """One score per client for a layer whose tensors are stacked along dim 0 (clients).

    - raw: Eq. 10-11 as written, ||theta_k^l - mean_j theta_j^l||_2 (unweighted cohort mean).
    - per_step (beyond the paper): the same distance between updates divided by the client's local
      step count, (theta_k - theta_global) / s_k. A client's distance from the mean grows with its
      number of SGD steps, which grows with n_k, so raw deviations rank data-rich clients as
      outliers.
    - cosine (beyond the paper): 1 - cos(theta_k^l - theta_global^l, mean_j of those updates), free
      of the update's length altogether.
    """
    if kind not in DEVIATIONS:
        raise ConfigError(
            f"aggregation.deviation must be one of {', '.join(DEVIATIONS)}, got {kind!r}"
        )
    rows = dict(stacked)
    if kind != "raw":
        if reference is None:
            raise ConfigError(
                f"aggregation.deviation={kind} needs the round's global model (reference)"
            )
        rows = {name: s - reference[name].to(torch.float64) for name, s in stacked.items()}
    if kind == "per_step":
        if steps is None:
            raise ConfigError("aggregation.deviation=per_step needs each client's local step count")
        rows = {name: d / steps.view(-1, *([1] * (d.dim() - 1))) for name, d in rows.items()}
    flat = torch.cat([r.flatten(1) for r in rows.values()], dim=1)
    mean = flat.mean(dim=0, keepdim=True)
    if kind == "cosine":
        return 1 - torch.nn.functional.cosine_similarity(
            flat, mean.expand_as(flat), dim=1, eps=1e-30
        )
    return (flat - mean).square().sum(dim=1).sqrt()


def lpa_layers(
    uploads: list[tuple[Params, int]],
    v_l: float,
    v_h: float,
    unit: str = "module",
    deviation: str = "raw",
    reference: Params | None = None,
    steps: list[int] | None = None,
) -> tuple[Params, dict[str, LayerPruning]]:
    """Layer-wise Pruning Aggregation with each layer's deviations kept (see `lpa`)."""
    if not uploads:
        raise ValueError("cannot aggregate an empty cohort")
    if not (0 <= v_l < 1 and 0 <= v_h < 1):
        raise ConfigError(f"LPA pruning fractions must lie in [0, 1): v_l={v_l}, v_h={v_h}")
    first = uploads[0][0]
    float_names = [name for name, value in first.items() if value.is_floating_point()]
    out: Params = {
        name: value.clone() for name, value in first.items() if not value.is_floating_point()
    }
    device = first[float_names[0]].device if float_names else None
    step_counts = (
        None
        if steps is None
        else torch.tensor([max(float(s), 1.0) for s in steps], dtype=torch.float64, device=device)
    )
    layers: dict[str, LayerPruning] = {}
    for layer, names in layer_groups(float_names, unit).items():
        stacked = {
            name: torch.stack([p[name].to(torch.float64) for p, _ in uploads]) for name in names
        }
        scores = layer_deviation(stacked, deviation, reference, step_counts)
        kept = trusted_clients(scores, v_l, v_h)
        layers[layer] = LayerPruning(scores, kept)
        # Eq. 14: n_k-weighted mean over the trusted set of this layer.
        weights = torch.tensor(
            [float(uploads[k][1]) for k in kept], dtype=torch.float64, device=device
        )
        weights = weights / weights.sum()
        for name, s in stacked.items():
            out[name] = torch.tensordot(weights, s[kept], dims=1).to(first[name].dtype)
    return {name: out[name] for name in first}, layers


def lpa(
    uploads: list[tuple[Params, int]],
    v_l: float,
    v_h: float,
    unit: str = "module",
    deviation: str = "raw",
    reference: Params | None = None,
    steps: list[int] | None = None,
) -> tuple[Params, dict[str, list[int]]]:
    """Layer-wise Pruning Aggregation. Returns the aggregate and, per layer, the trusted client
    indices."""
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
    out = {
        "lpa_trusted_fraction": mean([len(p.trusted) / count for p in layers.values()]),
        "lpa_kept_data_share": mean(kept_share),
        "lpa_rich_pruned": mean(rich_pruned),
        "lpa_rest_pruned": mean(rest_pruned),
        "lpa_size_deviation_rank_corr": mean(corr),
    }
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
    """The uploads with the weights `aggregation.weighting` gives them: n_k as uploaded, or 1
    each."""
    if weighting not in WEIGHTINGS:
        raise ConfigError(
            f"aggregation.weighting must be one of {', '.join(WEIGHTINGS)}, got {weighting!r}"
        )
    return uploads if weighting == "n_k" else [(params, 1) for params, _ in uploads]


@dataclass
class Aggregate:
    """What one combination returns: the new parameters, summary metrics for metrics.csv and, for
    LPA, each layer's pruning decision (None for every other rule; the engine writes it to
    lpa.jsonl)."""

    params: Params
    metrics: dict[str, float] = field(default_factory=dict)
    pruning: dict[str, LayerPruning] | None = None


class ServerMetrics(dict[str, float]):
    """A server step's metrics (metrics.csv) that also carry LPA's per-layer pruning (`pruning`,
    None without LPA) for the engine's lpa.jsonl: `Algorithm.combine` returns them and
    `server_update` passes them up, so the decisions travel with the step's result instead of
    staying on the algorithm."""

    def __init__(self, metrics: dict[str, float], pruning: dict[str, LayerPruning] | None = None):
        super().__init__(metrics)
        self.pruning = pruning


def aggregate(
    uploads: list[tuple[Params, int]],
    cfg: AggregationConfig,
    use_lpa: bool | None = None,
    reference: Params | None = None,
    steps: list[int] | None = None,
    weighting: str | None = None,
) -> Aggregate:
    """The configured combination (`cfg.method`, or LPA forced on/off by `use_lpa`) as an
    `Aggregate`: the parameters, summary metrics and, for LPA, each layer's pruning (None for every
    other rule). `reference` (the round's global model) and `steps` (each client's local SGD steps)
    feed the deviations that need them (`cfg.deviation`). `weighting` (None: `cfg.weighting`)
    uniform gives every upload weight 1 in each mean; LPA's pruning bias still reads n_k."""
    sizes = [n for _, n in uploads]
    uploads = weighted_uploads(uploads, weighting or cfg.weighting)
    # any other registered rule also replaces FedMLAC's LPA switch
    if cfg.method not in ("mean", "lpa"):
        return robust_aggregate(uploads, cfg, reference)
    method = ("lpa" if use_lpa else "mean") if use_lpa is not None else cfg.method
    if method == "mean":
        return Aggregate(weighted_mean(uploads))
    params, layers = lpa_layers(
        uploads, cfg.v_l, cfg.v_h, cfg.layer_unit, cfg.deviation, reference, steps
    )
    return Aggregate(params, pruning_bias(layers, sizes), layers)


def robust_aggregate(
    uploads: list[tuple[Params, int]], cfg: AggregationConfig, reference: Params | None = None
) -> Aggregate:
    """The rule `cfg.method` names (any registered aggregator, plug-ins included) with its settings.
    A rule returns its parameters, or an `Aggregate` when it also measures something (norm
    bounding's norms)."""
    out = AGGREGATORS.load(cfg.method)(uploads, cfg, reference)
    return out if isinstance(out, Aggregate) else Aggregate(out)


def finite(params: Params) -> bool:
    return all(bool(torch.isfinite(v).all()) for v in params.values() if v.is_floating_point())


# --- the registry's entries for the two rules above (rules/__init__.py; the robust ones:
# rules/robust.py) --- Every rule is called as rule(uploads, cfg: AggregationConfig, reference) ->
# Params | Aggregate, where `uploads` are (params, weight) pairs already weighted by
# `aggregation.weighting` and `reference` is the round's global model (None where a runtime has
# none). `aggregate` takes mean and LPA itself (LPA also reports pruning).


def weighted_sum(rule: Any) -> Any:
    """Declares a rule whose result is the weighted mean of the uploads and nothing else, so a run
    over several processes may all-reduce the weighted sums instead of gathering every upload
    (engine/distributed.py `sums_uploads`); rules that need every upload (LPA, the robust ones) do
    not."""
    rule.sums_uploads = True
    return rule


@weighted_sum
def mean_rule(
    uploads: list[tuple[Params, int]], cfg: AggregationConfig, reference: Params | None = None
) -> Params:
    return weighted_mean(uploads)


def lpa_rule(
    uploads: list[tuple[Params, int]], cfg: AggregationConfig, reference: Params | None = None
) -> Params:
    return lpa_layers(uploads, cfg.v_l, cfg.v_h, cfg.layer_unit, cfg.deviation, reference)[0]
