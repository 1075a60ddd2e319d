"""The round's server step, written once for every runtime: the simulator's round (one process or
torchrun) and the Flower strategy hand it what arrived and get the next global state back.

Before the clients train, `ServerStep.broadcast` gives the broadcast as they receive it
(compression.download=true: quantised); the round's arrivals come back with that broadcast. In
order:
1. reject every arrival whose upload (or new client state) is not finite, naming the client;
2. count the bytes each arrival received and sent (the byte ledger counts rejected uploads too:
   they were sent), a compressed upload at its wire size (rules/compression.py);
3. what each client sends, computed here as the client would (numerically the same): the
   malicious clients' model poisoning (rules/attacks.py: an attacker crafts the update it then
   sends through the protocol's compression), dp.mode=client's clipping (rules/privacy.py: of the
   update plus its error-feedback residual, so what is sent stays within dp.clip), then
   compression with error feedback (`compression.*`; each client's residual kept in
   `RunState.compression_residuals`), and the server's decompression (uploads that arrive
   compressed, from Flower nodes that compress their own, come decoded: `Arrival.wire_bytes`);
4. dp.mode=central's clipping of the decompressed uploads;
5. the algorithm's `server_update`, robust rules included, on the decompressed uploads (over
   several processes, one all-reduced weighted mean may stand for the uploads: `summed`; never
   with compression, engine/distributed.py `sums_uploads`);
6. DP noise on the new global model;
7. LPA's per-layer decisions to lpa.jsonl, and the round's training loss.
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
from fedac.rules.compression import Compressor
from fedac.rules.privacy import Privacy
from fedac.training.types import Params, all_finite

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
    wire_bytes: int | None = None
    """Set when the client sent its upload compressed and it was decoded on arrival (a Flower
    node, rules/compression.py `encode`): the bytes it took on the wire. The server step then
    counts those and does not compress the upload again."""


@dataclass
class StepResult:
    server: ServerState
    metrics: dict[str, float]
    accepted: list[str] = field(default_factory=list)
    """The clients whose uploads entered the round, in arrival order."""


class ServerStep:
    """The one server step (module docstring). `attack` / `privacy` / `compression` absent: uploads
    go to the algorithm as they came. `run_dir`: where lpa.jsonl is written (None: not written)."""

    def __init__(
        self,
        algorithm: Algorithm,
        attack: Attack | None = None,
        privacy: Privacy | None = None,
        run_dir: Path | None = None,
        compression: Compressor | None = None,
    ):
        self.algorithm, self.attack, self.privacy = algorithm, attack, privacy
        self.run_dir = run_dir
        self.compression = compression if compression is not None and compression.on else None

    def broadcast(self, payload: Any, round_idx: int) -> Any:
        """The round's broadcast as the clients receive it (compression.download=true: quantised,
        rules/compression.py `Compressor.broadcast`); the clients train from it and this step,
        given it back, takes their updates against it."""
        if self.compression is None:
            return payload
        return self.compression.broadcast(payload, round_idx)

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
        # the bytes of the uploads that travel compressed (the others count their dense size)
        wire = {a.client: a.wire_bytes for a in arrivals if a.wire_bytes is not None}
        if self.compression is not None:
            for a in arrivals:
                wire.setdefault(a.client, self.compression.wire_bytes(payload, a.upload))
        sent = {a.client: a.upload for a in arrivals}
        down = self.compression.broadcast_bytes(payload) if self.compression is not None else None
        metrics.update(ByteLedger(state).round(payload, sent, wire, down))
        names = [a.client for a in accepted]
        uploads = [(a.upload, a.weight) for a in accepted]
        if self.attack is not None:
            uploads = self.attack.poison_uploads(payload, names, uploads, round_idx)
        # (uploads decoded on arrival were compressed by their clients)
        if not any(a.wire_bytes is not None for a in accepted):
            uploads = self._received(state, payload, names, uploads, round_idx)
        if self.privacy is not None and not self.privacy.on_client:
            uploads = self.privacy.clip(payload, names, uploads)  # central (a no-op when off)
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

    def _received(
        self,
        state: RunState,
        payload: Any,
        names: list[str],
        uploads: list[tuple[Any, int]],
        round_idx: int,
    ) -> list[tuple[Any, int]]:
        """What the server receives of the clients' `uploads`: each clipped by its client under
        dp.mode=client (not the malicious clients': they do not clip) and compressed with error
        feedback, as the server decompresses it (module docstring, step 3)."""
        privacy = self.privacy if self.privacy is not None and self.privacy.on_client else None
        malicious = self.attack.malicious if self.attack is not None else set()

        def clip(params: list[Params]) -> list[Params]:
            assert privacy is not None
            return [u for u, _ in privacy.clip(payload, names, [(p, 1) for p in params], malicious)]

        if self.compression is None:
            return uploads if privacy is None else privacy.clip(payload, names, uploads, malicious)
        rebuilt = self.compression(
            payload,
            names,
            [u for u, _ in uploads],
            round_idx,
            state.compression_residuals,
            clip if privacy is not None else None,
        )
        # (DP's mean is the unweighted one: clipped uploads carry n_k = 1, privacy.py)
        return [(u, 1 if privacy is not None else n) for u, (_, n) in zip(rebuilt, uploads)]
