"""The aggregator registry (`aggregation.method`) and each aggregator's own settings.

A rule's settings are a dataclass here; its registry entry names it (`Entry(..., settings=...)`) and
`Config` adds its fields to the `aggregation` section (`--set aggregation.v_l=0.2`), beside the
shared `method` and `weighting` (config.py). Several rules may name one class (Krum, Multi-Krum and
Bulyan read `num_malicious`). The rules themselves live in fedac/rules/ and are imported only when a
run uses them: this module imports no torch, so a name or a setting is checked when the config
loads.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedac.fields import number
from fedac.registry import Entry, Registry, choice


@dataclass
class LPASettings:
    v_l: float = number(0.1, "[0, 1)")
    """LPA: fraction of lowest-deviation clients pruned per layer (Eq. 12). The paper gives no
    value; 0.1 trims the near-copies of the cohort mean lightly."""
    v_h: float = number(0.2, "[0, 1)")
    """LPA: fraction of highest-deviation clients pruned per layer (Eq. 12). The paper gives no
    value; 0.2 trims outliers (noisy / mislabelled clients) harder than near-mean ones."""
    layer_unit: str = choice("module", ("module", "tensor"))
    """LPA layer granularity: module (a layer's tensors pruned together: a conv's weight and bias,
    one recurrent layer; the paper prunes layers) or tensor (each parameter tensor on its own)."""
    deviation: str = choice("raw", ("raw", "per_step", "cosine"))
    """LPA deviation score (rules/aggregation.py `layer_deviation`): raw (Eq. 11 as written),
    per_step (beyond the paper: the update divided by the client's local step count, so clients with
    more data are not ranked as outliers for taking more steps) or cosine (beyond the paper: the
    update's direction only)."""


@dataclass
class TrimSettings:
    trim_fraction: float = number(0.2, "[0, 0.5)")
    """trimmed_mean: fraction cut at each end of every coordinate, in [0, 0.5) (Yin et al. 2018's
    beta)."""


@dataclass
class KrumSettings:
    num_malicious: int = number(2, ">= 0")
    """Krum, Multi-Krum and Bulyan: f, the number of Byzantine clients the rule tolerates in a
    cohort (Blanchard et al. 2017; El Mhamdi et al. 2018). Bulyan needs a cohort of at least 4f +
    3."""


@dataclass
class MultiKrumSettings(KrumSettings):
    multikrum_keep: int | None = number(None, ">= 1")
    """multikrum: how many lowest-score uploads are averaged; None: cohort size - num_malicious."""


@dataclass
class NormBoundSettings:
    clip_norm: float = number(1.0, "> 0")
    """norm_bound: each update (upload - global model) is scaled to at most this L2 norm before the
    n_k-weighted mean (Sun et al. 2019, "Can you really backdoor federated learning?")."""


_A, _R = "fedac.rules.aggregation", "fedac.rules.robust"

#: The aggregator registry (fedac/registry.py): built-ins here, plug-ins from the
#: `fedac.aggregators` entry points. fedac.rules re-exports it.
AGGREGATORS = Registry(
    "aggregator",
    {
        "mean": Entry(
            f"{_A}:mean_rule", "n_k-weighted mean of the uploads (FedAvg, fedmlac.md Eq. 3)"
        ),
        "lpa": Entry(
            f"{_A}:lpa_rule",
            "Layer-wise Pruning Aggregation: per layer, drop the v_l / v_h least / most "
            "deviating clients (Eq. 10-14)",
            LPASettings,
        ),
        "median": Entry(f"{_R}:median_rule", "coordinate-wise median (Yin et al. 2018)"),
        "trimmed_mean": Entry(
            f"{_R}:trimmed_mean_rule",
            "coordinate-wise trimmed mean, trim_fraction cut at each end (Yin et al. 2018)",
            TrimSettings,
        ),
        "krum": Entry(
            f"{_R}:krum_rule",
            "Krum: the upload closest to its neighbours (Blanchard et al. 2017)",
            KrumSettings,
        ),
        "multikrum": Entry(
            f"{_R}:multikrum_rule",
            "Multi-Krum: the mean of the multikrum_keep best Krum scores",
            MultiKrumSettings,
        ),
        "bulyan": Entry(
            f"{_R}:bulyan_rule",
            "Bulyan: Krum selection, then a trimmed mean (El Mhamdi et al. 2018)",
            KrumSettings,
        ),
        "norm_bound": Entry(
            f"{_R}:norm_bound_rule",
            "updates scaled to at most clip_norm, then the mean (Sun et al. 2019)",
            NormBoundSettings,
        ),
    },
    setting="aggregation.method",
)
