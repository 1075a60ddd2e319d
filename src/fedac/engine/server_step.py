"""The round's server step, written once for every runtime: the simulator's round (one process or
torchrun) and the Flower strategy hand it what arrived and get the next global state back.

In order:
1. reject every arrival whose upload (or new client state) is not finite, naming the client;
2. count the bytes each arrival received and sent (the byte ledger counts rejected uploads too:
   they were sent);
3. the malicious clients' model poisoning, then DP clipping (rules/attacks.py, rules/privacy.py);
4. the algorithm's `server_update` (over several processes, one all-reduced weighted mean may stand
   for the uploads: `summed`);
5. DP noise on the new global model;
6. LPA's per-layer decisions to lpa.jsonl, and the round's training loss.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedac.algorithms.base import Algorithm, ServerState
from fedac.engine.clients import ByteLedger
from fedac.engine.report import log_pruning
from fedac.engine.state import RunState
from fedac.rules.aggregation import ServerMetrics
from fedac.rules.attacks import Attack
from fedac.rules.privacy import Privacy
from fedac.training.types import all_finite

log = logging.getLogger(__name__)


@dataclass
class Arrival:
    """One client's answer in a round: its upload with its weight n_k, its training loss, and,
    where the server sees it (the simulator), its new persistent state."""

    client: str
    upload: Any
    weight: int
    loss: float = math.nan
    state: Any = None


@dataclass
class StepResult:
    server: ServerState
    metrics: dict[str, float]
    accepted: list[str] = field(default_factory=list)
    """The clients whose uploads entered the round, in arrival order."""


class ServerStep:
    """The one server step (module docstring). `attack` / `privacy` absent: uploads go to the
    algorithm as they came. `run_dir`: where lpa.jsonl is written (None: not written)."""

    def __init__(
        self,
        algorithm: Algorithm,
        attack: Attack | None = None,
        privacy: Privacy | None = None,
        run_dir: Path | None = None,
    ):
        self.algorithm, self.attack, self.privacy = algorithm, attack, privacy
        self.run_dir = run_dir

    def __call__(
        self,
        state: RunState,
        payload: Any,
        arrivals: list[Arrival],
        round_idx: int,
        rejected_elsewhere: int = 0,
        summed: tuple[Any, int] | None = None,
    ) -> StepResult:
        """The next global state from `state.server` and the round's `arrivals` (state.bytes
        counts the traffic). `rejected_elsewhere`: clients whose non-finite update was refused
        before it reached the server (a Flower node refuses its own). `summed`: over several
        processes, the usable uploads' all-reduced weighted mean with its summed weight."""
        finite = [all_finite(a.upload) and all_finite(a.state) for a in arrivals]
        accepted = [a for a, ok in zip(arrivals, finite) if ok]
        for arrival, ok in zip(arrivals, finite):
            if not ok:
                log.warning(
                    "round %d: client %s returned NaN/Inf parameters; its update is discarded",
                    round_idx,
                    arrival.client,
                )
        metrics: dict[str, float] = {
            "clients": float(len(accepted)),
            "rejected": float(len(arrivals) - len(accepted) + rejected_elsewhere),
        }
        metrics.update(ByteLedger(state).round(payload, {a.client: a.upload for a in arrivals}))
        names = [a.client for a in accepted]
        uploads = [(a.upload, a.weight) for a in accepted]
        if self.attack is not None:
            uploads = self.attack.poison_uploads(payload, names, uploads, round_idx)
        if self.privacy is not None:
            malicious = self.attack.malicious if self.attack is not None else set()
            uploads = self.privacy.clip(payload, names, uploads, malicious)
        if summed is not None and uploads:
            uploads = [summed]  # (all-reduced: their weighted mean stands for them all)
        server = state.server
        if uploads:
            server, server_metrics = self.algorithm.server_update(server, uploads, round_idx)
            metrics.update(server_metrics)
            if self.privacy is not None:
                server, dp_metrics = self.privacy.add_noise(
                    self.algorithm, server, round_idx, len(uploads)
                )
                metrics.update(dp_metrics)
            pruning = server_metrics.pruning if isinstance(server_metrics, ServerMetrics) else None
            if pruning is not None and self.run_dir is not None:
                log_pruning(self.run_dir, round_idx, pruning, names, [n for _, n in uploads])
        else:
            log.warning(
                "round %d: no usable client update; the global state is unchanged", round_idx
            )
        losses = [a.loss for a in accepted]
        known = any(not math.isnan(loss) for loss in losses)
        metrics["train_loss"] = float(np.nanmean(losses)) if known else math.nan
        return StepResult(server, metrics, names)
