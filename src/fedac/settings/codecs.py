"""The compression codec registry (`compression.method`): each codec's name -> a `CodecSpec`, its
"module:Class" (imported when a run compresses) and the capabilities the compatibility matrix
(settings/compatibility.py) and the error-feedback default read before torch loads.

Core layer: no torch here. The codecs themselves live in rules/compression.py (a `Codec` subclass
each: its message, decode, wire bytes and packing); plug-ins add codecs through the `fedac.codecs`
entry-point group (docs/extending.md, "A compression method").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedac.registry import Registry, resolve


@dataclass(frozen=True)
class CodecSpec:
    """A registered codec: its class and what it declares about itself."""

    target: str
    """"module:Class" of the `fedac.rules.compression.Codec` subclass (imported on first use)."""
    description: str
    """One line for `fedac list`."""
    sparse: bool = False
    """It sends a subset of the update's entries (k (index, value) pairs): sparsifying a model
    would zero most of its weights, so it cannot compress the broadcast; SecAgg+'s masked sum
    cannot add updates of different supports."""
    quantised: bool = False
    """It sends every entry at a lower precision. Rounding can lengthen an update past a clip
    norm (dp.mode=client) and, unlike sparsifying, it can compress the broadcast model itself."""
    unbiased: bool = False
    """E[C(x)] = x: runs without error feedback (`compression.error_feedback` defaults to off and
    true is refused)."""
    needs_residual: bool = True
    """Biased: error feedback is on by default (the residual brings back what was left out)."""
    off: bool = False
    """The identity (`none`): nothing is compressed."""
    reads: tuple[str, ...] = ()
    """The `compression.*` settings besides `method` that shape its message (the run's first line
    names them with their values)."""

    def load(self) -> Any:
        return resolve(self.target)


_C = "fedac.rules.compression"

#: The codec registry (fedac/registry.py): built-ins here, plug-ins from the `fedac.codecs`
#: entry points. `compression.method`'s choices.
CODECS = Registry(
    "codec",
    {
        "none": CodecSpec(
            f"{_C}:Dense", "no compression: the dense upload", needs_residual=False, off=True
        ),
        "topk": CodecSpec(
            f"{_C}:TopK",
            "the k = ceil(ratio d) largest-magnitude entries as (index, value) pairs (Stich et "
            "al. 2018)",
            sparse=True,
            reads=("ratio",),
        ),
        "randk": CodecSpec(
            f"{_C}:RandK",
            "k uniformly drawn entries, seeded by (seed, round, client), values unscaled",
            sparse=True,
            reads=("ratio",),
        ),
        "qsgd": CodecSpec(
            f"{_C}:QSGD",
            "per tensor a norm and each entry's sign and stochastic level (Alistarh et al. 2017), "
            "unbiased",
            quantised=True,
            unbiased=True,
            needs_residual=False,
            reads=("levels",),
        ),
        "int8": CodecSpec(
            f"{_C}:Int8",
            "per tensor a scale max|v|/127 and one signed byte per entry",
            quantised=True,
        ),
        "bf16": CodecSpec(f"{_C}:BF16", "every entry as bfloat16 (2 bytes)", quantised=True),
    },
    setting="compression.method",
)


def codec_spec(name: str) -> CodecSpec:
    """The registered spec of codec `name` (ConfigError naming the registered ones)."""
    spec = CODECS[name]
    if not isinstance(spec, CodecSpec):
        raise TypeError(f"codec {name!r} is registered as {spec!r}, not a CodecSpec")
    return spec


def error_feedback(method: str, given: bool | None) -> bool:
    """Whether compression.method=`method` keeps residuals: `given` when set, else what the codec
    declares (on for biased codecs, off for unbiased ones and for none)."""
    return codec_spec(method).needs_residual if given is None else given
