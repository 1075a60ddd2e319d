"""The one run skeleton every round driver shares (`RoundDriver.run`): open the run directory (or
resume its checkpoint), put the state on the run's device, say the run's first line, cut the logs
back to the checkpoint on resume, then round after round: train, evaluate, append the history row
(metrics.csv), checkpoint at the boundary, stop where asked; after the last round the final results,
with what every run reports (wall time, where it resumed, rounds trained, device, execution path),
into results.json.

A driver supplies only what differs: its round (`run_round`), its evaluation and the round's own
writes, its fresh state and how it is placed, its closing results. Drivers: engine/simulator.py
(fixed clients, sampled cohorts) and engine/zeroshot.py (the zero-shot scenarios' users on fresh
clips every round). Signals and the progress bars are engine/rounds.py's `RoundLoop`.
"""

from __future__ import annotations

import logging
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedac.algorithms.base import Algorithm
from fedac.config import Config
from fedac.engine.checkpoint import open_run, save_checkpoint
from fedac.engine.report import truncate_client_rows, write_history, write_results
from fedac.engine.rounds import RoundLoop
from fedac.engine.state import RunState
from fedac.training.device import to_device
from fedac.training.runtime import Runtime

log = logging.getLogger(__name__)


class RoundDriver(ABC):
    """A run's rounds over one kind of federation. Subclasses set `cfg`, `run_dir`, `progress` and
    `runtime` (training/runtime.py `start_runtime`) and implement the abstract members."""

    cfg: Config
    run_dir: Path
    progress: bool
    runtime: Runtime
    algorithm: Algorithm
    #: The row's metrics the rounds' bar shows (those the row has).
    shown: tuple[str, ...] = ()
    #: After `run`: the state it ended with (None before), where it resumed and how many rounds it
    #: trained.
    state: RunState | None = None
    resumed_from = 0
    rounds_trained = 0
    #: Over several processes, a client name -> the rank that alone holds its persistent state
    #: (engine/distributed.py `owner`); None: every rank holds every state.
    state_owner: Callable[[str], int] | None = None

    # --- what a driver supplies ------------------------------------------------------------------
    @property
    @abstractmethod
    def rounds(self) -> int:
        """The run's last round."""

    @property
    @abstractmethod
    def desc(self) -> str:
        """The rounds' bar's label."""

    @property
    @abstractmethod
    def clients_per_round(self) -> int:
        """The size of a round's inner bar (its clients or users)."""

    @abstractmethod
    def _fresh_state(self) -> RunState:
        """Round 0's state."""

    @abstractmethod
    def first_line(self) -> str:
        """The run's first line (logged, and printed to stderr with the progress shown)."""

    @abstractmethod
    def run_round(self, state: RunState, round_idx: int) -> dict[str, float]:
        """Train round `round_idx` (updates `state`); its metrics for the history row."""

    @abstractmethod
    def final_results(self, state: RunState) -> dict[str, Any]:
        """The results after the last round (results.json, less what `run` adds to every run's)."""

    def place_state(self, state: RunState) -> RunState:
        """The opened (fresh or resumed) state on the run's device, its global states as the
        algorithm keeps them (a checkpoint holds typed ones as dicts: `RunState.to_checkpoint`)."""
        state = to_device(state, self.runtime.device)
        state.server = self.algorithm.restore_server(state.server)
        if state.best is not None:
            state.best.server = self.algorithm.restore_server(state.best.server)
        return state

    def rewind_logs(self, round_idx: int) -> None:
        """On resume: cut the logs written round by round back to the checkpoint's round
        (metrics.csv is rewritten from the history)."""
        truncate_client_rows(self.run_dir, round_idx)

    def evaluates(self, round_idx: int) -> bool:
        """Whether round `round_idx` is evaluated and gets a history row."""
        return True

    def evaluate(self, state: RunState, round_idx: int, row: dict[str, float]) -> None:
        """The round's evaluation into `row`, inside the round (a second signal abandons it)."""
        return None  # (a driver whose round scores itself)

    def round_written(self, state: RunState, round_idx: int, row: dict[str, float]) -> None:
        """The round's own files, after its computation (a signal does not cut them)."""
        return None  # (a driver whose rows are all it writes per round)

    def checkpoint_boundary(self, round_idx: int) -> bool:
        """Whether a checkpoint is written after round `round_idx`."""
        return True

    @property
    def writes(self) -> bool:
        """Whether this process writes the run directory (only rank 0 of several:
        engine/distributed.py)."""
        return True

    def final(self, state: RunState) -> dict[str, Any]:
        """`final_results` as this driver computes them (e.g. under its precision's autocast; every
        process of a distributed run computes them, rank 0 writes them)."""
        return self.final_results(state)

    def closing(self) -> dict[str, Any]:
        """What this driver adds to every run's results (its execution path)."""
        return {}

    # --- the skeleton -----------------------------------------------------------------------------
    def run(self, resume: bool = False, stop_after: int | None = None) -> dict[str, Any] | None:
        """Train all rounds (continuing from the checkpoint when resume) and write the run
        directory.

        `stop_after` ends the process-like run after that round without final evaluation, as a kill
        would (used to test resume); it returns None then, as does a process that does not write.
        SIGINT / SIGTERM end it at a round boundary with a checkpoint, raising RunInterrupted
        (engine/rounds.py).
        """
        state = self.place_state(
            open_run(self.run_dir, self.cfg, resume, self._fresh_state, self.state_owner)
        )
        line = self.first_line()
        if resume:
            line = f"resumed from round {state.round} of {self.rounds} ({self.run_dir}); {line}"
        log.info(line)
        if self.progress:
            # the run's first line (cli logs warnings only)
            print(f"fedac: {line}", file=sys.stderr, flush=True)
        if resume:
            self.rewind_logs(state.round)
        # Rounds this process trains, reported so a resumed run shows where it started
        # (tests/engine/test_resume.py).
        self.resumed_from, self.rounds_trained = state.round, 0
        started = time.perf_counter() - state.wall_seconds
        rounds = self.rounds
        with RoundLoop(
            self.run_dir,
            rounds,
            state.round,
            self.desc,
            self.progress,
            state.round if resume else None,
        ) as loop:
            for round_idx in range(state.round + 1, rounds + 1):
                evaluated = self.evaluates(round_idx)
                # (a second signal abandons the round in here)
                with loop.round(round_idx, self.clients_per_round):
                    row = {"round": float(round_idx), **self.run_round(state, round_idx)}
                    if evaluated:
                        self.evaluate(state, round_idx, row)
                self.rounds_trained += 1
                self.round_written(state, round_idx, row)
                if evaluated:
                    row["wall_seconds"] = time.perf_counter() - started
                    state.history.append(row)
                    write_history(self.run_dir, state.history)
                    if loop.bar is not None:  # (open inside the loop)
                        loop.bar.set_postfix({k: f"{row[k]:.3f}" for k in self.shown if k in row})
                state.round = round_idx
                state.wall_seconds = time.perf_counter() - started
                loop.end_round(
                    round_idx,
                    lambda: save_checkpoint(
                        self.run_dir, to_device(state, "cpu"), self.state_owner is not None
                    ),
                    boundary=self.checkpoint_boundary(round_idx),
                )
                if stop_after is not None and round_idx >= stop_after:
                    return None
            loop.finishing()
            self.state = state
            results = self.final(state)
            if not self.writes:
                return None  # (rank 0 alone writes the results)
        results["wall_seconds"] = time.perf_counter() - started
        results["resumed_from"], results["rounds_trained"] = self.resumed_from, self.rounds_trained
        results["device"] = self.runtime.name
        results.update(self.closing())
        write_results(self.run_dir, results, self.cfg)
        return results
