"""The federation's timing: who trains in a round, from which model version, when their updates
arrive, and what the virtual clock charges for it (docs/system.md).

What belongs here: the schedule interface (`schedule.py`: `RoundSchedule`, `RoundPlan`,
`IdealSchedule`), its clock modes (`sync.py`, `asynchronous.py`: FedBuff / FedAsync with their
difference and re-base), the devices and availability as time (`virtual.py`: `SystemClock`), the
clock's arithmetic (`model.py`), its typed part of the run state (`book.py`: `SystemBook`, `Job`,
`ClientLedger`), the one client draw (`cohort.py`) and the selection rules it calls
(`selection.py`: random, oort, poc, fedcs), the FLOP count that sets a device's speed
(`flops.py`), what the clock refuses (`refusals.py`) and the choice of a run's schedule
(`start.py`). `system.mode` is read in this package only.

What must not: training (the driver trains a plan's clients through its execution plan), the server
step (engine/server_step.py), evaluation, reading trace files (data/traces.py), a method's
equations. A driver asks its schedule for a round's plan, trains it, and hands the results back.

Nothing is imported here: import the module you need (engine/state.py imports `book` alone).
"""
