"""The algorithm contract: a client side and a server side, written once, unaware of where they run.

- client: (global payload, persistent client state, client data, round, rng) -> ClientResult
- server: (global state, [(upload, n_k)], round) -> (new global state, metrics)

The simulator (engine/) and the Flower apps (flower/) only move payloads and states around.
Payloads, uploads and states are plain dicts of tensors (or None), so they serialise to any
transport.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import nn

from fedac.config import Config
from fedac.errors import ConfigError
from fedac.models import build_model
from fedac.rules.aggregation import ServerMetrics, aggregate
from fedac.seeding import derive_seed, numpy_rng
from fedac.training.evaluate import evaluate
from fedac.training.local import local_steps
from fedac.training.packing import Packing
from fedac.training.runtime import Runtime
from fedac.training.step import train_client

# The shared types live in training/; algorithms import them from here as well (a downward
# re-export).
from fedac.training.types import ClientData, ClientResult, Params, Task, clone_params, model_params  # noqa: F401

#: An algorithm's global state, its own: a dict of tensors for most (holding "params", the global
#: model), a dataclass for zero-shot. The engine stores, moves and checkpoints it, and reads it only
#: through the algorithm (`broadcast`, `global_model`, `global_params`).
ServerState = Any


def reproduces(client_update):
    """Marks a `cohort_update` as the stacked form of `client_update` (engine/execution.py
    `stacking_obstacle` checks the mark against the `client_update` in effect)."""

    def mark(cohort_update):
        cohort_update.reproduces = client_update
        return cohort_update

    return mark


class Algorithm(ABC):
    """Base class: subclasses implement `client_update` and `server_update`; defaults cover the
    rest."""

    name: str = ""
    #: True when clients own models of their own (so heterogeneous architectures are allowed).
    personalized: bool = False
    #: True when every round brings each user fresh data (engine/zeroshot.py drives it), not a fixed
    #: partition.
    streaming: bool = False
    # Capabilities the layers around an algorithm read from its class (never from a list of names):
    #: True when the new global model is the aggregate itself, so DP noise on it is DP-FedAvg
    #: (privacy.py).
    dp_compatible: bool = False
    #: The dotted setting that turns LPA on over `aggregation.method` (FedMLAC: "fedmlac.lpa"), or
    #: None; DP reads it (privacy.py: the accountant holds for the plain mean only).
    lpa_setting: str | None = None
    #: True when its uploads are Params of the broadcast's shape and `server_update` reads them only
    #: through `combine`'s weighted mean: over several processes one all-reduce of the weighted sums
    #: then replaces the gather of every upload, when the aggregation rule sums too
    #: (engine/distributed.py `sums_uploads`).
    sums_uploads: bool = False
    #: True when it trains one pooled client (engine/data.py gives it the pooled partition by
    #: default).
    centralised: bool = False
    #: False when it needs each client's windows as one fixed tensor (features.augment draws them
    #: per batch).
    augmentable: bool = True
    #: False when its model must be a feature network (FedKWS-UI wraps one's embedding in two
    #: heads): the SSL encoders' waveform path (engine/waveform.py) refuses it before any data is
    #: built. Personalized methods are refused there too (their client models read features).
    trains_ssl_encoders: bool = True
    #: Why the method has no stacked form although it inherits a `cohort_update` (a partial pFL
    #: method's optimiser that stacks no subset: algorithms/partial.py), or None:
    #: engine/execution.py `stacking_obstacle` names it as the reason.
    no_stacked_form: str | None = None
    #: Why a personalized method's clients must all train `model.name` (its own models and the
    #: shared one are combined parameter by parameter), or None: `model.heterogeneous` is then
    #: refused with this reason.
    one_architecture: str | None = None
    #: Why the method cannot stop its local update after a given number of steps (the virtual
    #: clock's `system.partial`: its batches do not come from `training.local.client_batches`);
    #: None: it can.
    partial_work: str | None = None

    @classmethod
    def mixes_architectures(cls) -> bool:
        """The second meaning `personalized` used to carry: whether clients may train different
        architectures (`model.heterogeneous`): a method that keeps own models (`personalized`: they
        are evaluated) and never combines them with the shared one parameter by parameter
        (`one_architecture` None). The compatibility matrix refuses model.heterogeneous
        otherwise."""
        return cls.personalized and cls.one_architecture is None

    def __init__(self, cfg: Config, task: Task, runtime: Runtime | None = None):
        self.cfg = cfg
        self.task = task
        #: Where and how it computes: the driver's (resolved once per run, training/runtime.py), or,
        #: built alone (tests, experiments), one resolved here from `train.*` without touching the
        #: process.
        self.runtime = runtime if runtime is not None else Runtime.resolve(cfg.runtime)
        #: Where this algorithm's models live (`runtime.device`); the client data arrives there from
        #: the engine.
        self.device = self.runtime.device
        #: Where the stacked path's chunks train (`runtime.devices`; by default `self.device`).
        self.devices = list(self.runtime.devices)
        #: How many clients a stacked chunk holds (`runtime.cohort_chunk`; on a GPU, measured per
        #: architecture, on the first of `devices`).
        self.packing = Packing(self.runtime.cohort_chunk, self.devices[0], spread=len(self.devices))
        self._scratch: dict[tuple[str, str], nn.Module] = {}
        # per architecture: its stacked kind and forward
        self._stacked: dict[tuple[str, str], Any] = {}

    # --- models -------------------------------------------------------------------------------
    def build_network(self, name: str) -> nn.Module:
        """A new model of architecture `name` as this algorithm trains it (the zoo's; FedKWS-UI
        wraps it in two heads). Called on the CPU by `make_model`."""
        return build_model(
            name,
            self.task.num_features,
            self.task.num_classes,
            self.cfg.model.dropout,
            self.task.kind,
            self.cfg.model,
        )

    def make_model(self, name: str) -> nn.Module:
        """A new model on `self.device`, its initial weights drawn on the CPU (so a GPU run starts
        from the weights a CPU run starts from, and the CPU RNG stream the seeds fix is the one
        consumed)."""
        with torch.device("cpu"):
            model = self.build_network(name)
        return model.to(self.device)

    def scratch_model(
        self, name: str, params: Params | None = None, role: str = "global"
    ) -> nn.Module:
        """A reusable model instance per (role, architecture), loaded in place (no deepcopy per
        client).

        Roles keep two models of one architecture apart (e.g. a CRNN-Lite client next to a CRNN-Lite
        Plug-in).
        """
        if (role, name) not in self._scratch:
            # Building a model draws initial weights; keep that off the global RNG, whose state the
            # engine sets per client for dropout, or a resumed run would see different dropout
            # masks.
            with torch.random.fork_rng():
                self._scratch[(role, name)] = self.make_model(name)
        model = self._scratch[(role, name)]
        if params is not None:
            model.load_state_dict(params)
        return model

    def client_architecture(self, client: str) -> str:
        """The client's own model: drawn once per client from the zoo (seeded) when
        heterogeneous."""
        if not self.cfg.model.heterogeneous:
            return self.cfg.model.client_model
        zoo = self.cfg.model.zoo
        return zoo[int(numpy_rng(self.cfg.seed, "architecture", client).integers(len(zoo)))]

    def initial_params(self, name: str, purpose: str, *ids: object) -> Params:
        """Fresh weights that depend only on (seed, purpose, ids); the global torch RNG is left as
        it was."""
        with torch.random.fork_rng():
            torch.manual_seed(derive_seed(self.cfg.seed, purpose, *ids))
            return model_params(self.make_model(name))

    # --- contract ------------------------------------------------------------------------------
    @abstractmethod
    def init_server(self) -> ServerState:
        """Initial global state (must hold 'params' of the global model)."""

    def restore_server(self, saved: Any) -> ServerState:
        """The global state from a checkpoint's `server` (what `init_server` / `server_update`
        returned, or an earlier fedac's form of it); by default as saved."""
        return saved

    def global_params(self, server: ServerState) -> Params:
        """The global model's parameters in `server` (what DP noises and Flower's built-in
        strategies replace; an algorithm whose global state keeps them elsewhere overrides both)."""
        return server["params"]

    def with_global_params(self, server: ServerState, params: Params) -> ServerState:
        """`server` with the global model's parameters replaced by `params` (a new state)."""
        return {**server, "params": params}

    def broadcast(self, server: ServerState) -> Any:
        """What every sampled client receives this round."""
        return server["params"]

    def init_client_state(self, client: str) -> Any:
        """Initial persistent client state: the client's own model for personalized methods, else
        None."""
        if not self.personalized:
            return None
        return self.initial_params(self.client_architecture(client), "client-init", client)

    @abstractmethod
    def client_update(
        self, payload: Any, state: Any, data: ClientData, round_idx: int, generator: torch.Generator
    ) -> ClientResult:
        """Train locally; `generator` orders batches (dropout uses the engine-seeded global RNG)."""

    def cohort_update(
        self, payload: Any, states: list[Any], datas: list[ClientData], round_idx: int, seed: int
    ) -> list[ClientResult]:
        """Optional hook: the updates of a whole cohort, in `datas` order, with each client's
        randomness fixed by (seed, round, client) exactly as `training.step.train_client` fixes it,
        so the results equal the sequential ones. Overrides stack clients into one computation
        (training/stacking.py) and are marked `@reproduces(client_update)`; this default trains one
        client after another."""
        return [
            train_client(self, payload, state, data, round_idx, seed)
            for state, data in zip(states, datas)
        ]

    def stacked_architectures(self) -> list[str]:
        """The architectures `cohort_update` stacks: the clients' own (personalized methods) or the
        shared model."""
        if self.personalized:
            return list(
                dict.fromkeys(
                    self.cfg.model.zoo
                    if self.cfg.model.heterogeneous
                    else [self.cfg.model.client_model]
                )
            )
        return [self.cfg.model.name]

    def stacked_kind(self, arch: str) -> str:
        """How `arch`, as this algorithm builds it, trains stacked: "crnn" (models/stacked.py's
        hand-written forward, the zoo model itself), "kws" (models/kws_stacked.py's hand-written
        forward of a KWS network, alone or in FedKWS-UI's two-head model), "vmap"
        (training/functional.py, any other nn.Module) or "none: why"."""
        if ("kind", arch) not in self._stacked:
            from fedac.models.kws_stacked import stacked_kws
            from fedac.models.stacked import stacked_model
            from fedac.training.functional import unstackable_reason

            with torch.device("cpu"), torch.random.fork_rng():
                network = self.build_network(arch)
            # the zoo model, not wrapped
            own = type(network).__module__.startswith("fedac.models.crnn")
            reason = unstackable_reason(network)
            self._stacked[("kind", arch)] = (
                "crnn"
                if own and stacked_model(arch, 0.0) is not None
                else "kws"
                if stacked_kws(network) is not None
                else "vmap"
                if reason is None
                else f"none: {reason}"
            )
        return self._stacked[("kind", arch)]

    def stacked_forward(self, arch: str):
        """The stacked forward of `arch` (`stacked_kind`): a `training.functional.StackedModule` or
        the hand-written CRNN behind its interface; one per architecture, reused every round."""
        if ("stacked", arch) not in self._stacked:
            from fedac.models.kws_stacked import stacked_kws
            from fedac.models.stacked import stacked_model
            from fedac.training.functional import HandWritten, StackedModule

            kind = self.stacked_kind(arch)
            if kind.startswith("none"):
                raise ConfigError(
                    f"model {arch} has no stacked forward ({kind[6:]}): set "
                    "runtime.execution=sequential"
                )
            model = self.scratch_model(arch)
            names = [name for name, _ in model.named_parameters()]
            self._stacked[("stacked", arch)] = (
                HandWritten(stacked_model(arch, self.cfg.model.dropout), names)
                if kind == "crnn"
                else stacked_kws(model)
                if kind == "kws"
                else StackedModule(model)
            )
        return self._stacked[("stacked", arch)]

    @abstractmethod
    def server_update(
        self, server: ServerState, uploads: list[tuple[Any, int]], round_idx: int
    ) -> tuple[ServerState, dict[str, float]]:
        """Combine the cohort's uploads (each with its n_k) into the next global state."""

    def combine(
        self, server: dict[str, Any], uploads: list[tuple[Params, int]], use_lpa: bool | None = None
    ) -> tuple[Params, ServerMetrics]:
        """`rules.aggregation.aggregate` of the uploads, with the round's global model and each
        client's local step count for the deviations that need them. The metrics carry LPA's pruning
        (`ServerMetrics.pruning`): `server_update` returns them, and the engine logs the pruning
        from there."""
        steps = [local_steps(n, self.cfg.train) for _, n in uploads]
        result = aggregate(
            uploads,
            self.cfg.aggregation,
            use_lpa,
            server.get("params"),
            steps,
            self.server_weighting(self.cfg),
        )
        return result.params, ServerMetrics(result.metrics, result.pruning)

    @classmethod
    def server_weighting(cls, cfg: Config) -> str:
        """The weighting (`aggregation.weighting`: n_k or uniform) of the means `combine` takes;
        FedKWS-UI has its own setting. A class method: tables name it without building the
        algorithm."""
        return cfg.aggregation.weighting

    # --- evaluation ----------------------------------------------------------------------------
    def global_model(self, server: ServerState) -> nn.Module | None:
        """The shared model evaluated on val/test; None when the method has no global model
        (FedKAD)."""
        return self.scratch_model(self.cfg.model.name, server["params"])

    def evaluate_views(
        self, model: nn.Module, split, batch_size: int
    ) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
        """The shared `model`'s metrics on a split, and those of its further views by tag, reported
        as val_<tag>_* / <tag>_* (the exits of early-exit models); no views by default."""
        return evaluate(model, split, batch_size), {}

    def personalized_model(self, client: str, state: Any) -> nn.Module | None:
        """The client's own model for personalized evaluation; None when clients keep no model."""
        if not self.personalized:
            return None
        return self.scratch_model(self.client_architecture(client), state, role="personal")


class OneArchitecture:
    """Mixin of a personalized method whose clients all train `model.name` (its class's
    `one_architecture` says why; `model.heterogeneous` is refused): every client's architecture,
    and the one its stacked path builds. Listed before the Algorithm it extends."""

    cfg: Config

    def client_architecture(self, client: str) -> str:
        return self.cfg.model.name

    def stacked_architectures(self) -> list[str]:
        return [self.cfg.model.name]
