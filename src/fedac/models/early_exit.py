"""Multi-exit SSL model for early-exit fine-tuning: one SSL encoder, an independent head at each
exit layer, so that a client with little memory or compute can train and run a shallower model.

`MultiExitSSL` is an `SSLModel` whose single head is replaced by one per exit (`exit_heads.<L>`,
each with its own BiLSTM on CTC tasks, or its own pooled-vector norm with `model.head_norm`).
`use_exit(L)` selects the exit every SSLModel method then runs: the encoder stops after
`encoder.layers[:L]` (deeper layers are never computed) and the head at L scores it. The selected
head is bound as a plain attribute (not a registered submodule), so the state dict holds each head
once, under `exit_heads`.

`shared_pass()` lets one batch be scored at every exit for the cost of one encoder pass (evaluation:
`training.evaluate.evaluate_exits`): within it, the exits of a batch visited shallow to deep
continue the encoder where the previous exit stopped.

Evaluation remembers more (`EncoderMemo`): in eval mode without autograd (every scoring of a model,
`torch.no_grad`), the encoder's output at each exit of the batches last scored is kept, up to
MEMO_BYTES, and a batch scored again by the same weights at any exit (a client's held-out clips
scored at the headline exit and then at every exit for clients.csv, the test split scored for its
metrics, FA / FR and the confusion matrix) reuses it instead of running the encoder again. A batch
is "the same" when its tensors are the same memory (storage, offset, shape, strides) unmodified
(torch's version counter), the memo holding a reference so that memory cannot be reused by another
tensor; the weights likewise (every parameter and buffer below the heads, by storage and version:
loading a state dict or an optimizer step changes them). The heads are not remembered: they run on
every call. `train()` forgets everything.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from contextlib import contextmanager

import torch
from torch import nn

from fedac.errors import ConfigError
from fedac.models.ssl import EncoderRun, SSLModel, adapted_encoder

BASE_LAYERS = 12  # the depth scale of exits in the config (wav2vec 2.0 Base)
#: The most bytes of encoder outputs an evaluating MultiExitSSL keeps (`EncoderMemo`): the default
#: run's test split or every client's held-out clips at four exits of w2v2_s take about 100 MB.
MEMO_BYTES = 256 * 2**20


def scale_depth(depth: int, layers: int) -> int:
    """A depth on the 12-layer scale mapped to an encoder of `layers` layers (at least 1)."""
    return max(1, min(layers, round(depth * layers / BASE_LAYERS)))


def scaled_exits(exits: list[int], layers: int) -> list[int]:
    if not exits or any(not 1 <= e <= BASE_LAYERS for e in exits):
        raise ConfigError(
            f"earlyexit.exits={exits} must be layers in 1..{BASE_LAYERS} (the 12-layer scale)"
        )
    return sorted({scale_depth(e, layers) for e in exits})


def _tensor_key(tensor: torch.Tensor) -> tuple:
    """Which memory `tensor` is, and how often it was written in place (module docstring)."""
    return (
        tensor.untyped_storage().data_ptr(),
        tensor.storage_offset(),
        tuple(tensor.shape),
        tensor.stride(),
        tensor.dtype,
        tensor.device,
        tensor._version,
    )


class _Run:
    """One batch's encoder run, with its output at each exit it passed."""

    def __init__(self, inputs: tuple[torch.Tensor, ...], run: EncoderRun):
        self.inputs, self.run = inputs, run  # (inputs: held so that their memory stays theirs)
        self.outputs: dict[int, torch.Tensor] = {}
        self.nbytes = self._count()

    def at(self, depth: int, exits: list[int]) -> torch.Tensor | None:
        """The output at `depth`, continuing the run (and keeping every exit it passes); None for a
        depth the run passed without keeping."""
        if depth not in self.outputs:
            if depth < self.run.depth:
                return None
            for exit_depth in exits:
                if self.run.depth < exit_depth < depth:
                    self.outputs[exit_depth] = self.run.to(exit_depth)
            self.outputs[depth] = self.run.to(depth)
            self.nbytes = self._count()
        return self.outputs[depth]

    def _count(self) -> int:
        """Bytes of the kept outputs and the run's state (each storage once)."""
        tensors = {
            t.untyped_storage().data_ptr(): t for t in (*self.outputs.values(), self.run.hidden)
        }
        return sum(t.numel() * t.element_size() for t in tensors.values())


class EncoderMemo:
    """The encoder runs of the batches an evaluating model scored last, least recently used first,
    for one set of weights (see the module docstring). `limit`: bytes kept beyond the latest run;
    0 remembers nothing (every call runs the encoder from the start)."""

    def __init__(self, limit: int = MEMO_BYTES):
        self.limit = limit
        self.weights: tuple = ()
        self._held: list[torch.Tensor] = []  # the weights the key names, so their memory stays
        self.runs: OrderedDict[tuple, _Run] = OrderedDict()

    def run(self, model: MultiExitSSL, x) -> _Run | None:
        """The remembered run of batch `x` under `model`'s current weights, a new one when there is
        none; None when `x` cannot be keyed (an inference-mode tensor keeps no version)."""
        tensors = [x.values, x.lengths]
        below = [*model.projection.parameters(), *model.projection.buffers()]
        below += [*model.encoder.parameters(), *model.encoder.buffers()]
        if model.cnn is not None:
            below += [*model.cnn.parameters(), *model.cnn.buffers()]
        try:
            key = tuple(_tensor_key(t) for t in tensors)
            weights = tuple((t.data_ptr(), t._version) for t in below)
        except RuntimeError:
            return None
        if weights != self.weights:
            self.forget()
            self.weights, self._held = weights, [t.detach() for t in below]
        if key in self.runs:
            self.runs.move_to_end(key)
        else:
            self.runs[key] = _Run(tuple(tensors), EncoderRun(model.encoder, *model.frames(x)))
        return self.runs[key]

    def trim(self) -> None:
        """Forget the least recently used runs beyond `limit` bytes (never the latest)."""
        while len(self.runs) > 1 and sum(r.nbytes for r in self.runs.values()) > self.limit:
            self.runs.popitem(last=False)

    def forget(self) -> None:
        self.runs.clear()
        self.weights, self._held = (), []


class MultiExitSSL(SSLModel):
    def __init__(
        self,
        backbone: nn.Module,
        kind: str,
        num_classes: int,
        exits: list[int],
        freeze_cnn: bool = True,
        ctc_hidden: int = 0,
        head_norm: bool = False,
    ):
        super().__init__(backbone, kind, num_classes, freeze_cnn, 0, ctc_hidden, head_norm)
        parts = ("lstm", "head") if kind == "ctc" else ("norm", "head")
        template = nn.ModuleDict({part: getattr(self, part) for part in parts})
        for part in parts:
            delattr(self, part)
        self.exits = list(exits)
        self._sharing = False
        self.memo = EncoderMemo()
        self.exit_heads = nn.ModuleDict()
        for i, depth in enumerate(self.exits):
            head = template if i == 0 else copy.deepcopy(template)
            if i:  # independent initial weights, drawn from the current RNG like the first head's
                for module in head.modules():
                    reset = getattr(module, "reset_parameters", None)
                    if callable(reset):
                        reset()
            self.exit_heads[str(depth)] = head
        self.use_exit(self.exits[-1])

    def use_exit(self, depth: int) -> MultiExitSSL:
        if depth not in self.exits:
            raise ConfigError(f"exit {depth} is not one of this model's exits {self.exits}")
        self.depth = depth
        heads = self.exit_heads[str(depth)]
        assert isinstance(heads, nn.ModuleDict)  # each exit's parts, as __init__ stores them
        for part, module in heads.items():
            # bound, not registered (see the module docstring)
            object.__setattr__(self, part, module)
        return self

    @contextmanager
    def shared_pass(self):
        """Within: `hidden(x)` of a batch already seen continues its encoder run instead of
        starting again, as evaluation always does (see the module docstring), autograd or not."""
        self._sharing = True
        try:
            yield self
        finally:
            self._sharing = False

    def train(self, mode: bool = True) -> MultiExitSSL:
        if mode:
            self.memo.forget()
        return super().train(mode)

    def hidden(self, x, depth: int | None = None):
        depth = depth or self.depth
        remembers = self.memo.limit > 0 and (
            self._sharing or not (self.training or torch.is_grad_enabled())
        )
        run = self.memo.run(self, x) if remembers else None
        out = run.at(depth, self.exits) if run is not None else None
        if run is None or out is None:
            return super().hidden(x, depth)
        self.memo.trim()
        return out, run.run.mask


def build_multi_exit(
    name: str, kind: str, num_classes: int, exits: list[int], options, dropout: float
) -> MultiExitSSL:
    """The named size or `options.encoder_path` checkpoint, with `options.peft`'s adapters, and
    heads at `exits` (12-layer scale)."""
    backbone = adapted_encoder(name, options.encoder_path, dropout, options, options.freeze_cnn)
    layers = len(backbone.encoder.layers)
    return MultiExitSSL(
        backbone,
        kind,
        num_classes,
        scaled_exits(exits, layers),
        options.freeze_cnn,
        options.ctc_hidden,
        options.head_norm,
    )
