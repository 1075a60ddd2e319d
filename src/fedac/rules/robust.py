"""Byzantine-robust aggregation rules, so that a few poisoned uploads cannot steer the global
model: coordinate-wise median, trimmed mean, Krum, Multi-Krum, Bulyan and norm bounding, each
registered in `fedac.rules.AGGREGATORS` through its `*_rule` adapter below.
"""

from __future__ import annotations

import statistics
from typing import cast

import torch

from fedac.config import AggregationConfig
from fedac.errors import ConfigError
from fedac.rules.aggregation import Aggregate, Params, weighted_mean

# Each takes the cohort's uploads like `weighted_mean` and returns one model; integer entries are
# copied from the first upload. Median, trimmed mean, Krum and Bulyan ignore n_k, as their papers
# and Flower's functions (flwr.server.strategy.aggregate) do; Multi-Krum averages its selection
# n_k-weighted, as Flower does. tests/rules/test_robust_aggregation.py checks each against Flower's
# function.


def _coordinatewise(uploads: list[tuple[Params, int]], rule) -> Params:
    """`rule` applied to each floating entry stacked over clients (dim 0)."""
    if not uploads:
        raise ValueError("cannot aggregate an empty cohort")
    out: Params = {}
    for name, first in uploads[0][0].items():
        if not first.is_floating_point():
            out[name] = first.clone()
            continue
        out[name] = rule(torch.stack([p[name].to(torch.float64) for p, _ in uploads])).to(
            first.dtype
        )
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
        return stacked.sort(dim=0).values[cut : stacked.shape[0] - cut].mean(dim=0)

    return _coordinatewise(uploads, rule)


def _flat(uploads: list[tuple[Params, int]]) -> torch.Tensor:
    """(clients, coordinates): every floating entry of each upload, flattened in key order."""
    names = [n for n, v in uploads[0][0].items() if v.is_floating_point()]
    return torch.stack(
        [torch.cat([p[n].to(torch.float64).flatten() for n in names]) for p, _ in uploads]
    )


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


def multikrum(
    uploads: list[tuple[Params, int]], num_malicious: int, keep: int | None = None
) -> Params:
    """Multi-Krum: the n_k-weighted mean of the `keep` uploads with the lowest Krum scores (None:
    n - f, Blanchard et al.'s m)."""
    _check_f(num_malicious)
    keep = len(uploads) - num_malicious if keep is None else keep
    if not 1 <= keep <= len(uploads):
        raise ConfigError(
            f"aggregation.multikrum_keep must lie in [1, cohort size {len(uploads)}], got {keep}; "
            "lower it or sample more clients per round (train.fraction)"
        )
    order = (
        torch.sort(krum_scores(_flat(uploads), num_malicious), stable=True).indices[:keep].tolist()
    )
    return weighted_mean([uploads[i] for i in order])


def bulyan(uploads: list[tuple[Params, int]], num_malicious: int) -> Params:
    """Bulyan (El Mhamdi et al. 2018) over Krum: pick theta = n - 2f uploads by Krum one at a time
    (re-scored on the uploads left), then per coordinate average the beta = theta - 2f values
    closest to the selection's median. Needs n >= 4f + 3."""
    _check_f(num_malicious)
    size, f = len(uploads), num_malicious
    if size < 4 * f + 3:
        raise ConfigError(
            "aggregation.method=bulyan needs a cohort of at least 4 * num_malicious + 3 = "
            f"{4 * f + 3} clients, got {size}; lower aggregation.num_malicious or raise "
            "train.fraction"
        )
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


def norm_bound(
    uploads: list[tuple[Params, int]], reference: Params | None, clip_norm: float
) -> Params:
    """Norm bounding (Sun et al. 2019): each update theta_k - theta_global scaled to L2 norm at most
    `clip_norm` (over all floating entries), then the n_k-weighted mean of the bounded models."""
    if reference is None:
        raise ConfigError(
            "aggregation.method=norm_bound needs the round's global model (reference)"
        )
    if not clip_norm > 0:
        raise ConfigError(f"aggregation.clip_norm must be > 0, got {clip_norm}")
    return weighted_mean([(clip_update(p, reference, clip_norm), n) for p, n in uploads])


def norm_bound_metrics(
    uploads: list[tuple[Params, int]], reference: Params | None, clip_norm: float
) -> dict[str, float]:
    """The round's update norms against `clip_norm` (metrics.csv): their median and the share of the
    cohort clipped, for choosing `aggregation.clip_norm`. At the robustness table's Speech Commands
    protocol the honest median grows from 1.1 (round 5) to 2.4 (round 40), so the default 1.0 clips
    every update from round 20 on (docs/results/norm-bound-update-norms)."""
    if reference is None or not uploads:
        return {}
    norms = [_deltas_and_norm(p, reference)[1] for p, _ in uploads]
    return {
        "update_norm_median": statistics.median(norms),
        "clipped_share": sum(n > clip_norm for n in norms) / len(norms),
    }


def _deltas_and_norm(params: Params, reference: Params) -> tuple[Params, float]:
    """params - reference (float64) per floating entry, and their L2 norm taken together."""
    deltas = {
        n: v.to(torch.float64) - reference[n].to(torch.float64)
        for n, v in params.items()
        if v.is_floating_point()
    }
    # (a sum of tensors)
    squared = cast(torch.Tensor, sum(d.square().sum() for d in deltas.values()))
    return deltas, float(torch.sqrt(squared)) if deltas else 0.0


def clip_update(params: Params, reference: Params, clip_norm: float) -> Params:
    """reference + (params - reference) * min(1, clip_norm / ||params - reference||_2), the norm
    taken over every floating entry together; integer entries are kept."""
    deltas, norm = _deltas_and_norm(params, reference)
    scale = min(1.0, clip_norm / norm) if norm > 0 else 1.0
    return {
        n: (reference[n].to(torch.float64) + deltas[n] * scale).to(v.dtype)
        if n in deltas
        else v.clone()
        for n, v in params.items()
    }


# --- the registry's adapters: rule(uploads, cfg, reference) (rules/aggregation.py says how rules
# are called) ---


def median_rule(
    uploads: list[tuple[Params, int]], cfg: AggregationConfig, reference: Params | None = None
) -> Params:
    return coordinate_median(uploads)


def trimmed_mean_rule(
    uploads: list[tuple[Params, int]], cfg: AggregationConfig, reference: Params | None = None
) -> Params:
    return trimmed_mean(uploads, cfg.trim_fraction)


def krum_rule(
    uploads: list[tuple[Params, int]], cfg: AggregationConfig, reference: Params | None = None
) -> Params:
    return krum(uploads, cfg.num_malicious)


def multikrum_rule(
    uploads: list[tuple[Params, int]], cfg: AggregationConfig, reference: Params | None = None
) -> Params:
    return multikrum(uploads, cfg.num_malicious, cfg.multikrum_keep)


def bulyan_rule(
    uploads: list[tuple[Params, int]], cfg: AggregationConfig, reference: Params | None = None
) -> Params:
    return bulyan(uploads, cfg.num_malicious)


def norm_bound_rule(
    uploads: list[tuple[Params, int]], cfg: AggregationConfig, reference: Params | None = None
) -> Aggregate:
    """The bounded mean with the round's update norms (metrics.csv), for choosing
    `aggregation.clip_norm`."""
    return Aggregate(
        norm_bound(uploads, reference, cfg.clip_norm),
        norm_bound_metrics(uploads, reference, cfg.clip_norm),
    )
