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
"""

from __future__ import annotations

import copy
from contextlib import contextmanager

from torch import nn

from fedac.errors import ConfigError
from fedac.models.ssl import EncoderRun, SSLModel, adapted_encoder

BASE_LAYERS = 12  # the depth scale of exits in the config (wav2vec 2.0 Base)


def scale_depth(depth: int, layers: int) -> int:
    """A depth on the 12-layer scale mapped to an encoder of `layers` layers (at least 1)."""
    return max(1, min(layers, round(depth * layers / BASE_LAYERS)))


def scaled_exits(exits: list[int], layers: int) -> list[int]:
    if not exits or any(not 1 <= e <= BASE_LAYERS for e in exits):
        raise ConfigError(
            f"earlyexit.exits={exits} must be layers in 1..{BASE_LAYERS} (the 12-layer scale)"
        )
    return sorted({scale_depth(e, layers) for e in exits})


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
        self._run: tuple | None = None  # (batch, its EncoderRun) inside shared_pass(); None outside
        self._sharing = False
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
        """Within: `hidden(x)` of the batch last seen continues its encoder run instead of starting
        again (a new batch, or a shallower exit than the run reached, starts a fresh run)."""
        self._sharing = True
        try:
            yield self
        finally:
            self._sharing, self._run = False, None

    def hidden(self, x, depth: int | None = None):
        if not self._sharing:
            return super().hidden(x, depth)
        depth = depth or self.depth
        if self._run is None or self._run[0] is not x or self._run[1].depth > depth:
            self._run = (x, EncoderRun(self.encoder, *self.frames(x)))
        run = self._run[1]
        return run.to(depth), run.mask


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
