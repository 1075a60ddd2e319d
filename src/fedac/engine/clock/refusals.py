"""What the virtual clock and client selection refuse to combine, in one place, each with its reason
and the fix."""

from __future__ import annotations

from fedac.config import Config
from fedac.engine.clock.schedule import RoundSchedule
from fedac.errors import ConfigError


def refuse_unsupported_clock(
    cfg: Config,
    mode: type[RoundSchedule],
    reachable: int,
    *,
    virtual_time: bool,
    uploads_model: bool,
    partial_work: str | None,
    compressed: bool,
) -> None:
    """ConfigError for a clock the run cannot have: `system.*` on a server whose rounds run on real
    time (`virtual_time` false: Flower), partial work the method cannot train (`partial_work`: the
    method's reason), and for an async `mode` (a `RoundSchedule` class): a method whose upload is
    no model of its broadcast's form (`uploads_model`), the sync-only settings, a buffer larger
    than the `reachable` clients, and compression."""
    system = cfg.system
    if not virtual_time:
        raise ConfigError(
            "system.* models devices and time in the simulator; a Flower deployment runs on "
            "its nodes' real clocks (leave system.* at its defaults)"
        )
    if system.partial and partial_work is not None:
        raise ConfigError(f"system.partial=true: {partial_work}; set system.partial=false")
    if not mode.asynchronous:
        return
    if not uploads_model:
        raise ConfigError(
            f"system.mode={system.mode} re-bases each update onto the current model, and "
            f"{cfg.algorithm} does not upload a model of its broadcast's form; use "
            "system.mode=sync, or a method of the FedAvg family, fedmlac, fedper or lgfedavg"
        )
    if system.deadline > 0 or system.overcommit > 1 or system.partial:
        raise ConfigError(
            f"system.deadline, system.overcommit and system.partial shape sync rounds; "
            f"system.mode={system.mode} has none (leave them at 0, 1 and false)"
        )
    if mode.needed(system) > reachable:
        raise ConfigError(
            f"system.buffer={system.buffer} needs that many clients to deliver on one model, "
            f"but only {reachable} can ever be online; lower system.buffer"
        )
    if compressed:
        raise ConfigError(
            f"system.mode={system.mode} with compression.method="
            f"{cfg.compression.method}: the async modes re-base each update by its "
            "staleness before the server step, where compression (and its error feedback) "
            "acts; they are not combined yet: use system.mode=sync, or no compression"
        )


def refuse_unsupported_selection(cfg: Config, *, virtual_time: bool) -> None:
    """ConfigError for a selection rule other than the uniform draw on a server whose rounds run on
    real time (`virtual_time` false: Flower, whose strategy samples uniformly). A rule's own
    refusals (FedCS without a deadline, ...) are its `Selection.check`."""
    if not virtual_time and cfg.selection.method != "random":
        raise ConfigError(
            f"selection.method={cfg.selection.method} chooses clients in the simulator; a "
            "Flower deployment samples uniformly (leave selection.method=random)"
        )
