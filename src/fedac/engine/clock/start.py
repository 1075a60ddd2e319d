"""The run's schedule, chosen once: the ideal federation when the run models no devices or time,
else the registered clock mode `system.mode` (settings/clock.py `CLOCK_MODES`) on a `SystemClock`,
after `refuse_unreachable_buffer`."""

from __future__ import annotations

from collections.abc import Callable

from fedac.config import Config
from fedac.engine.clock.refusals import refuse_unreachable_buffer
from fedac.engine.clock.schedule import IdealSchedule, RoundSchedule, ScheduleContext
from fedac.engine.clock.virtual import SystemClock
from fedac.rules.compression import Compressor
from fedac.settings.clock import CLOCK_MODES, clock_active


def start_schedule(
    cfg: Config,
    sizes: dict[str, int],
    cohort: int,
    *,
    compression: Compressor | None,
    architecture: Callable[[str], str],
    flops: Callable[[str], float],
) -> RoundSchedule:
    """The schedule of a run over the trainable clients `sizes` (name -> n_k) with cohort size
    `cohort`. `architecture` / `flops`: a client's model and its training FLOPs per sample (the
    devices' speed). What the clock cannot combine with the run's other parts was refused before
    any data was built (settings/compatibility.py)."""
    if not clock_active(cfg.system):
        return IdealSchedule(ScheduleContext(cfg, sizes, cohort))
    mode = CLOCK_MODES.load(cfg.system.mode)
    clock = SystemClock(cfg, sizes, architecture, flops)
    refuse_unreachable_buffer(cfg, mode, clock.reachable)
    return mode(ScheduleContext(cfg, sizes, cohort, compression, clock))
