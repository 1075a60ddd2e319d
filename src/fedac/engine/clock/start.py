"""The run's schedule, chosen once: the ideal federation when the run models no devices or time,
else the registered clock mode `system.mode` (settings/clock.py `CLOCK_MODES`) on a `SystemClock`,
after `refuse_unsupported_clock`; either draws its clients by the selection rule
`selection.method` (selection.py, built by the schedule)."""

from __future__ import annotations

from collections.abc import Callable

from fedac.config import Config, SystemConfig
from fedac.engine.clock.refusals import refuse_unsupported_clock, refuse_unsupported_selection
from fedac.engine.clock.schedule import IdealSchedule, RoundSchedule, ScheduleContext
from fedac.engine.clock.virtual import SystemClock
from fedac.rules.compression import Compressor
from fedac.settings.clock import CLOCK_MODES


def clock_active(system: SystemConfig) -> bool:
    """Whether the run models devices and time at all (off: the ideal federation, bit for bit the
    numbers of a run without the clock)."""
    return (
        system.devices != "none"
        or system.availability != "always"
        or system.deadline > 0
        or system.overcommit > 1
        or system.dropout > 0
        or system.mode != "sync"
    )


def start_schedule(
    cfg: Config,
    sizes: dict[str, int],
    cohort: int,
    *,
    compression: Compressor | None,
    architecture: Callable[[str], str],
    flops: Callable[[str], float],
    uploads_model: bool,
    partial_work: str | None,
    virtual_time: bool = True,
) -> RoundSchedule:
    """The schedule of a run over the trainable clients `sizes` (name -> n_k) with cohort size
    `cohort`. `architecture` / `flops`: a client's model and its training FLOPs per sample (the
    devices' speed); `uploads_model`: the method uploads a model of its broadcast's form;
    `partial_work`: why the method cannot train partial work (None: it can); `virtual_time`: false
    where rounds run on real time (Flower)."""
    refuse_unsupported_selection(cfg, virtual_time=virtual_time)
    if not clock_active(cfg.system):
        return IdealSchedule(ScheduleContext(cfg, sizes, cohort))
    mode = CLOCK_MODES.load(cfg.system.mode)
    clock = SystemClock(cfg, sizes, architecture, flops)
    refuse_unsupported_clock(
        cfg,
        mode,
        clock.reachable,
        virtual_time=virtual_time,
        uploads_model=uploads_model,
        partial_work=partial_work,
        compressed=compression is not None,
    )
    return mode(ScheduleContext(cfg, sizes, cohort, compression, clock))
