"""Server-side combination of uploaded models: n_k-weighted mean (fedmlac.md Eq. 3) and Layer-wise
Pruning Aggregation (LPA, fedmlac.md Eq. 10-14, Algorithm 2).

An upload is a dict of tensors with the same keys and shapes for every client of a cohort. Integer
entries (counters) are copied from the first upload.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict

import torch

from fedac.config import AggregationConfig
from fedac.errors import ConfigError

Params = dict[str, torch.Tensor]
log = logging.getLogger(__name__)


def weighted_mean(uploads: list[tuple[Params, int]]) -> Params:
    """sum_k n_k / n * theta_k for every entry (Eq. 3)."""
    if not uploads:
        raise ValueError("cannot aggregate an empty cohort")
    weights = torch.tensor([float(n) for _, n in uploads], dtype=torch.float64)
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
    """LPA "layers": each parameter tensor, or all tensors of one module (e.g. conv weight + bias)."""
    if unit not in ("tensor", "module"):
        raise ConfigError(f"aggregation.layer_unit must be 'tensor' or 'module', got {unit!r}")
    groups: dict[str, list[str]] = defaultdict(list)
    for name in names:
        groups[name if unit == "tensor" else name.rsplit(".", 1)[0]].append(name)
    return dict(groups)


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


def lpa(uploads: list[tuple[Params, int]], v_l: float, v_h: float, unit: str = "tensor") -> tuple[Params, dict[str, list[int]]]:
    """Layer-wise Pruning Aggregation. Returns the aggregate and, per layer, the trusted client indices."""
    if not uploads:
        raise ValueError("cannot aggregate an empty cohort")
    if not (0 <= v_l < 1 and 0 <= v_h < 1):
        raise ConfigError(f"LPA pruning fractions must lie in [0, 1): v_l={v_l}, v_h={v_h}")
    first = uploads[0][0]
    float_names = [name for name, value in first.items() if value.is_floating_point()]
    out: Params = {name: value.clone() for name, value in first.items() if not value.is_floating_point()}
    trusted: dict[str, list[int]] = {}
    for layer, names in layer_groups(float_names, unit).items():
        stacked = {name: torch.stack([p[name].to(torch.float64) for p, _ in uploads]) for name in names}
        # Eq. 10 (unweighted cohort mean) and Eq. 11 (L2 deviation over the whole layer).
        squared = sum((s - s.mean(dim=0)).flatten(1).square().sum(dim=1) for s in stacked.values())
        kept = trusted_clients(squared.sqrt(), v_l, v_h)
        trusted[layer] = kept
        # Eq. 14: n_k-weighted mean over the trusted set of this layer.
        weights = torch.tensor([float(uploads[k][1]) for k in kept], dtype=torch.float64)
        weights = weights / weights.sum()
        for name, s in stacked.items():
            out[name] = torch.tensordot(weights, s[kept], dims=1).to(first[name].dtype)
    return {name: out[name] for name in first}, trusted


def aggregate(uploads: list[tuple[Params, int]], cfg: AggregationConfig, use_lpa: bool | None = None) -> tuple[Params, dict[str, float]]:
    """The configured combination (`cfg.method`, or LPA forced on/off by `use_lpa`) with summary metrics."""
    method = ("lpa" if use_lpa else "mean") if use_lpa is not None else cfg.method
    if method == "mean":
        return weighted_mean(uploads), {}
    if method == "lpa":
        params, trusted = lpa(uploads, cfg.v_l, cfg.v_h, cfg.layer_unit)
        kept = sum(len(k) for k in trusted.values()) / (len(trusted) * len(uploads))
        return params, {"lpa_trusted_fraction": kept}
    raise ConfigError(f"unknown aggregation.method '{method}'; use mean or lpa")


def finite(params: Params) -> bool:
    return all(bool(torch.isfinite(v).all()) for v in params.values() if v.is_floating_point())
