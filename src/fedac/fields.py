"""A numeric setting and its valid values: `number(default, "range")` declares a dataclass field
whose range `config.check_ranges` enforces once every layer of a config is applied. The lowest core
module: the settings of the algorithms (`fedac.settings`), of plug-ins and of `config` itself
declare their numbers with it, so none of them needs `config` to do so. Nothing else belongs here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Range:
    """The valid values of a numeric setting: finite numbers between optional bounds, each end
    closed or open."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    @classmethod
    def parse(cls, text: str) -> Range:
        """`>= 1`, `> 0`, an interval such as `[0, 1)` or `(0, 1]`, or `finite` (any finite
        number)."""
        text = text.strip()
        if text == "finite":
            return cls()
        for op in (">=", ">"):
            if text.startswith(op):
                return cls(low=float(text[len(op) :]), low_open=op == ">")
        if text[:1] in "[(" and text[-1:] in "])" and text.count(",") == 1:
            low, high = (float(v) for v in text[1:-1].split(","))
            return cls(low, high, text[0] == "(", text[-1] == ")")
        raise ValueError(
            f"unknown range {text!r}: use '>= x', '> x', '[a, b]' (either end open) or 'finite'"
        )

    def __contains__(self, value: float) -> bool:
        # NaN would pass every comparison below; inf is meaningful nowhere
        if not math.isfinite(value):
            return False
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return self.high is None or value < self.high or (not self.high_open and value == self.high)

    def __str__(self) -> str:
        if self.low is None:
            return "a finite number"
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        return (
            f"in {'(' if self.low_open else '['}{self.low:g}, "
            f"{self.high:g}{')' if self.high_open else ']'}"
        )


def number(default: Any, valid: str) -> Any:
    """A numeric setting (int or float, a list of them, or None where None means unset) and its
    valid values, checked by `check_ranges` once every layer of a config is applied. Special values
    a docstring gives (e.g. 0 = "the scenario's") lie inside the range."""
    meta = {"valid": Range.parse(valid)}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)
