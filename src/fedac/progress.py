"""Progress for a person at a terminal and for a log file: every progress bar of fedac is made by
`bar`, which gives

- on a terminal (stderr is a TTY): a tqdm bar, redrawn in place;
- otherwise (`fedac run ... > log 2>&1`, a pipe, a CI job): `LogLines`, whole lines and nothing
  else. No carriage return, no cursor movement (tqdm's nested bars move up with ESC [A and clear
  their line), no blank bar lines. A line is written when the work is complete and otherwise at
  most once every LOG_EVERY_S seconds, so a round loop writes at most one line a round and a
  synthesis of 300 tasks a line every LOG_EVERY_S seconds instead of one per task. A bar made with
  `heartbeat=True` (the clients of one round, which may all finish at once after a minute) also
  writes a line every LOG_EVERY_S seconds while nothing finishes, so a long round shows it is
  alive; a bar that is closed before its `delay` writes nothing.

`write(line)` prints a message between bars (tqdm.write: it keeps a terminal's bars intact).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, TextIO

#: The least time between two lines of a progress bar written to a file (not a terminal).
LOG_EVERY_S = 10.0
_run_clock: float | None = None


def before_run_starts() -> None:
    """Mark where the time before a run's first round starts counting (`seconds_before_run`): the
    start of the command (cli.main), and the end of each run of a command that trains several
    one after another (experiments/compare.py `train_run`), so that a later run's estimate
    counts its own preparation, not the runs before it."""
    global _run_clock
    _run_clock = time.monotonic()


def seconds_before_run() -> float:
    """Seconds since the last `before_run_starts` (0 when none marked it: a library call)."""
    return 0.0 if _run_clock is None else time.monotonic() - _run_clock


def is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # (a closed or replaced stream)
        return False


def bar(
    iterable: Iterable | None = None,
    *,
    total: int | None = None,
    desc: str = "",
    unit: str = "it",
    initial: int = 0,
    leave: bool = True,
    delay: float = 0.0,
    disable: bool = False,
    heartbeat: bool = False,
) -> Any:
    """A progress bar over `iterable` (or advanced by `.update(n)`) with tqdm's arguments: a tqdm
    bar on a terminal, `LogLines` when stderr is not a terminal (see the module's docstring).
    `heartbeat`: also a line every LOG_EVERY_S seconds without progress (in a file only)."""
    from tqdm import tqdm  # lazy: start-up time of the CLI

    stream = sys.stderr
    if disable or is_terminal(stream):
        return tqdm(
            iterable,
            total=total,
            desc=desc,
            unit=unit,
            initial=initial,
            leave=leave,
            delay=delay,
            disable=disable,
            file=stream,
        )
    if total is None and iterable is not None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    return LogLines(iterable, total, desc, unit, initial, leave, delay, heartbeat, stream)


def write(line: str) -> None:
    """Print `line` (to stdout) without breaking a terminal's bars."""
    from tqdm import tqdm

    tqdm.write(line)


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return (f"{hours}:" if hours else "") + f"{rest // 60:02d}:{rest % 60:02d}"


class LogLines:
    """tqdm's interface (iteration, `update`, `set_postfix`, `close`, a context manager, `n`)
    writing whole progress lines: `desc: n/total units, mm:ss elapsed, ~mm:ss left, key=value`."""

    def __init__(
        self,
        iterable: Iterable | None,
        total: int | None,
        desc: str,
        unit: str,
        initial: int,
        leave: bool,
        delay: float,
        heartbeat: bool,
        stream: TextIO,
        every: float = LOG_EVERY_S,
    ):
        self.iterable, self.total, self.desc, self.unit = iterable, total, desc, unit
        self.n = self.initial = initial
        self.leave, self.delay, self.stream, self.every = leave, delay, stream, every
        self.postfix = ""
        self.started = self.last = time.monotonic()
        self.written_n: int | None = None  # the count the last line showed
        self.closed = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if heartbeat:
            self._ticker = threading.Thread(target=self._tick, name="fedac-progress", daemon=True)
            self._ticker.start()

    # --- tqdm's interface ---------------------------------------------------------------------
    def __iter__(self) -> Iterator:
        assert self.iterable is not None, "LogLines: iterate over a bar made with an iterable"
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __enter__(self) -> LogLines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        with self._lock:
            self.n += n
            now = time.monotonic()
            done = self.total is not None and self.n >= self.total
            if (done and self.leave) or (
                now - self.started >= self.delay and now - self.last >= self.every
            ):
                self._write(now)

    def set_postfix(self, ordered_dict: dict[str, Any] | None = None, **kwargs: Any) -> None:
        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = " ".join(f"{k}={v}" for k, v in items.items())

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._stop.set()
        if self._ticker is not None and self._ticker is not threading.current_thread():
            self._ticker.join()
        with self._lock:
            if self.leave and self.n > self.initial and self.written_n != self.n:
                self._write(time.monotonic())

    # --- lines --------------------------------------------------------------------------------
    def line(self, now: float) -> str:
        elapsed = now - self.started
        count = f"{self.n}/{self.total}" if self.total is not None else f"{self.n}"
        parts = [f"{self.desc}: {count} {self.unit}s", f"{_clock(elapsed)} elapsed"]
        done = self.n - self.initial
        if self.total is not None and 0 < done and self.n < self.total:
            parts.append(f"~{_clock(elapsed / done * (self.total - self.n))} left")
        return ", ".join(parts) + (f", {self.postfix}" if self.postfix else "")

    def _write(self, now: float) -> None:
        self.last, self.written_n = now, self.n
        try:
            self.stream.write(self.line(now) + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # the reader has gone: progress is not worth a failure
            pass

    def _tick(self) -> None:
        wait = max(self.delay, self.every)
        while not self._stop.wait(wait):
            with self._lock:
                now = time.monotonic()
                if now - self.last >= self.every and not self.closed:
                    self._write(now)
                wait = max(self.every - (time.monotonic() - self.last), 0.05)
