"""A stacked path for any nn.Module: the clients of a chunk as one computation through
`torch.func.functional_call` under `vmap`, with parameters and buffers stacked along a leading
client axis (as `models.stacked.stack_params` stacks them), plus the stacked optimizers and
per-client gradient clipping every stacked path shares.

How each client keeps the numbers it gets training alone (`training.step.train_client`):
- gradients: the forward is vmapped, the backward is autograd's on the stacked leaves (one backward
  for the chunk). `vmap(grad(...))` was measured too; autograd on the stacked leaves keeps one graph
  and lets the caller's loss mix several forwards (FedKWS-UI's two heads), so it is the one used.
- BatchNorm: each client's running statistics are its own rows of the stacked buffers, updated in
  place by the module's own batch-norm op under vmap. A step whose clients' batches differ in size
  pads the shorter ones (training/stacking.py); padding must not enter a client's batch statistics,
  so in such a step BatchNorm computes them over the client's real samples only
  (`_masked_batch_norm`, equal to the op to float rounding).
- dropout: under vmap, `randomness="different"` draws every client's mask from the one global RNG,
  so a client's masks would depend on its chunk. Instead each `nn.Dropout` is replayed: its
  per-sample shape is recorded once, and its masks are drawn outside vmap from the client's own
  generator seeded by (seed, "dropout", round, client), the seed `train_client` gives the global
  RNG, with the op `nn.Dropout` uses (`CohortChunk.dropout`). A client therefore sees the masks it
  draws alone. Random ops anywhere else raise (vmap's `randomness="error"`), so nothing random is
  drawn silently.
- `nn.GRU` has no vmap batching rule: its forward is written out as torch's GRU equations.

`StackedSGD` lives in training/stacking.py (the hand-written CRNN path uses it); `StackedAdam` here
gives torch.optim.Adam's and AdamW's update; `clip_stacked` gives `nn.utils.clip_grad_norm_` per
client.
"""

from __future__ import annotations

import copy
import math
import threading
import warnings
from abc import ABC, abstractmethod
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from fedac.config import TrainConfig
from fedac.errors import ConfigError
from fedac.training.stacking import StackedSGD, grads_of

Params = dict[str, torch.Tensor]
OPTIMIZERS = ("sgd", "adam", "adamw")
# vmap runs ops without a batching rule (CPU attention) client by client and warns on every run; the
# benchmark (benchmarks/bench_stacked_models.py) and auto's probe measure the cost instead.
warnings.filterwarnings(
    "ignore",
    message="There is a performance drop because we have not yet implemented the batching rule",
)


@dataclass
class _Replay:
    """What the replayed modules of one vmapped forward read: the dropout masks still to use (in
    forward order), each client's sample weights and whether the step pads (BatchNorm's statistics
    then mask)."""

    masks: list[torch.Tensor]
    weight: torch.Tensor | None
    padded: bool
    record: list[tuple[tuple[int, ...], float]] | None = None


_REPLAY: ContextVar[_Replay | None] = ContextVar("fedac_stacked_replay", default=None)


def _dropout_forward(module: nn.Dropout, x: torch.Tensor) -> torch.Tensor:
    replay = _REPLAY.get()
    if replay is None:  # outside a stacked forward: nn.Dropout's own behaviour
        return F.dropout(x, module.p, module.training, module.inplace)
    if not module.training or module.p == 0:
        return x
    if replay.record is not None:  # the shape pass: a batch of 2 outside vmap
        if x.shape[0] != 2:
            raise ConfigError(
                f"the stacked path replays dropout on batch-first tensors; {type(module).__name__} "
                f"got shape {tuple(x.shape)}: set runtime.execution=sequential"
            )
        replay.record.append((tuple(x.shape[1:]), float(module.p)))
        return x
    return x * replay.masks.pop(0)


def _masked_batch_norm(module: nn.modules.batchnorm._BatchNorm, x: torch.Tensor) -> torch.Tensor:
    """Training-mode batch norm over the samples of weight > 0 only (one client, under vmap)."""
    replay = _REPLAY.get()
    if not (module.training and replay is not None and replay.padded and replay.record is None):
        return type(module).forward(module, x)
    if module.track_running_stats and module.momentum is None:
        raise ConfigError(
            "the stacked path needs BatchNorm's momentum (cumulative averages read a count per "
            "client): set runtime.execution=sequential"
        )
    assert replay.weight is not None  # `padded` replays carry the sample weights
    real = (replay.weight > 0).to(x.dtype).view(-1, *[1] * (x.dim() - 1))
    dims = [0, *range(2, x.dim())]
    count = real.sum() * math.prod(x.shape[2:])
    shape = [1, -1] + [1] * (x.dim() - 2)
    mean = (x * real).sum(dims) / count
    centred = x - mean.view(shape)
    var = (centred.pow(2) * real).sum(dims) / count
    if module.track_running_stats:
        with torch.no_grad():
            m = module.momentum  # (None refused above; tracked statistics are buffers)
            assert (
                m is not None and module.running_mean is not None and module.running_var is not None
            )
            assert module.num_batches_tracked is not None
            module.num_batches_tracked.add_(1)
            module.running_mean.mul_(1 - m).add_(mean.detach() * m)
            module.running_var.mul_(1 - m).add_(var.detach() * (count / (count - 1)) * m)
    out = centred * torch.rsqrt(var + module.eps).view(shape)
    if module.affine:
        out = out * module.weight.view(shape) + module.bias.view(shape)
    return out


def _gru_forward(module: nn.GRU, x: torch.Tensor, hx: torch.Tensor | None = None):
    """torch's GRU equations (r, z, n gates; h' = (1 - z) n + z h), layer by layer and direction by
    direction, so vmap can batch it; zero initial state only."""
    if hx is not None or module.proj_size or not module.bias:
        raise ConfigError(
            "the stacked path writes out nn.GRU with bias, no projection and a zero initial state"
        )
    if module.training and module.dropout and module.num_layers > 1:
        raise ConfigError(
            "the stacked path does not draw nn.GRU's inter-layer dropout: set "
            "runtime.execution=sequential"
        )
    seq = x if module.batch_first else x.transpose(0, 1)  # (B, T, C)
    finals = []
    for layer in range(module.num_layers):
        outs = []
        for direction in range(2 if module.bidirectional else 1):
            sfx = f"_l{layer}" + ("_reverse" if direction else "")
            w_ih, w_hh = getattr(module, "weight_ih" + sfx), getattr(module, "weight_hh" + sfx)
            b_ih, b_hh = getattr(module, "bias_ih" + sfx), getattr(module, "bias_hh" + sfx)
            gi = F.linear(seq, w_ih, b_ih)
            hidden = w_hh.shape[1]
            h = seq.new_zeros(seq.shape[0], hidden)
            steps = range(seq.shape[1] - 1, -1, -1) if direction else range(seq.shape[1])
            out: list[Any] = [None] * seq.shape[1]  # every step fills its slot
            for t in steps:
                gh = F.linear(h, w_hh, b_hh)
                i_r, i_z, i_n = gi[:, t].chunk(3, -1)
                h_r, h_z, h_n = gh.chunk(3, -1)
                r, z = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
                n = torch.tanh(i_n + r * h_n)
                h = (h - n) * z + n
                out[t] = h
            outs.append(torch.stack(out, 1))
            finals.append(h)
        seq = torch.cat(outs, -1) if len(outs) > 1 else outs[0]
    output = seq if module.batch_first else seq.transpose(0, 1)
    return output, torch.stack(finals)


def _bind(module: nn.Module, function) -> None:
    module.forward = function.__get__(module)  # an instance attribute of the template copy only


class _Calls(nn.Module):
    """functional_call only calls `forward`: this forwards a method name to the wrapped model."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.m = model

    def forward(self, method: str, *args):
        return getattr(self.m, method)(*args)


class StackedForward(ABC):
    """A model's stacked forward for a chunk's first `active` clients, one interface for its two
    forms (`StackedModule`: any nn.Module through vmap; `HandWritten`: models/stacked.py's CRNNs):
    `module(state, x, masks, weight, method)` with `state` the (active, ...) parameters and
    buffers, `x` (active, width, ...), `masks` a `CohortChunk.dropout(step)` source, `weight`
    (active, width) the per-sample weights (0 on padding), `method` the model's method to call
    (forward by default); `map` runs a function of one client's model over the chunk."""

    param_names: list[str]
    buffer_names: list[str]

    def __call__(
        self,
        state: Params,
        x: torch.Tensor,
        masks=None,
        weight: torch.Tensor | None = None,
        method: str = "forward",
        padded: bool | None = None,
    ) -> torch.Tensor:
        return self.outputs(state, x, masks, weight, method, padded)

    def map(
        self,
        fn,
        state: Params,
        x: torch.Tensor,
        masks=None,
        weight: torch.Tensor | None = None,
        *extras,
        method: str = "forward",
        padded: bool | None = None,
        teachers: dict[str, Params] | None = None,
    ):
        """vmap over the clients of `fn(forward, params, x_k, weight_k, *extras_k)`, where
        `forward(inputs, method="forward")` is client k's model (parameters and buffers bound),
        `params` its trainable parameters by name, and each of `extras` a tensor or dict of tensors
        with a leading client axis. `teachers`: frozen models by name, their entries stacked like
        `state`'s; `forward(inputs, method, teacher=name)` runs client k's in eval mode. Each form
        says what more it guarantees (`map_clients`)."""
        return self.map_clients(fn, state, x, masks, weight, extras, method, padded, teachers or {})

    @abstractmethod
    def outputs(self, state: Params, x: torch.Tensor, masks, weight, method: str, padded):
        """`module(...)`'s result: the chunk's outputs of `method`."""

    @abstractmethod
    def map_clients(
        self, fn, state: Params, x: torch.Tensor, masks, weight, extras, method, padded, teachers
    ):
        """`map` with its optional arguments resolved (`teachers` a dict)."""


class StackedModule(StackedForward):
    """The stacked forward of any nn.Module (`StackedForward`), through vmap."""

    def __init__(self, model: nn.Module):
        self.param_names = [name for name, _ in model.named_parameters()]
        self.buffer_names = [name for name, _ in model.named_buffers()]
        self._prototype = _replayable(copy.deepcopy(model).cpu())
        # functional_call swaps a module's tensors: one template per thread
        self._local = threading.local()
        self._shapes: dict[tuple, list[tuple[tuple[int, ...], float]]] = {}

    def _template(self, device: torch.device) -> _Calls:
        templates = self._local.__dict__.setdefault("templates", {})
        if device not in templates:
            templates[device] = _Calls(copy.deepcopy(self._prototype).to(device)).train()
        return templates[device]

    def _dropout_shapes(
        self, template: _Calls, method: str, x: torch.Tensor
    ) -> list[tuple[tuple[int, ...], float]]:
        key = (method, tuple(x.shape[2:]), x.dtype)
        if key not in self._shapes:
            record: list = []
            token = _REPLAY.set(_Replay([], None, False, record))
            try:
                with torch.no_grad():
                    sample = x[0, :1].expand(2, *x.shape[2:])
                    template(method, sample)
            finally:
                _REPLAY.reset(token)
            self._shapes[key] = record
        return self._shapes[key]

    def outputs(self, state, x, masks, weight, method, padded):
        return self.map(
            lambda forward, params, inputs, w: forward(inputs, method),
            state,
            x,
            masks,
            weight,
            method=method,
            padded=padded,
        )

    def map_clients(self, fn, state, x, masks, weight, extras, method, padded, teachers):
        """Dropout masks are drawn for one call of `method` per step (see the module's
        docstring); a teacher runs as a `FrozenModule`."""
        template = self._template(x.device)
        frozen = self._frozen() if teachers else None
        drawn = []
        if masks is not None and template.training:
            for shape, p in self._dropout_shapes(template, method, x):
                mask = masks(shape, p)
                drawn.append(
                    mask if mask is not None else x.new_ones(x.shape[0], x.shape[1], *shape)
                )
        if weight is None:
            weight, padded = x.new_ones(x.shape[:2]), False
        elif padded is None:
            padded = bool((weight == 0).any())
        params = {"m." + name: state[name] for name in self.param_names if name in state}
        buffers = {"m." + name: state[name] for name in self.buffer_names if name in state}

        def one(
            p: Params,
            b: Params,
            inputs: torch.Tensor,
            ms: list[torch.Tensor],
            w: torch.Tensor,
            own: dict[str, Params],
            *ex,
        ):
            token = _REPLAY.set(_Replay(list(ms), w, padded))
            try:

                def forward(data: torch.Tensor, name: str = "forward", teacher: str | None = None):
                    if teacher is not None:
                        assert frozen is not None
                        with torch.no_grad():
                            return frozen(own[teacher], data, name)
                    return functional_call(template, (p, b), (name, data), strict=False)

                return fn(forward, {name[2:]: value for name, value in p.items()}, inputs, w, *ex)
            finally:
                _REPLAY.reset(token)

        return vmap(one, in_dims=(0, 0, 0, 0, 0, 0, *_extra_dims(extras)), randomness="error")(
            params, buffers, x, drawn, weight, teachers, *extras
        )

    def _frozen(self) -> FrozenModule:
        if not hasattr(self, "_frozen_module"):
            self._frozen_module = FrozenModule(self._prototype)
        return self._frozen_module


class FrozenModule:
    """A model's forward as a frozen teacher's, for any parameters and buffers: `frozen(entries, x,
    method)` runs an eval-mode copy (no dropout, BatchNorm's running statistics, nothing updated)
    through `functional_call`, alike inside a vmapped client function and outside it (GRUs written
    out): how `StackedModule.map` runs a local objective's teachers (MOON's global and previous
    local model) under vmap."""

    def __init__(self, model: nn.Module):
        self._prototype = _Calls(_replayable(copy.deepcopy(model).cpu())).eval()
        self._local = threading.local()  # functional_call swaps a module's tensors

    def __call__(self, entries: Params, x: torch.Tensor, method: str = "forward") -> torch.Tensor:
        templates = self._local.__dict__.setdefault("templates", {})
        if x.device not in templates:
            templates[x.device] = copy.deepcopy(self._prototype).to(x.device)
        bound = {"m." + name: value for name, value in entries.items()}
        return functional_call(templates[x.device], bound, (method, x), strict=False)


def _extra_dims(extras: tuple) -> list[int | None]:
    """vmap's in_dims of a map's extras: a client axis each, none for an absent one (None: a method
    whose clients keep no state)."""
    return [None if extra is None else 0 for extra in extras]


def _replayable(model: nn.Module) -> nn.Module:
    """The model with dropout replayed, BatchNorm masked on padded steps and GRUs written out."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            _bind(module, _dropout_forward)
        elif isinstance(module, nn.modules.batchnorm._BatchNorm):
            _bind(module, _masked_batch_norm)
        elif isinstance(module, nn.GRU):
            _bind(module, _gru_forward)
        elif isinstance(module, (nn.RNNBase,)):
            raise ConfigError(
                f"the stacked path has no form of {type(module).__name__}: set "
                "runtime.execution=sequential"
            )
    return model


def unstackable_reason(model: nn.Module) -> str | None:
    """Why `model` has no generic stacked forward (None: it has one)."""
    if hasattr(model, "task_loss"):
        return "has its own task_loss (padded waveform batches)"
    for module in model.modules():
        if isinstance(module, nn.RNNBase) and not isinstance(module, nn.GRU):
            return f"holds an {type(module).__name__}, which vmap cannot batch"
        if (
            isinstance(module, nn.modules.batchnorm._BatchNorm)
            and module.track_running_stats
            and module.momentum is None
        ):
            return "holds a BatchNorm with cumulative running statistics (momentum None)"
    return None


SSL_MEASURED = (
    "measured slower vmapped on the CPU: the w2v2_s encoder took 1.10x the sequential CPU time "
    "(8 clients, 2 steps of 8 clips, one thread; benchmarks/bench_stacked_models.py --ssl)"
)
"""Why the SSL encoders keep the sequential path: their one measurement (benchmarks/results/
stacked_models.json, "ssl"); besides, their batches are padded waveforms with a loss of their
own."""


def stacked_support(name: str, model: nn.Module) -> str:
    """How zoo model `name` (built as `model`) trains on the stacked path, for `fedac models`: crnn
    (models/stacked.py's hand-written forward), kws (models/kws_stacked.py's hand-written forms,
    which `auto` times against the sequential path), vmap (this module) or "no: <reason>"."""
    from fedac.models.kws_stacked import stacked_kws
    from fedac.models.stacked import stacked_model

    if stacked_model(name, 0.0) is not None:
        return "crnn"
    if stacked_kws(model) is not None:
        return "kws"
    reason = unstackable_reason(model)
    if reason is not None and hasattr(model, "task_loss"):  # the SSL encoders
        return f"no: {SSL_MEASURED}; {reason}"
    return "vmap" if reason is None else f"no: {reason}"


# --- stacked optimizers ---------------------------------------------------------------------------
class StackedAdam:
    """torch.optim.Adam (`decoupled=False`) or AdamW (True) with torch's defaults (betas 0.9 /
    0.999, eps 1e-8, no amsgrad) on stacked parameters, new every client update as the sequential
    path's is. The active clients of a step have all taken the same number of steps (they are a
    prefix of the chunk), so one step count per parameter serves them."""

    def __init__(
        self,
        params: Params,
        cfg: TrainConfig,
        decoupled: bool,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
    ):
        self.params = params
        self.lr, self.weight_decay, self.decoupled = cfg.lr, cfg.weight_decay, decoupled
        self.betas, self.eps = betas, eps
        self.state: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.steps: dict[str, int] = {}

    def step(self, grads: dict[str, torch.Tensor | None], active: int) -> None:
        beta1, beta2 = self.betas
        with torch.no_grad():
            for name, grad in grads.items():
                if grad is None:  # torch skips a parameter without a gradient (its step count too)
                    continue
                param = self.params[name][:active]
                if name not in self.state:
                    self.state[name] = (
                        torch.zeros_like(self.params[name]),
                        torch.zeros_like(self.params[name]),
                    )
                self.steps[name] = self.steps.get(name, 0) + 1
                exp_avg, exp_avg_sq = (s[:active] for s in self.state[name])
                if self.weight_decay != 0:
                    if self.decoupled:
                        param.mul_(1 - self.lr * self.weight_decay)
                    else:
                        grad = grad.add(param, alpha=self.weight_decay)
                exp_avg.lerp_(grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                step = self.steps[name]
                step_size = self.lr / (1 - beta1**step)
                denom = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2**step)).add_(self.eps)
                param.addcdiv_(exp_avg, denom, value=-step_size)


def stacked_optimizer(params: Params, cfg: TrainConfig):
    """The stacked form of `training.local.make_optimizer(cfg)`."""
    if cfg.optimizer == "sgd":
        return StackedSGD(params, cfg)
    if cfg.optimizer in ("adam", "adamw"):
        return StackedAdam(params, cfg, decoupled=cfg.optimizer == "adamw")
    raise ConfigError(
        f"train.optimizer must be one of {', '.join(OPTIMIZERS)}, got {cfg.optimizer!r}"
    )


def clip_stacked(grads: dict[str, torch.Tensor | None], max_norm: float) -> None:
    """`nn.utils.clip_grad_norm_` for every client at once: each client's gradients (its rows)
    scaled in place to at most `max_norm` in L2 over all its parameters; 0: nothing."""
    present = [g for g in grads.values() if g is not None]
    if max_norm <= 0 or not present:
        return
    with torch.no_grad():
        norms = torch.stack([torch.linalg.vector_norm(g.flatten(1), 2, dim=1) for g in present])
        total = torch.linalg.vector_norm(norms, 2, dim=0)
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in present:
            g.mul_(coef.view(-1, *[1] * (g.dim() - 1)))


class HandWritten(StackedForward):
    """A hand-written stacked forward (models/stacked.py's CRNNs) behind `StackedForward`'s
    interface: no buffers, no other method than forward, no need of the sample weights (no batch
    statistics). `map` serves a local objective that reads its model once a step."""

    def __init__(self, model, param_names: list[str]):
        self.model, self.param_names = model, param_names
        self.buffer_names: list[str] = []

    def outputs(self, state, x, masks, weight, method, padded):
        if method != "forward":
            raise ConfigError(f"the hand-written stacked CRNN has no method {method!r}")
        return self.model(state, x, masks)

    def map_clients(self, fn, state, x, masks, weight, extras, method, padded, teachers):
        """`StackedModule.map` for a function that reads its model once, on its batch:
        `forward(x_k)` (the logits), or `forward(x_k, "embed")` and then `forward(z, "head")` of
        that embedding, and each teacher likewise (`forward(x_k, method, teacher=name)`, in eval
        mode: no dropout). The chunk's embeddings and logits are computed first, stacked (the
        teachers' without gradient), and each client's `forward` hands out its own rows; any other
        call raises."""
        embedding = self.model.embed(state, x, masks)
        logits = self.model.head(state, embedding)
        frozen = {}
        with torch.no_grad():
            for name, entries in teachers.items():
                z = self.model.embed(entries, x, None)
                frozen[name] = (z, self.model.head(entries, z))
        params = {name: state[name] for name in self.param_names}
        if weight is None:
            weight = x.new_ones(x.shape[:2])

        def one(z, out, rows, p, inputs, w, *ex):
            def forward(data: torch.Tensor, name: str = "forward", teacher: str | None = None):
                if teacher is not None and data is inputs and name in ("forward", "embed"):
                    return rows[teacher][0 if name == "embed" else 1]
                if data is inputs and name in ("forward", "embed") and teacher is None:
                    return out if name == "forward" else z
                if data is z and name in ("head", "classify"):
                    return out
                raise ConfigError(
                    f"the hand-written stacked CRNN serves forward(x) and embed(x) then head of "
                    f"that embedding, once a step; this local objective called {name!r} otherwise:"
                    " set its class's reads_model_once = False"
                )

            return fn(forward, p, inputs, w, *ex)

        return vmap(one, in_dims=(0, 0, 0, 0, 0, 0, *_extra_dims(extras)), randomness="error")(
            embedding, logits, frozen, params, x, weight, *extras
        )


def param_leaves(params: Params, active: int, names: list[str]) -> Params:
    """Gradient leaves over the first `active` clients' trainable entries `names` (views: updated in
    place)."""
    return {name: params[name][:active].detach().requires_grad_() for name in names}


def with_buffers(leaf: Params, params: Params, active: int, names: list[str]) -> Params:
    """The leaves plus the first `active` clients' buffers (views: BatchNorm updates them in
    place)."""
    return {**leaf, **{name: params[name][:active] for name in names}}


class ParameterView:
    """What a regularizer (e.g. FedProx's proximal term) sees of one client on the stacked path: its
    parameters, as `named_parameters()` / `parameters()`; it has no forward pass."""

    def __init__(self, params: Params):
        self._params = params

    def named_parameters(self):
        return iter(self._params.items())

    def parameters(self):
        return iter(self._params.values())


def client_views(params: Params, active: int) -> list[ParameterView]:
    # one backward node, not one per client
    unbound = {name: value.unbind(0) for name, value in params.items()}
    return [
        ParameterView({name: parts[k] for name, parts in unbound.items()}) for k in range(active)
    ]


def first_clients(params: Params, active: int) -> Params:
    return {name: value[:active] for name, value in params.items()}


class StackedStep:
    """One stacked model's training state in a chunk: its (clients, ...) parameters and buffers, its
    stacked optimizer (`train.optimizer`) and forward (`Algorithm.stacked_forward`)."""

    def __init__(self, forward, params: Params, cfg):
        self.forward, self.params, self.cfg = forward, params, cfg
        self.optimizer = stacked_optimizer({n: params[n] for n in forward.param_names}, cfg)

    def leaves(self, active: int) -> tuple[Params, Params]:
        """(gradient leaves, leaves + buffers) over the first `active` clients."""
        leaf = param_leaves(self.params, active, self.forward.param_names)
        return leaf, with_buffers(leaf, self.params, active, self.forward.buffer_names)

    def frozen(self, active: int) -> Params:
        """The first `active` clients' entries without autograd (a teacher's forward)."""
        return first_clients(self.params, active)

    def update(self, loss: torch.Tensor, leaf: Params, active: int) -> None:
        """Backward of the chunk's summed loss, each client's gradient clipped
        (`train.max_grad_norm`), the step."""
        grads = grads_of(loss.sum(), leaf)
        clip_stacked(grads, self.cfg.max_grad_norm)
        self.optimizer.step(grads, active)

    def client(self, k: int) -> Params:
        return {name: value[k].clone() for name, value in self.params.items()}
