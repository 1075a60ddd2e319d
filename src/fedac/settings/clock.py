"""The virtual clock's registered parts (docs/system.md): its modes (`system.mode`) and its
availability models (`system.availability`), torch-free so a name is checked when the config loads.

A clock mode is a `RoundSchedule` subclass (fedac/engine/clock/schedule.py) built as
`cls(context)`; an availability model is a function `(clients, seed) -> {client: Schedule}`
(fedac/data/traces.py `Schedule`: a client's online intervals, optionally repeating). Plug-ins add
either through the entry-point groups `fedac.clock_modes` and `fedac.availability`
(docs/extending.md). A `system.availability` that names no model is read as a trace file's path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedac.registry import Entry, Registry

_C, _T = "fedac.engine.clock", "fedac.data.traces"


@dataclass(frozen=True)
class ClockModeSpec(Entry):
    """A registered clock mode and what it declares before torch loads (the compatibility matrix,
    settings/compatibility.py, reads it)."""

    asynchronous: bool = False
    """Its rounds are model versions and every upload is re-based onto the newest model (so the
    upload must be a model)."""


#: `system.mode`: how the federation's rounds are timed on the virtual clock.
CLOCK_MODES = Registry(
    "clock_mode",
    {
        "sync": ClockModeSpec(
            f"{_C}.sync:SyncSchedule",
            "rounds: a deadline, over-commitment, dropout and partial work",
        ),
        "fedbuff": ClockModeSpec(
            f"{_C}.asynchronous:FedBuff",
            "FedBuff (Nguyen et al. 2022): concurrent clients, every system.buffer arrivals "
            "applied at once, staleness-weighted",
            asynchronous=True,
        ),
        "fedasync": ClockModeSpec(
            f"{_C}.asynchronous:FedAsync",
            "FedAsync (Xie et al. 2019): every arrival mixed in at once with alpha x its staleness "
            "weight",
            asynchronous=True,
        ),
    },
    setting="system.mode",
)

#: `system.availability`: when each client's device is online (else the path of a trace file).
AVAILABILITY = Registry(
    "availability",
    {
        "always": Entry(f"{_T}:always_online", "every client online at every instant"),
        "synthetic": Entry(
            f"{_T}:synthetic_availability",
            "a seeded daily online window of 8-20 h per client (docs/traces.md)",
        ),
    },
    setting="system.availability",
)


def clock_active(system: Any) -> bool:
    """Whether a run's `system` settings (config.py `SystemConfig`) model devices and time at all
    (off: the ideal federation, bit for bit the numbers of a run without the clock)."""
    return bool(
        system.devices != "none"
        or system.availability != "always"
        or system.deadline > 0
        or system.overcommit > 1
        or system.dropout > 0
        or system.mode != "sync"
    )
