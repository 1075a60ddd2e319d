"""Which combinations of parts run: one table of rules (`RULES`), decided from what every part
declares, at start and before any data is built (docs/architecture.md, "The compatibility
matrix").

A run combines an algorithm, a compression codec (settings/codecs.py), a clock mode (`system.*`),
a client-selection rule, an aggregator, an attack, a privacy mode, the model's PEFT, an execution
path and, in a deployment, Flower's strategy and secure aggregation. Each part declares
capabilities (an algorithm whether it uploads models of its broadcast's form, why it cannot send
partial work, whether it streams fresh users; a codec whether it is sparse, quantised, unbiased; a
clock mode whether it is asynchronous; a selection rule what it needs of the clock; an attack what
it poisons). A `Rule` reads them and, where the combination cannot run, says why in one line with
the fix; `check` raises the first as a ConfigError, `refusals` lists every one
(tests/test_compatibility.py walks the whole matrix).

What is not decided here: a setting's own range (config.check_ranges); what only the data can
say (a deadline no client meets, a buffer larger than the clients ever online, a model that
cannot stack: `runtime.execution=cohort` is refused when the execution plan is made).

Core layer: nothing here imports torch. An algorithm's, an attack's and a selection rule's
capabilities are declared by their classes, read through the registries when a run starts
(`parts_of`); a codec's come from its torch-free table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fedac.errors import ConfigError
from fedac.registry import Entry
from fedac.settings.algorithms import ALGORITHMS
from fedac.settings.attacks import ATTACKS
from fedac.settings.clock import CLOCK_MODES, ClockModeSpec, clock_active
from fedac.settings.codecs import CodecSpec, codec_spec
from fedac.settings.selection import SELECTORS, ClockNeed


@dataclass(frozen=True)
class AlgorithmTraits:
    """What an algorithm class declares (algorithms/base.py `Algorithm`)."""

    name: str
    uploads_model: bool
    """Its uploads are models of its broadcast's form (`dp_compatible or sums_uploads`):
    they can be compressed."""
    rebases: bool
    """Its server step is the aggregate of its uploads and nothing else (`dp_compatible`), so an
    upload can be re-based onto a newer model (the async clock modes)."""
    personalized: bool
    """It keeps its clients' own models (evaluated as theirs)."""
    one_architecture: str | None
    """Why its clients must all train `model.name` (None: they may train a zoo's models)."""
    partial_work: str | None
    """Why its clients cannot send the steps they finished (None: they can)."""
    streaming: bool
    """It trains fresh users every round (the zero-shot driver), not a fixed partition."""

    @classmethod
    def of(cls, name: str) -> AlgorithmTraits:
        kind = ALGORITHMS.load(name)
        return cls(
            name,
            bool(kind.dp_compatible or kind.sums_uploads),
            bool(kind.dp_compatible),
            bool(kind.personalized),
            kind.one_architecture,
            kind.partial_work,
            bool(kind.streaming),
        )


def asynchronous_mode(mode: str) -> bool:
    """Whether the clock mode `mode` is asynchronous (its rounds are model versions, each upload
    re-based onto the newest model), as its `ClockModeSpec` declares; a plug-in registered with a
    plain entry point is asked through its class's `asynchronous` attribute."""
    value = CLOCK_MODES[mode]
    if isinstance(value, ClockModeSpec):
        return value.asynchronous
    cls = value.load() if isinstance(value, Entry) else value
    return bool(getattr(cls, "asynchronous", True))


#: Algorithms whose server step is a function of the cohort's n_k-weighted mean upload alone
#: (what Flower's SecAgg+ gives the server).
SECAGG_ALGORITHMS = ("fedavg", "fedprox", "fedmmd", "fedadam", "fedyogi", "fedadagrad", "fedavgm")


@dataclass(frozen=True)
class Deployment:
    """A Flower deployment's run-config (flower/settings.py `DeploymentSettings`)."""

    strategy: str = "fedac"
    data_mode: str = "full"
    secagg: bool = False

    @classmethod
    def of(cls, settings: Any) -> Deployment:
        """From a `DeploymentSettings` (or a Deployment as it is)."""
        if isinstance(settings, Deployment):
            return settings
        secagg = settings.secagg is not None and settings.secagg.enabled
        return cls(settings.strategy, settings.data_mode, secagg)


@dataclass(frozen=True)
class Parts:
    """One run's parts and what they declare."""

    cfg: Any  # fedac.config.Config (config.py imports this package)
    algorithm: AlgorithmTraits
    codec: CodecSpec
    poisons: str
    """What the attack alters: nothing, labels, audio or upload."""
    deployment: Deployment | None = None
    selection: ClockNeed = ClockNeed()
    """What the client-selection rule needs of the clock (its `clock_need`)."""

    @property
    def compressing(self) -> bool:
        return not self.codec.off

    @property
    def clock_on(self) -> bool:
        """Whether the virtual clock runs (settings/clock.py `clock_active`)."""
        return clock_active(self.cfg.system)

    @property
    def asynchronous(self) -> bool:
        return asynchronous_mode(self.cfg.system.mode)

    @property
    def where(self) -> Deployment:
        """The deployment's run-config (its defaults in the simulator)."""
        return self.deployment or Deployment()

    @property
    def secagg(self) -> bool:
        return self.deployment is not None and self.deployment.secagg


def parts_of(cfg: Any, deployment: Any = None) -> Parts:
    """`cfg`'s parts with their declared capabilities (the algorithm's and the attack's classes
    are imported here); `deployment`: a Flower deployment's settings, or None."""
    return Parts(
        cfg,
        AlgorithmTraits.of(cfg.algorithm),
        codec_spec(cfg.compression.method),
        ATTACKS.load(cfg.attack.kind).poisons,
        None if deployment is None else Deployment.of(deployment),
        selection_need(cfg),
    )


def selection_need(cfg: Any) -> ClockNeed:
    """What `selection.method`'s rule declares it needs of the clock under `cfg.selection` (a
    plug-in's class without `clock_need`: nothing)."""
    declared = getattr(SELECTORS.load(cfg.selection.method), "clock_need", None)
    return ClockNeed() if declared is None else declared(cfg.selection)


def _selection_fix(p: Parts, needed: str) -> str:
    """A refusal of the selection rule's: what it does, what to set, and its own way out."""
    need = p.selection
    otherwise = f", or {need.otherwise}" if need.otherwise else ""
    return f"selection.method={p.cfg.selection.method} {need.why}: set {needed}{otherwise}"


@dataclass(frozen=True)
class Rule:
    """One refusal: the parts it concerns, when it applies, and why (one line naming the fix)."""

    name: str
    parts: tuple[str, ...]
    applies: Callable[[Parts], bool]
    reason: Callable[[Parts], str]


# --- the settings a streaming driver has no use for ----------------------------------------------
def _streaming_ignored(p: Parts) -> list[tuple[str, Any, Any]]:
    """(setting, value, default) of every setting the zero-shot driver would silently ignore:
    users share score tables, not weights, and the scenario fixes the users and their models."""
    cfg = p.cfg
    out = [
        ("attack.kind", cfg.attack.kind, "none"),
        ("dp.mode", cfg.dp.mode, "none"),
        ("compression.method", cfg.compression.method, "none"),
        ("compression.download", cfg.compression.download, False),
        ("selection.method", cfg.selection.method, "random"),
        ("aggregation.method", cfg.aggregation.method, "mean"),
        ("data.label_error", cfg.data.label_error, 0.0),
        ("model.heterogeneous", cfg.model.heterogeneous, False),
    ]
    fresh = type(cfg.system)()
    for field in dataclasses.fields(cfg.system):
        value, default = getattr(cfg.system, field.name), getattr(fresh, field.name)
        out.append((f"system.{field.name}", value, default))
    return [(name, value, default) for name, value, default in out if value != default]


def _shown(value: Any) -> str:
    """A setting's value as it is written on the command line (true, not True)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _streaming_reason(p: Parts) -> str:
    name, value, default = _streaming_ignored(p)[0]
    return (
        f"{name}={_shown(value)} does not apply to --algorithm {p.algorithm.name} (users share "
        "score tables on D0, not weights, on no virtual clock; zeroshot.scenario fixes the users "
        f"and their models): leave it at {_shown(default)}"
    )


def _mixing() -> list[str]:
    """The registered algorithms whose clients may train different architectures."""
    return [name for name in ALGORITHMS.names() if ALGORITHMS.load(name).mixes_architectures()]


def _method(p: Parts) -> str:
    return f"compression.method={p.cfg.compression.method}"


_FLOWER_WHY = "each node sends its upload compressed, and the server sees it only after"
_SECAGG_WHY = "with run-config secagg=true the server sees only the weighted sum of the uploads"


def _deployed(p: Parts) -> bool:
    return p.deployment is not None


#: A Flower deployment's refusals (flower/): its nodes run on real clocks, compress their own
#: uploads, and under SecAgg+ the server sees only a masked weighted sum.
_FLOWER_RULES: tuple[Rule, ...] = (
    Rule(
        "flower-samples-uniformly",
        ("flower", "selection"),
        lambda p: _deployed(p) and p.cfg.selection.method != "random",
        lambda p: (
            f"selection.method={p.cfg.selection.method} chooses clients in the simulator; a "
            "Flower deployment samples uniformly (leave selection.method=random)"
        ),
    ),
    Rule(
        "flower-runs-on-real-time",
        ("flower", "clock"),
        lambda p: _deployed(p) and p.clock_on,
        lambda p: (
            "system.* models devices and time in the simulator; a Flower deployment runs on its "
            "nodes' real clocks (leave system.* at its defaults)"
        ),
    ),
    Rule(
        "flower-sends-the-broadcast-dense",
        ("flower", "codec"),
        lambda p: _deployed(p) and p.cfg.compression.download,
        lambda p: (
            "compression.download=true: the ServerApp sends the broadcast dense; set "
            "compression.download=false in a Flower deployment"
        ),
    ),
    Rule(
        "flower-compression-needs-fedac-strategy",
        ("flower", "codec"),
        lambda p: _deployed(p) and p.compressing and p.where.strategy != "fedac",
        lambda p: (
            f"{_method(p)} needs the fedac strategy (Flower's own strategies average dense "
            'arrays); set strategy="fedac" or compression.method=none'
        ),
    ),
    Rule(
        "flower-compression-before-client-clip",
        ("flower", "codec", "privacy"),
        lambda p: _deployed(p) and p.compressing and p.cfg.dp.mode == "client",
        lambda p: (
            f"dp.mode=client clips each update before it is compressed, but {_FLOWER_WHY}; use "
            "dp.mode=central or compression.method=none"
        ),
    ),
    Rule(
        "flower-compression-before-poisoning",
        ("flower", "codec", "attack"),
        lambda p: _deployed(p) and p.compressing and p.poisons == "upload",
        lambda p: (
            f"attack.kind={p.cfg.attack.kind} poisons an upload before it is compressed, but "
            f"{_FLOWER_WHY}; use a data attack or compression.method=none"
        ),
    ),
    Rule(
        "secagg-runs-fedac-strategy",
        ("flower",),
        lambda p: p.secagg and p.where.strategy != "fedac",
        lambda p: (
            f"run-config strategy={p.where.strategy} cannot run with secagg=true: secure "
            'aggregation runs fedac\'s server side; set strategy="fedac" or secagg=false'
        ),
    ),
    Rule(
        "secagg-full-data",
        ("flower",),
        lambda p: p.secagg and p.where.data_mode != "full",
        lambda p: (
            f"run-config data-mode={p.where.data_mode} is not supported with secagg=true: "
            'use data-mode="full" or secagg=false'
        ),
    ),
    Rule(
        "secagg-mean-algorithms",
        ("flower", "algorithm"),
        lambda p: p.secagg and p.algorithm.name not in SECAGG_ALGORITHMS,
        lambda p: (
            f"algorithm={p.algorithm.name} needs each client's upload on the server, but "
            f"{_SECAGG_WHY}; use one of {', '.join(SECAGG_ALGORITHMS)} or set secagg=false"
        ),
    ),
    Rule(
        "secagg-mean-aggregation",
        ("flower", "aggregator"),
        lambda p: p.secagg and p.cfg.aggregation.method != "mean",
        lambda p: (
            f"aggregation.method={p.cfg.aggregation.method} compares the clients' uploads, but "
            f"{_SECAGG_WHY}; set aggregation.method=mean or secagg=false"
        ),
    ),
    Rule(
        "secagg-n_k-weights",  # Flower's SecAgg+ mod weights each update by n_k
        ("flower", "aggregator"),
        lambda p: p.secagg and p.cfg.aggregation.weighting != "n_k",
        lambda p: (
            f"aggregation.weighting={p.cfg.aggregation.weighting}: the secure sum weights each "
            f"update by n_k, but {_SECAGG_WHY}; set aggregation.weighting=n_k or secagg=false"
        ),
    ),
    Rule(
        "secagg-no-privacy-clip",
        ("flower", "privacy"),
        lambda p: p.secagg and p.cfg.dp.mode != "none",
        lambda p: (
            f"dp.mode={p.cfg.dp.mode} clips each client's update on the server, but "
            f"{_SECAGG_WHY}; set dp.mode=none or secagg=false"
        ),
    ),
    Rule(
        "secagg-no-sparse-codec",
        ("flower", "codec"),
        lambda p: p.secagg and p.codec.sparse,
        lambda p: (
            f"{_method(p)} sends each client's own choice of entries, and masked sparse updates "
            f"do not add up under SecAgg+ ({_SECAGG_WHY}); set compression.method=none or "
            "secagg=false"
        ),
    ),
    Rule(
        "secagg-no-codec",
        ("flower", "codec"),
        lambda p: p.secagg and p.compressing,
        lambda p: (
            f"{_method(p)} encodes each update at its own scale or norm, which SecAgg+'s masked "
            f"sum cannot add ({_SECAGG_WHY}); set compression.method=none or secagg=false"
        ),
    ),
    Rule(
        "secagg-no-model-attack",
        ("flower", "attack"),
        lambda p: p.secagg and p.poisons == "upload",
        lambda p: (
            f"attack.kind={p.cfg.attack.kind} alters each upload on the server, but {_SECAGG_WHY}; "
            "use a data attack (label_flip, label_permute, backdoor), attack.kind=none or "
            "secagg=false"
        ),
    ),
)


#: Every refusal, in the order they are checked (the first that applies is the run's error).
RULES: tuple[Rule, ...] = (
    # --- a streaming algorithm (the zero-shot driver) ---------------------------------------------
    Rule(
        "streaming-ignores-weight-settings",
        ("algorithm", "attack", "privacy", "codec", "aggregator", "clock"),
        lambda p: p.algorithm.streaming and bool(_streaming_ignored(p)),
        _streaming_reason,
    ),
    # --- the clients' architectures --------------------------------------------------------------
    Rule(
        "heterogeneous-needs-own-models",
        ("algorithm", "model"),
        lambda p: p.cfg.model.heterogeneous and not p.algorithm.personalized,
        lambda p: (
            f"algorithm '{p.algorithm.name}' trains one shared model and cannot run heterogeneous "
            "clients; set model.heterogeneous=false or use one with personalized client models "
            f"({', '.join(_mixing())})"
        ),
    ),
    Rule(
        "heterogeneous-one-architecture",
        ("algorithm", "model"),
        lambda p: (
            p.cfg.model.heterogeneous
            and p.algorithm.personalized
            and p.algorithm.one_architecture is not None
        ),
        lambda p: (
            f"{p.algorithm.name} {p.algorithm.one_architecture}, so every client trains "
            "model.name's architecture: set model.heterogeneous=false"
        ),
    ),
    # --- compression ------------------------------------------------------------------------------
    Rule(
        "download-needs-a-quantiser",
        ("codec",),
        lambda p: p.cfg.compression.download and not p.codec.quantised,
        lambda p: (
            f"compression.download=true quantises the broadcast model itself, and {_method(p)} "
            "does not quantise (sparsifying a model would zero most of its weights): use qsgd, "
            "int8 or bf16, or compression.download=false"
        ),
    ),
    Rule(
        "codec-needs-model-uploads",
        ("codec", "algorithm"),
        lambda p: p.compressing and not p.algorithm.uploads_model,
        lambda p: (
            f"{_method(p)} compresses uploads that are models of the broadcast's form, and "
            f"algorithm {p.algorithm.name} uploads something else; use compression.method=none "
            "with it"
        ),
    ),
    Rule(
        "unbiased-codec-without-feedback",
        ("codec",),
        lambda p: p.compressing and p.codec.unbiased and p.cfg.compression.error_feedback is True,
        lambda p: (
            f"{_method(p)} is unbiased and runs without error feedback; set "
            "compression.error_feedback=false (or leave it unset)"
        ),
    ),
    Rule(
        "quantiser-after-client-clip",
        ("codec", "privacy"),
        lambda p: p.compressing and p.codec.quantised and p.cfg.dp.mode == "client",
        lambda p: (
            f"dp.mode=client clips each update before it is sent, and {_method(p)} can lengthen "
            "it past dp.clip; use a sparsifier (topk / randk), or dp.mode=central"
        ),
    ),
    # --- the virtual clock ------------------------------------------------------------------------
    Rule(
        "partial-work-declared-impossible",
        ("clock", "algorithm"),
        lambda p: p.clock_on and p.cfg.system.partial and p.algorithm.partial_work is not None,
        lambda p: f"system.partial=true: {p.algorithm.partial_work}; set system.partial=false",
    ),
    Rule(
        "async-needs-model-uploads",
        ("clock", "algorithm"),
        lambda p: p.asynchronous and not p.algorithm.rebases,
        lambda p: (
            f"system.mode={p.cfg.system.mode} re-bases each update onto the current model, and "
            f"{p.algorithm.name} does not upload a model of its broadcast's form; use "
            "system.mode=sync, or a method of the FedAvg family, fedmlac, fedper or lgfedavg"
        ),
    ),
    Rule(
        "async-has-no-sync-round",
        ("clock",),
        lambda p: (
            p.asynchronous
            and (p.cfg.system.deadline > 0 or p.cfg.system.overcommit > 1 or p.cfg.system.partial)
        ),
        lambda p: (
            "system.deadline, system.overcommit and system.partial shape sync rounds; "
            f"system.mode={p.cfg.system.mode} has none (leave them at 0, 1 and false)"
        ),
    ),
    Rule(
        "async-without-compression",
        ("clock", "codec"),
        lambda p: p.asynchronous and p.compressing,
        lambda p: (
            f"system.mode={p.cfg.system.mode} with {_method(p)}: the async modes re-base each "
            "update by its staleness before the server step, where compression (and its error "
            "feedback) acts; they are not combined yet: use system.mode=sync, or no compression"
        ),
    ),
    *_FLOWER_RULES,
    # --- client selection (after Flower's: a deployment refuses every rule but random) -----------
    Rule(
        "selection-needs-the-clock",
        ("selection", "clock"),
        lambda p: p.selection.kind == "clock" and not p.clock_on,
        lambda p: _selection_fix(p, "system.devices (e.g. synthetic)"),
    ),
    Rule(
        "selection-needs-a-deadline",
        ("selection", "clock"),
        lambda p: (
            p.selection.kind == "deadline"
            and (not p.clock_on or p.cfg.system.devices == "none" or p.cfg.system.deadline <= 0)
        ),
        lambda p: _selection_fix(
            p, "system.devices (e.g. synthetic) and system.deadline > 0 with system.mode=sync"
        ),
    ),
)


def refusals(parts: Parts) -> list[tuple[str, str]]:
    """(rule name, reason) of every rule that refuses `parts`, in `RULES`' order."""
    return [(rule.name, rule.reason(parts)) for rule in RULES if rule.applies(parts)]


def check(cfg: Any, deployment: Any = None) -> None:
    """ConfigError with the first reason `cfg`'s parts (in a Flower deployment: with its
    `deployment` settings) cannot run together; called when a run starts, before any data."""
    found = refusals(parts_of(cfg, deployment))
    if found:
        raise ConfigError(found[0][1])
