"""What the virtual clock refuses once the data is known. Every refusal that the settings alone
decide (system.* under Flower, partial work a method cannot train, an async mode with a method that
uploads no model, with sync-only settings or with compression) is a rule of the compatibility
matrix (settings/compatibility.py), checked before any data is built; only the buffer's size
against the clients that can ever be online needs the run's trace, so it is checked here."""

from __future__ import annotations

from fedac.config import Config
from fedac.engine.clock.schedule import RoundSchedule
from fedac.errors import ConfigError


def refuse_unreachable_buffer(cfg: Config, mode: type[RoundSchedule], reachable: int) -> None:
    """ConfigError when an async `mode` (a `RoundSchedule` class) needs more arrivals on one model
    version than the `reachable` clients (those the availability trace ever puts online)."""
    system = cfg.system
    if mode.asynchronous and mode.needed(system) > reachable:
        raise ConfigError(
            f"system.buffer={system.buffer} needs that many clients to deliver on one model, "
            f"but only {reachable} can ever be online; lower system.buffer"
        )
