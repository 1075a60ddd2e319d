"""What the round loop of engine/run.py (every driver's) holds: the progress of the rounds (with a
bar of the clients inside a slow round and a time estimate after the first one), and SIGINT /
SIGTERM that lose nothing.

Signals, while a `RoundLoop` is open in the main thread:
- the first asks the run to stop at the end of the round under way: the round finishes, a checkpoint
  of that round boundary is written (the state a `train.checkpoint_every` checkpoint holds there, so
  the resumed run stays bit-exact) and `RunInterrupted` ends the run;
- a second one during the round's computation abandons it: nothing of that round is written, and the
  last checkpoint on disk is where a resume starts. The round's writes (metrics.csv, the checkpoint)
  are never cut: a second signal then changes nothing;
- after the last round (final evaluation) every round is checkpointed, so a signal ends the run at
  once.
Python runs signal handlers in the main thread between bytecodes: the cohort's worker threads and
torch's intra-op threads never see them, and a stop request only sets a flag that the loop reads at
the round boundary. Abandoning waits for the cohort chunks already on worker threads (threads cannot
be killed); further signals meanwhile only say so, and the one-line message stays the last word. The
previous handlers come back when the loop closes.

A signal that is ignored when the loop opens stays ignored (a choice). A shell without job control
(a script's `fedac run ... &` or `nohup fedac run ... &`, `bash -c '... &'`) starts its background
jobs with SIGINT ignored so that a Ctrl-C at the terminal, which reaches the script's whole process
group, leaves them running; Python itself then installs no KeyboardInterrupt, and fedac keeps that
contract instead of turning the Ctrl-C meant for the script into a stop of every job it started.
Such a job stops just as cleanly with SIGTERM (`kill PID`: checkpoint, exit 143), which shells leave
alone; the estimate after the first round then names that instead of Ctrl-C. From an interactive
shell `nohup fedac run ... &` keeps SIGINT (nohup ignores SIGHUP only), so `kill -INT PID` stops it
too. A SIGTERM ignored by the parent stays ignored by the same rule.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fedac import progress as progress_lines
from fedac.engine.distributed import current_world
from fedac.errors import RunInterrupted
from fedac.training.stacking import client_progress

SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: A round slower than this shows a bar of its clients (tqdm's `delay`): fast rounds print nothing
#: more.
CLIENT_BAR_DELAY_S = 2.0
#: After the first round, a run expected to take longer than this says how long (and how to stop
#: it).
ESTIMATE_ABOVE_S = 300.0


class _Abandon(BaseException):
    """Raised by the handler to cut work short; a BaseException, so no `except Exception` on the way
    swallows it. The loop turns it into `RunInterrupted`."""


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


class RoundLoop:
    """The rounds start+1..rounds of one run, as a context manager around the round loop:

        with RoundLoop(run_dir, rounds, start, desc, progress, checkpointed) as loop:
            for r in range(start + 1, rounds + 1):
                with loop.round(r, clients):  # the round's computation: a second signal abandons it
                    ...
                ...                           # the round's writes (history, metrics.csv)
                loop.end_round(r, save, boundary)  # checkpoint; a signal ends the run here
            loop.finishing()                  # final evaluation: a signal ends the run at once

    `checkpointed`: the round of the checkpoint on disk when the loop opens (None: there is
    none)."""

    def __init__(
        self,
        run_dir: str | Path,
        rounds: int,
        start: int,
        desc: str,
        progress: bool,
        checkpointed: int | None,
    ):
        self.run_dir, self.rounds, self.start, self.desc, self.progress = (
            Path(run_dir),
            rounds,
            start,
            desc,
            progress,
        )
        self.checkpointed = checkpointed
        self.completed = start
        """The last round whose state is complete in memory."""
        self.signum: int | None = None
        """The first signal received (a stop is requested)."""
        self.current = start + 1
        """The round under way (or the next one)."""
        self.cutting: str | None = None
        """What a second signal would abandon now (None: writes under way, nothing may be cut)."""
        self.abandoned: str | None = None
        """What a signal cut short."""
        self.final = False
        self._pending_save: Callable[[], None] | None = None
        self._previous: dict[int, Any] = {}  # the handlers signal.getsignal returned
        self._round_started = 0.0
        self._before = 0.0  # the run's seconds before the loop (reading and caching the data)
        self.bar: Any = None

    # --- context ----------------------------------------------------------------------------------
    def __enter__(self) -> RoundLoop:
        self._before = progress_lines.seconds_before_run()
        self.bar = progress_lines.bar(
            total=self.rounds,
            initial=self.start,
            desc=self.desc,
            unit="round",
            disable=not self.progress,
        )
        # (signal.signal works there only)
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                previous = signal.getsignal(sig)
                # (None: a handler set outside Python, not restorable)
                if previous not in (signal.SIG_IGN, None):
                    self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, kind, exc, tb) -> None:
        self._restore()
        if self.bar is not None:
            self.bar.close()
        if kind is _Abandon:
            assert self.signum is not None  # only a signal abandons a round
            raise RunInterrupted(
                self.run_dir, self.checkpointed, self.rounds, self.signum, self.abandoned
            ) from None

    def _restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}

    def _on_signal(self, signum: int, frame) -> None:
        # os.write: a print here could re-enter the stderr buffer that the interrupted code is
        # writing
        if self.abandoned is not None:
            os.write(
                2, f"\nfedac: already stopping (kill -9 {os.getpid()} ends it at once)\n".encode()
            )
            return
        if self.final or (self.signum is not None and self.cutting is not None):
            self.signum = self.signum or signum
            self.abandoned = "the final evaluation" if self.final else self.cutting
            raise _Abandon
        if self.signum is not None:
            return  # a stop is under way and the round's writes are not cut
        self.signum = signum
        name = signal.Signals(signum).name
        again = "Ctrl-C" if signum == signal.SIGINT else name
        os.write(
            2,
            f"\nfedac: {name}: stopping at the end of round {self.current} with a checkpoint "
            f"(another {again} abandons the round)\n".encode(),
        )

    # --- rounds -----------------------------------------------------------------------------------
    @contextmanager
    def round(self, round_idx: int, clients: int) -> Iterator[None]:
        """The computation of one round: a bar of its `clients` (shown once the round takes longer
        than CLIENT_BAR_DELAY_S; training/stacking.py `clients_done` advances it) and the window in
        which a second signal abandons the round."""
        if not current_world().distributed:  # (several processes stop where they agree: end_round)
            self._stop_if_asked()
        self.current = round_idx
        self._round_started = time.perf_counter()
        inner = progress_lines.bar(
            total=clients,
            desc=f"round {round_idx}",
            unit="client",
            leave=False,
            delay=CLIENT_BAR_DELAY_S,
            disable=not self.progress,
            heartbeat=True,
        )
        self.cutting = f"round {round_idx} of {self.rounds}, which was abandoned"
        try:
            with client_progress(inner.update):
                yield
        finally:
            self.cutting = None
            inner.close()

    def end_round(self, round_idx: int, save: Callable[[], None], boundary: bool) -> None:
        """After round `round_idx` and its writes: `save()` its checkpoint when it is a checkpoint
        boundary, advance the bar, give the estimate after the first round, and end the run here
        when a signal asked (saving the checkpoint of this boundary first)."""
        self.completed = round_idx
        self._pending_save = save
        if boundary:
            self._save()
        if self.bar is not None:  # (None only outside the `with`)
            self.bar.update(1)
        if round_idx == self.start + 1 and self.progress:
            self._estimate(round_idx)
        if self._agree_on_stop(round_idx):
            self._stop_if_asked()

    def _estimate(self, round_idx: int) -> None:
        """After the first round: how long the rest takes, when the whole command (the data's
        preparation before the first round included) takes longer than ESTIMATE_ABOVE_S."""
        took = time.perf_counter() - self._round_started
        left = self.rounds - round_idx
        whole = self._before + took * (left + 1)
        if left and whole > ESTIMATE_ABOVE_S:
            # the signal this process stops cleanly on (SIGINT ignored: see above; none off the
            # main thread)
            stop = (
                "Ctrl-C"
                if signal.SIGINT in self._previous
                else f"kill {os.getpid()}"
                if signal.SIGTERM in self._previous
                else None
            )
            how = (
                f" ({stop} stops cleanly at the end of a round; the run resumes from there)"
                if stop
                else ""
            )
            before = (
                f"; {_duration(whole)} in all with the {self._before:.0f} s before round 1 "
                "(reading the data, caching what a later run reuses)"
                if self._before > 0.1 * whole
                else ""
            )
            progress_lines.write(
                f"round {round_idx} took {took:.1f} s; {left} more "
                f"round{'s' if left > 1 else ''}: about {_duration(took * left)}{how}{before}"
            )

    def _agree_on_stop(self, round_idx: int) -> bool:
        """Whether this round's end may stop the run. Over several processes, every rank stops at
        the boundary where any rank was asked to: a signal that reached some ranks alone (a `kill`
        of one rank's PID) would otherwise leave them in the checkpoint's gather while the others
        train on, until runtime.dist_timeout. One small gather per round; a signal that comes after
        it is carried to the next round's (stopping on it here would stop this rank alone)."""
        world = current_world()
        if not world.distributed:
            return True
        asked = world.gather(self.signum, "agreeing whether the run stops here", round_idx)
        first = next(((rank, s) for rank, s in enumerate(asked) if s is not None), None)
        if first is None:
            return False
        if self.signum is None:
            self.signum = first[1]
            if world.writes:
                progress_lines.write(
                    f"fedac: rank {first[0]} received {signal.Signals(first[1]).name}: every rank "
                    f"stops at the end of round {round_idx} with a checkpoint"
                )
        return True

    def finishing(self) -> None:
        """Every round is trained and checkpointed: from here a signal ends the run at once."""
        self._stop_if_asked()
        self.final = True

    def _save(self) -> None:
        if self.checkpointed != self.completed:
            assert self._pending_save is not None  # end_round sets it before any save
            self._pending_save()
            self.checkpointed = self.completed

    def _stop_if_asked(self) -> None:
        if self.signum is None or self.completed == self.start:
            return  # (a signal before the first round ends in that round's end)
        self._save()
        raise RunInterrupted(self.run_dir, self.checkpointed, self.rounds, self.signum)
