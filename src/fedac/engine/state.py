"""What a run carries from round to round and its checkpoint keeps (`RunState`), as typed fields
the engine reads by name instead of a dict of strings.

The global state (`server`) and each client's persistent state (`clients`) stay the algorithm's
own: the engine moves and stores them but reads them only through the algorithm (`broadcast`,
`global_model`, `personalized_model`). On disk a checkpoint stays a plain dict of these fields
(`to_checkpoint` / `from_checkpoint`), so a checkpoint written before the fields were typed
resumes, and the file does not depend on where these classes live.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from fedac.engine.clock.book import SystemBook
from fedac.errors import CheckpointError


def plain(obj: Any) -> Any:
    """A dataclass as the dict of its fields (one level), anything else as it is."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in fields(obj)}
    return obj


@dataclass
class BestModel:
    """The global state of the evaluated round with the best validation score (`train.select =
    best_val` tests it at the end)."""

    round: int
    val_accuracy: float
    val_score: float
    """What selection compares (training/evaluate.py `selection_score`: accuracy, or -WER)."""
    server: Any


@dataclass
class ByteBook:
    """Bytes the clients received and uploaded so far (engine/clients.py `ByteLedger` counts them).
    `down` / `up` are NaN when the run resumed a checkpoint written before the book existed (its
    earlier rounds are uncounted, so the totals are unknown rather than too small)."""

    down: float = 0
    up: float = 0
    clients: dict[str, list[int]] = field(default_factory=dict)
    """Per client: [bytes received, bytes uploaded]."""


@dataclass
class RunState:
    """A run's state between rounds. `server`, `round`, `history` and `wall_seconds` serve every
    driver; `clients`, `visits`, `best` and `auto_choice` are the fixed-client simulator's (and the
    Flower ServerApp's), and stay empty in the zero-shot driver."""

    algorithm: str
    """The algorithm the state belongs to (a resume under another one is refused)."""
    server: Any
    """The algorithm's global state (`Algorithm.init_server` / `server_update`)."""
    round: int = 0
    """The last round trained."""
    history: list[dict[str, float]] = field(default_factory=list)
    """metrics.csv: one row per evaluated round."""
    wall_seconds: float = 0.0
    """Seconds trained so far (a resumed run goes on counting)."""
    clients: dict[str, Any] = field(default_factory=dict)
    """Each client's persistent state by name (over several processes, those this rank owns)."""
    visits: dict[str, int] = field(default_factory=dict)
    """Rounds each client has trained (clients never sampled are absent)."""
    best: BestModel | None = None
    auto_choice: dict[str, dict[str, Any]] = field(default_factory=dict)
    """`runtime.execution=auto`'s measured path per architecture set (kept so a resume runs it)."""
    bytes: ByteBook | None = None
    """None until the first round's traffic is counted (the Flower ServerApp's nodes count their
    own)."""
    system: SystemBook | None = None
    """The virtual clock (`system.*`); None when the run models no devices or time."""
    selection: dict[str, Any] = field(default_factory=dict)
    """The selection rule's history of every client and its own state (engine/clock/selection.py;
    empty under `selection.method=random`), checkpointed so a resumed run chooses alike."""
    compression_residuals: dict[str, Any] = field(default_factory=dict)
    """Error feedback's residual of each client that has sent a compressed update (client -> entry
    -> tensor; rules/compression.py): client state the engine keeps for the clients, checkpointed
    so a resumed run sends what an uninterrupted one would."""

    def to_checkpoint(self) -> dict[str, Any]:
        """The checkpoint's content: a plain dict, the nested dataclasses (a typed global state
        such as zero-shot's included) as dicts too, so the file names no class of fedac's; the
        algorithm's `restore_server` rebuilds its typed state on resume."""
        out = plain(self)
        out["server"] = plain(self.server)
        if self.best is not None:
            out["best"] = {**plain(self.best), "server": plain(self.best.server)}
        out["bytes"] = plain(self.bytes)
        out["system"] = self.system.to_plain() if self.system is not None else None
        return out

    @classmethod
    def from_checkpoint(cls, saved: dict[str, Any], where: object = "") -> RunState:
        """A state from `to_checkpoint`'s dict, or from a checkpoint of an earlier fedac (the same
        keys, some absent); a key this fedac does not know is refused, naming it (a newer fedac's
        checkpoint would lose it)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(saved) - known)
        if unknown or "server" not in saved:
            what = f"unknown entries {unknown}" if unknown else "no global state ('server')"
            raise CheckpointError(
                f"checkpoint {where} has {what}: it was written by another fedac version; resume "
                "it with that version, or start the run again"
            )
        state = cls(**{k: v for k, v in saved.items() if k in known})
        if isinstance(state.best, dict):
            # (checkpoints written before val_score existed: selection compared accuracy)
            best = dict(state.best)
            best.setdefault("val_score", best["val_accuracy"])
            state.best = BestModel(**best)
        if isinstance(state.bytes, dict):
            state.bytes = ByteBook(**state.bytes)
        if state.system is not None:
            state.system = SystemBook.from_plain(state.system)
        return state
