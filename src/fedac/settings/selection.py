"""The client-selection registry (`selection.method`) and each rule's own settings.

A rule decides which of the clients online at a round's start train in it (and, in FedBuff /
FedAsync, whom a free slot is given to), from each client's history (engine/clock/selection.py).
Its settings are a dataclass here; `Config` adds their fields to the `selection` section
(`--set selection.round_penalty=0`), beside the shared `method`, as the aggregation rules do. The
rules themselves live in engine/clock/selection.py and are imported only when a run builds them:
this module imports no torch. Plug-ins add rules through the `fedac.selection` entry-point group.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import NamedTuple

from fedac.fields import number
from fedac.registry import Entry, Registry, choice


class ClockNeed(NamedTuple):
    """What a rule needs of the virtual clock (a rule's `clock_need`, read by the compatibility
    matrix, settings/compatibility.py): `kind` "" (nothing), "clock" (the clock on: modelled
    client times) or "deadline" (modelled devices and a round deadline, synchronous rounds);
    `why`, what the rule does with it; `otherwise`, a setting that runs it without (or "")."""

    kind: str = ""
    why: str = ""
    otherwise: str = ""


@dataclass
class OortSettings:
    """Oort (Lai et al., OSDI 2021, Sec. 4 and Alg. 1); defaults are FedScale's (its
    `thirdparty/oort` selector and the arguments its runs use)."""

    exploration: float = number(0.9, "[0, 1]")
    """epsilon: the share of a round's clients drawn among those never heard from (exploration);
    multiplied by `exploration_decay` before every round."""
    exploration_decay: float = number(0.98, "(0, 1]")
    exploration_min: float = number(0.3, "[0, 1]")
    """epsilon never decays below this."""
    round_threshold: float = number(30.0, "(0, 100]")
    """The preferred round duration T is this percentile of the clients' modelled durations; the
    pacer moves it by `pacer_delta`. 100: T is infinite (no system penalty)."""
    round_penalty: float = number(2.0, ">= 0")
    """alpha: a client slower than T has its utility multiplied by (T / t_i)^alpha. 0: statistical
    utility alone (then no device trace is needed)."""
    pacer_step: int = number(20, ">= 1")
    """W: every W rounds the exploited utility of the last W rounds is compared with the W before;
    within 10 % of it (stalled) T's percentile rises by `pacer_delta`, 5 x beyond it falls."""
    pacer_delta: float = number(5.0, "> 0")
    clip_bound: float = number(0.9, "(0, 1]")
    """Statistical utilities are clipped at this quantile of the explored clients' before they are
    normalised (robustness to outliers)."""
    cut_off: float = number(0.95, "(0, 1]")
    """c: exploitation draws, with probability proportional to utility, among the clients whose
    utility is at least c x the K-th highest (Alg. 1, line 11: c = 95 %)."""
    sample_window: float = number(5.0, ">= 1")
    """Exploration draws among the sample_window x (slots to explore) never-heard-from clients of
    the largest data x system penalty, with probability proportional to it."""
    blacklist_rounds: int = number(-1, ">= -1")
    """A client that has reported more than this many times is left out (FedScale's blacklist);
    -1 (FedScale's default): no blacklist."""
    blacklist_max_len: float = number(0.3, "[0, 1]")
    """At most this share of the clients is blacklisted at once (the most-selected first)."""


@dataclass
class PowerOfChoiceSettings:
    """Power-of-choice (Cho, Wang and Joshi 2020, "Client Selection in Federated Learning:
    Convergence Analysis and Power-of-Choice Selection Strategies"), its rpow-d variant."""

    candidates: int = number(0, ">= 0")
    """d: candidates drawn without replacement with probability n_k / n; the round takes the ones
    of highest last reported loss. 0: 2 x the round's size."""


@dataclass
class FedCSSettings:
    """FedCS (Nishio and Yonetani, ICC 2019, Alg. 2)."""

    channel: str = choice("shared", ("shared", "parallel"))
    """How FedCS predicts a round's time: shared (the paper: uploads take turns on one channel,
    client j's upload starting when both its update and the previous upload are done) or parallel
    (fedac's clock: every client uploads on its own link)."""


#: The selection registry (fedac/registry.py): built-ins here, plug-ins from the
#: `fedac.selection` entry points.
_S = "fedac.engine.clock.selection"
SELECTORS = Registry(
    "selector",
    {
        "random": Entry(
            f"{_S}:RandomSelection",
            "uniform without replacement among the clients online (the default)",
        ),
        "oort": Entry(
            f"{_S}:Oort",
            "Oort: statistical x system utility, staleness bonus, decaying exploration and a "
            "pacer (Lai et al. 2021)",
            OortSettings,
        ),
        "poc": Entry(
            f"{_S}:PowerOfChoice",
            "power-of-choice: d candidates by data size, the K of highest last loss (Cho et al. "
            "2020)",
            PowerOfChoiceSettings,
        ),
        "fedcs": Entry(
            f"{_S}:FedCS",
            "FedCS: greedily the clients whose predicted time fits the deadline (Nishio and "
            "Yonetani 2019)",
            FedCSSettings,
        ),
    },
    setting="selection.method",
)

#: Each built-in rule's settings class (the fields `not_read` flags when another rule is chosen).
RULE_SETTINGS = {"oort": OortSettings, "poc": PowerOfChoiceSettings, "fedcs": FedCSSettings}


def not_read(method: str) -> dict[str, str]:
    """The `selection` settings rule `method` does not read ("selection.<name>" -> why), as
    config.yaml notes them."""
    return {
        f"selection.{f}": f"not read under selection.method={method}; read by {rule}"
        for rule, cls in RULE_SETTINGS.items()
        if rule != method
        for f in (field.name for field in fields(cls))
    }
