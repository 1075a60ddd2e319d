"""The clock's part of the run state (`SystemBook`, checkpointed with it): the virtual time, the
async jobs in flight (`Job`) and each client's running totals (`ClientLedger`), as typed fields.

On disk the book stays plain dicts and lists (`to_plain` / `from_plain`), so a checkpoint names no
class of fedac's; a checkpoint written when jobs were dicts and a client's totals a list of six
numbers resumes."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class Job:
    """One async dispatch: `client` trains on model `version`; its outcome (`status` arrived /
    late / dropped at virtual time `at`, with the seconds it spent) is known at dispatch, its
    `result` (a ClientResult; FedBuff keeps the upload as its difference from the model it started
    from) once trained."""

    client: str
    version: int
    at: float
    status: str
    compute_s: float = 0.0
    comm_s: float = 0.0
    result: Any = None


@dataclass
class ClientLedger:
    """One client's running totals since the run began (clients.csv's clock columns)."""

    compute_s: float = 0.0
    comm_s: float = 0.0
    arrived: float = 0.0
    late: float = 0.0
    dropped: float = 0.0
    staleness: float = 0.0
    """Summed over its arrivals."""

    def record(self, status: str, compute_s: float, comm_s: float, staleness: int = 0) -> None:
        self.compute_s += compute_s
        self.comm_s += comm_s
        if status not in ("arrived", "late", "dropped"):
            raise ValueError(f"unknown outcome {status!r}")
        setattr(self, status, getattr(self, status) + 1)
        if status == "arrived":
            self.staleness += staleness

    def columns(self) -> dict[str, float]:
        """clients.csv's columns of the clock."""
        return {
            "compute_s": self.compute_s,
            "comm_s": self.comm_s,
            "arrived": int(self.arrived),
            "late": int(self.late),
            "dropped": int(self.dropped),
            "mean_staleness": self.staleness / self.arrived if self.arrived else math.nan,
        }


def _ledger(saved: Any) -> ClientLedger:
    """A ledger from its checkpointed form: a dict of its fields, or (older checkpoints) the list
    [compute_s, comm_s, arrived, late, dropped, staleness]."""
    if isinstance(saved, ClientLedger):
        return saved
    if isinstance(saved, dict):
        return ClientLedger(**saved)
    return ClientLedger(*saved)


def _job(saved: Any) -> Job:
    return saved if isinstance(saved, Job) else Job(**saved)


@dataclass
class SystemBook:
    """The virtual clock's part of the run state (checkpointed with it)."""

    time: float = 0.0
    """Virtual seconds since the run started."""
    version: int = 0
    """Async: server updates so far."""
    jobs: list[Job] = field(default_factory=list)
    """Async: the clients in flight."""
    buffer: list[Job] = field(default_factory=list)
    """Async: the arrived jobs not yet applied."""
    dispatched: int = 0
    """Async: dispatches so far (seeds the next one's draws)."""
    delivered: dict[str, int] = field(default_factory=dict)
    """Async: each client's model version of its last job that will deliver."""
    empty_rounds: int = 0
    clients: dict[str, ClientLedger] = field(default_factory=dict)
    """Each client's running totals."""
    rows: list[dict[str, float]] = field(default_factory=list)
    """system.csv: one row per round."""

    def record(
        self, client: str, status: str, compute_s: float, comm_s: float, staleness: int = 0
    ) -> None:
        """One dispatched client's outcome (`status` arrived / late / dropped) and the seconds it
        spent."""
        self.clients.setdefault(client, ClientLedger()).record(status, compute_s, comm_s, staleness)

    def client_columns(self, client: str) -> dict[str, float]:
        """clients.csv's columns of the clock for `client`."""
        return self.clients.get(client, ClientLedger()).columns()

    def to_plain(self) -> dict[str, Any]:
        """The checkpoint's form: plain dicts and lists (a job's trained result as it is)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["jobs"] = [{f.name: getattr(j, f.name) for f in fields(j)} for j in self.jobs]
        out["buffer"] = [{f.name: getattr(j, f.name) for f in fields(j)} for j in self.buffer]
        out["clients"] = {name: asdict(ledger) for name, ledger in self.clients.items()}
        return out

    @classmethod
    def from_plain(cls, saved: dict[str, Any] | SystemBook) -> SystemBook:
        """`to_plain`'s dict (or an older checkpoint's) as a book."""
        if isinstance(saved, SystemBook):
            return saved
        book = cls(**saved)
        book.jobs = [_job(j) for j in book.jobs]
        book.buffer = [_job(j) for j in book.buffer]
        book.clients = {name: _ledger(v) for name, v in book.clients.items()}
        return book
