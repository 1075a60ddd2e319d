"""Device and availability traces: what each client's device can do and when it is online, read by
the virtual clock (engine/clock/; settings `system.devices`, `system.availability`,
`system.fill`). Plain text a user can write by hand; docs/traces.md shows them with examples.

Device trace (`system.devices=PATH`), CSV with the header
`client,flops_per_s,up_bps,down_bps[,memory_mb]`, one row per client: the training FLOP/s the
device sustains, its upload and download bandwidth in bits per second (all > 0) and, optionally,
its memory in MB (an empty cell: unknown). JSON: a list of objects with those keys, or an object
`{client: {flops_per_s: ..., up_bps: ..., down_bps: ...}}`. A client listed twice is an error.

Availability trace (`system.availability=PATH`), CSV with the header
`client,start_s,end_s[,period_s]`, one row per interval in which the client is online, in seconds
of virtual time from the start of the run: online from start_s (included) to end_s (excluded;
`inf`: for ever). A client may have several rows. With `period_s` (the same on every row of the
client) its intervals repeat every period_s seconds, as FedScale's behaviour traces cycle, and must
lie within [0, period_s]; an interval that ends at period_s joins one that starts at 0 of the next
period. A row with empty start_s and end_s lists a client that is never online. JSON: a list of
objects with those keys, or `{client: [{start_s: ..., end_s: ...}, ...]}` (an empty list: never
online). Overlapping or touching intervals of a client are merged.

Bad input raises a ConfigError naming the setting, the file and the line (CSV, the header being line
1) or the entry (JSON: its index, or its key and index): a malformed row, a missing or unknown
column (with the known ones), a value that is not a number, a speed or bandwidth <= 0, an interval
with end_s <= start_s. Clients of the run a trace omits are filled by `system.fill`: `cycle` gives
the i-th client of the run (in the order the caller lists them) the trace's row i mod rows (a
device trace's rows; an availability trace's clients, in the order they first appear), as FedScale
maps its traces onto a dataset's clients, with one warning saying how many were filled; `error`
refuses the trace, naming the first missing clients. Trace clients the run lacks are ignored.

Synthetic devices (`system.devices=synthetic`) and availability (`system.availability=synthetic`)
are drawn per client from (seed, client name) alone, so a client keeps its device and hours when
the run's other clients change; the parameters are the SYNTHETIC_* constants below, and their
reasons are in docs/traces.md. `import_fedscale` converts FedScale's two pickled traces into these
CSV files (`fedac data import-trace`).
"""

from __future__ import annotations

import bisect
import csv
import json
import logging
import math
import numbers
import pickle
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from fedac.errors import ConfigError
from fedac.seeding import numpy_rng

log = logging.getLogger(__name__)

T = TypeVar("T")

DEVICE_COLUMNS = ("client", "flops_per_s", "up_bps", "down_bps", "memory_mb")
"""A device trace's columns; all but memory_mb are required."""
INTERVAL_COLUMNS = ("client", "start_s", "end_s", "period_s")
"""An availability trace's columns; period_s is optional."""

DAY_S = 86400.0
"""The synthetic availability's period: one day."""

# Synthetic devices: log-normal, median x exp(sigma z), z standard normal per client.
SYNTHETIC_FLOPS_MEDIAN = 1e9
"""Median training throughput, FLOP/s: a mid-range phone training in the background sustains a
small fraction of its CPU's peak."""
SYNTHETIC_FLOPS_SIGMA = 1.2
"""Log-sd of the throughput: the slowest 1 % are exp(2.33 x 1.2) = 16x slower than the median, the
slowest of 2,618 clients about 55x (AI Benchmark's phones differ 10-100x)."""
SYNTHETIC_UP_MEDIAN = 5e6
"""Median upload bandwidth, bit/s (5 Mbit/s: a mobile uplink)."""
SYNTHETIC_DOWN_MEDIAN = 20e6
"""Median download bandwidth, bit/s (20 Mbit/s)."""
SYNTHETIC_BANDWIDTH_SIGMA = 1.2
"""Log-sd of each bandwidth (MobiPerf's measurements span two orders of magnitude)."""
SYNTHETIC_LINK_CORRELATION = 0.64
"""Correlation of a client's log upload and log download bandwidths: both share its network."""
SYNTHETIC_MEMORY_MEDIAN_MB = 3584.0
"""Median memory, MB (3.5 GB phones), rounded to SYNTHETIC_MEMORY_STEP_MB, at least one step."""
SYNTHETIC_MEMORY_SIGMA = 0.35
"""Log-sd of the memory: the middle 80 % of phones hold 2.3-5.6 GB."""
SYNTHETIC_MEMORY_STEP_MB = 256.0

# Synthetic availability: one daily online window per client, repeated every DAY_S.
SYNTHETIC_WINDOW_S = (8 * 3600, 20 * 3600)
"""The window's length in whole seconds, uniform in [8 h, 20 h]: the hours a phone is idle and
charging, mostly at night; 14 h on average, so 58 % of the clients are online at any time."""


@dataclass(frozen=True)
class DeviceProfile:
    """What one client's device can do."""

    flops_per_s: float
    """Training FLOP/s the device sustains (> 0)."""
    up_bps: float
    """Upload bandwidth, bits per second (> 0)."""
    down_bps: float
    """Download bandwidth, bits per second (> 0)."""
    memory_mb: float | None = None
    """Memory in MB; None: unknown."""


@dataclass(frozen=True)
class Schedule:
    """When one client is online: the sorted, disjoint, non-touching intervals [starts[i], ends[i])
    (none: never online), repeated every `period` seconds within which they lie (None: once). Every
    query bisects the intervals: O(log intervals)."""

    starts: tuple[float, ...]
    ends: tuple[float, ...]
    period: float | None = None

    def _locate(self, t: float) -> tuple[float, float, int]:
        """(offset of t's period, t within its period, index of the last interval starting at or
        before it, -1 if none)."""
        offset = 0.0
        if self.period is not None:
            offset = math.floor(t / self.period) * self.period
            # (t / period rounds: keep t's place within [0, period))
            if t - offset < 0.0:
                offset -= self.period
            elif t - offset >= self.period:
                offset += self.period
        tau = t - offset
        return offset, tau, bisect.bisect_right(self.starts, tau) - 1

    def online(self, t: float) -> bool:
        _, tau, i = self._locate(t)
        return i >= 0 and tau < self.ends[i]

    def online_until(self, t: float) -> float:
        """The end of the online interval holding t (math.inf if it never ends); t if offline."""
        offset, tau, i = self._locate(t)
        if i < 0 or tau >= self.ends[i]:
            return t
        end = self.ends[i]
        if self.period is not None and end >= self.period and self.starts[0] <= 0.0:
            if len(self.starts) == 1:  # online over the whole period
                return math.inf
            end = self.period + self.ends[0]  # it goes on into the next period's first interval
        return offset + end

    def next_online(self, t: float) -> float:
        """The earliest time >= t at which the client is online (math.inf if never)."""
        offset, tau, i = self._locate(t)
        if i >= 0 and tau < self.ends[i]:
            return t
        if i + 1 < len(self.starts):
            return offset + self.starts[i + 1]
        if self.period is None or not self.starts:
            return math.inf
        return offset + self.period + self.starts[0]


ALWAYS = Schedule((-math.inf,), (math.inf,))
"""Online at every time."""


class Availability:
    """Each client's Schedule: whether it is online at a virtual time, until when, and when next."""

    def __init__(self, schedules: Mapping[str, Schedule]):
        self.schedules = dict(schedules)

    def online(self, client: str, t: float) -> bool:
        return self.schedules[client].online(t)

    def online_until(self, client: str, t: float) -> float:
        """The end of the online interval holding t (math.inf if it never ends); t itself if the
        client is offline at t."""
        return self.schedules[client].online_until(t)

    def next_online(self, client: str, t: float) -> float:
        """The earliest time >= t at which the client is online (math.inf if never)."""
        return self.schedules[client].next_online(t)

    def never_online(self) -> list[str]:
        """The clients with no online time at all, in the run's order."""
        return [client for client, s in self.schedules.items() if not s.starts]


# ---- reading traces ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Record:
    """One row of a trace file: where it is (for errors) and its cells by column."""

    where: str
    cells: Mapping[str, object]


def _trace_path(setting: str, spec: str) -> Path:
    path = Path(spec)
    if path.suffix.lower() not in (".csv", ".json"):
        if setting == "system.availability":
            from fedac.settings.clock import AVAILABILITY  # (settings: the core layer)

            names = ", ".join(AVAILABILITY.names())
            known = f"a registered availability model ({names})"
        else:
            known = "none, synthetic"
        raise ConfigError(
            f"{setting}={spec!r}: not a known value; give {known} or the path of a .csv or .json "
            "trace (docs/traces.md)"
        )
    if not path.is_file():
        raise ConfigError(f"{setting}: trace file {path} not found")
    return path


def _check_columns(
    where: str, columns: Sequence[str], known: Sequence[str], required: Sequence[str]
) -> None:
    unknown = [c for c in columns if c not in known]
    if unknown:
        raise ConfigError(
            f"{where}: unknown column {unknown[0]!r}; the known columns are {', '.join(known)}"
        )
    missing = [c for c in required if c not in columns]
    if missing:
        raise ConfigError(
            f"{where}: missing column {missing[0]!r}; the columns are {', '.join(required)} "
            f"(required) and {', '.join(c for c in known if c not in required)} (optional)"
        )


def _csv_records(
    setting: str, path: Path, known: Sequence[str], required: Sequence[str]
) -> Iterator[_Record]:
    with path.open(newline="", encoding="utf-8-sig") as f:  # (a spreadsheet's byte-order mark)
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise ConfigError(f"{setting}: {path} is empty; its first line is the header")
        header = [name.strip() for name in header]
        _check_columns(f"{setting}: {path}, line 1", header, known, required)
        for row in reader:
            if not any(cell.strip() for cell in row):
                continue  # (a blank line)
            where = f"{setting}: {path}, line {reader.line_num}"
            if len(row) != len(header):
                raise ConfigError(
                    f"{where}: malformed row: {len(row)} cells for the header's {len(header)} "
                    f"columns ({','.join(header)})"
                )
            yield _Record(where, dict(zip(header, (cell.strip() for cell in row))))


def _json_records(setting: str, path: Path, known: Sequence[str]) -> Iterator[_Record]:
    """A list of objects (entry i) or {client: object, or a list of objects} (key k[, entry j])."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{setting}: {path}, line {exc.lineno}: not JSON ({exc.msg})") from exc
    if isinstance(data, list):
        entries = [(f"entry {i}", item, None) for i, item in enumerate(data)]
    elif isinstance(data, dict):
        entries = []
        for key, value in data.items():
            items = value if isinstance(value, list) else [value]
            if not items:  # {client: []}: listed, never online
                entries.append((f"key {key!r}", {}, key))
            for j, item in enumerate(items):
                suffix = f", entry {j}" if isinstance(value, list) else ""
                entries.append((f"key {key!r}{suffix}", item, key))
    else:
        raise ConfigError(
            f"{setting}: {path} holds a JSON {type(data).__name__}; expected a list of "
            "objects or an object keyed by client"
        )
    for label, item, key in entries:
        where = f"{setting}: {path}, {label}"
        if not isinstance(item, dict):
            raise ConfigError(f"{where}: expected an object, found {item!r}")
        cells = dict(item) if key is None else {"client": key, **item}
        if key is not None and "client" in item and str(item["client"]) != key:
            raise ConfigError(f"{where}: names client {item['client']!r} under key {key!r}")
        # (an absent key is an empty cell: the value check names a missing required one)
        _check_columns(where, list(cells), known, ("client",))
        yield _Record(where, cells)


def _records(
    setting: str, spec: str, known: Sequence[str], required: Sequence[str]
) -> tuple[Path, list[_Record]]:
    path = _trace_path(setting, spec)
    if path.suffix.lower() == ".csv":
        return path, list(_csv_records(setting, path, known, required))
    return path, list(_json_records(setting, path, known))


def _number(record: _Record, column: str, *, positive: bool = False) -> float | None:
    """The cell as a float (None when absent or empty); NaN is refused, and with `positive` any
    value <= 0 or infinite."""
    value = record.cells.get(column)
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{record.where}: {column} {value!r} is not a number")
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"{record.where}: {column} {value!r} is not a number") from None
    if math.isnan(number) or (positive and not 0.0 < number < math.inf):
        raise ConfigError(f"{record.where}: {column} must be a positive finite number, not {value}")
    return number


def _required(record: _Record, column: str, *, positive: bool = False) -> float:
    number = _number(record, column, positive=positive)
    if number is None:
        raise ConfigError(f"{record.where}: {column} is missing or empty")
    return number


def _client(record: _Record) -> str:
    client = str(record.cells.get("client", "")).strip()
    if not client:
        raise ConfigError(f"{record.where}: the client is empty")
    return client


def _fill(
    setting: str, path: Path, entries: dict[str, T], clients: list[str], fill: str
) -> dict[str, T]:
    """The run's clients, each with its own entry of the trace or, for those the trace omits, the
    trace's entry i mod entries (fill=cycle; one warning), or a ConfigError (fill=error)."""
    if fill not in ("cycle", "error"):
        raise ConfigError(f"system.fill={fill!r}: choose cycle or error")
    if not entries:
        raise ConfigError(f"{setting}: {path} lists no client")
    missing = [c for c in clients if c not in entries]
    if missing and fill == "error":
        raise ConfigError(
            f"{setting}: {path} lacks {len(missing)} of the run's {len(clients)} clients (first: "
            f"{', '.join(missing[:5])}); add them to the trace or set system.fill=cycle"
        )
    rows = list(entries.values())
    if missing:
        log.warning(
            "%s: %s holds %d of the run's %d clients; the other %d take the trace's entries by "
            "position (system.fill=cycle: the run's i-th client takes entry i mod %d)%s",
            setting,
            path,
            len(clients) - len(missing),
            len(clients),
            len(missing),
            len(rows),
            ignored_clients(entries, clients),
        )
    return {c: entries[c] if c in entries else rows[i % len(rows)] for i, c in enumerate(clients)}


def ignored_clients(entries: Mapping[str, object], clients: list[str], shown: int = 5) -> str:
    """The warning's note on the trace's clients the run lacks: how many, with the first `shown`
    ids ("" when none)."""
    extra = [c for c in entries if c not in set(clients)]
    if not extra:
        return ""
    ids = ", ".join(extra[:shown]) + (", ..." if len(extra) > shown else "")
    if len(extra) == 1:
        return f"; 1 trace client is not in the run and is ignored ({ids})"
    return f"; {len(extra)} trace clients are not in the run and are ignored ({ids})"


def _device(record: _Record) -> DeviceProfile:
    return DeviceProfile(
        flops_per_s=_required(record, "flops_per_s", positive=True),
        up_bps=_required(record, "up_bps", positive=True),
        down_bps=_required(record, "down_bps", positive=True),
        memory_mb=_number(record, "memory_mb", positive=True),
    )


def read_devices(spec: str) -> tuple[Path, dict[str, DeviceProfile]]:
    """A device trace file's profiles by client, in the file's order."""
    setting = "system.devices"
    path, records = _records(setting, spec, DEVICE_COLUMNS, DEVICE_COLUMNS[:4])
    devices: dict[str, DeviceProfile] = {}
    first: dict[str, str] = {}
    for record in records:
        client = _client(record)
        if client in devices:
            raise ConfigError(f"{record.where}: client {client!r} again (first at {first[client]})")
        devices[client] = _device(record)
        first[client] = record.where.rsplit(", ", 1)[-1]
    return path, devices


def load_devices(
    spec: str, clients: list[str], seed: int, fill: str = "cycle"
) -> dict[str, DeviceProfile]:
    """Each of `clients`' DeviceProfile: drawn (spec `synthetic`, from seed and client name) or
    read from a .csv / .json trace (the module's docstring) and filled by `fill`."""
    if spec == "synthetic":
        return {client: synthetic_device(seed, client) for client in clients}
    path, devices = read_devices(spec)
    return _fill("system.devices", path, devices, clients, fill)


def _interval(record: _Record) -> tuple[float, float, float | None] | None:
    """(start, end, period) of a row; None for a row that lists a never-online client."""
    start, end = _number(record, "start_s"), _number(record, "end_s")
    period = _number(record, "period_s", positive=True)
    if start is None and end is None:
        return None
    if start is None or end is None:
        raise ConfigError(f"{record.where}: give both start_s and end_s, or neither")
    if not 0.0 <= start < math.inf:
        raise ConfigError(f"{record.where}: start_s must be >= 0 and finite, not {start:g}")
    if end <= start:
        raise ConfigError(f"{record.where}: end_s {end:g} must be after start_s {start:g}")
    if period is not None and end > period:
        raise ConfigError(
            f"{record.where}: end_s {end:g} lies beyond period_s {period:g}; a repeating "
            "client's intervals lie within [0, period_s]"
        )
    return start, end, period


def merged(intervals: Sequence[tuple[float, float]], period: float | None = None) -> Schedule:
    """The Schedule of possibly overlapping or touching intervals (sorted and joined)."""
    starts: list[float] = []
    ends: list[float] = []
    for start, end in sorted(intervals):
        if starts and start <= ends[-1]:
            ends[-1] = max(ends[-1], end)
        else:
            starts.append(start)
            ends.append(end)
    return Schedule(tuple(starts), tuple(ends), period)


def read_availability(spec: str) -> tuple[Path, dict[str, Schedule]]:
    """An availability trace file's schedules by client, in the order clients first appear."""
    setting = "system.availability"
    path, records = _records(setting, spec, INTERVAL_COLUMNS, INTERVAL_COLUMNS[:3])
    intervals: dict[str, list[tuple[float, float]]] = {}
    periods: dict[str, tuple[float | None, str]] = {}
    for record in records:
        client = _client(record)
        row = _interval(record)
        intervals.setdefault(client, [])
        if row is None:
            continue
        period, first = periods.setdefault(client, (row[2], record.where))
        if row[2] != period:
            raise ConfigError(
                f"{record.where}: period_s {row[2]} differs from the {period} of client "
                f"{client!r}'s first interval ({first.rsplit(', ', 1)[-1]})"
            )
        intervals[client].append(row[:2])
    schedules = {
        client: merged(spans, periods.get(client, (None, ""))[0])
        for client, spans in intervals.items()
    }
    return path, schedules


def load_availability(
    spec: str, clients: list[str], seed: int, fill: str = "cycle"
) -> Availability:
    """Each of `clients`' Schedule: from a registered availability model (settings/clock.py
    `AVAILABILITY`: `always` online, `synthetic` a daily window drawn from seed and client name, or
    a plug-in's) or read from a .csv / .json trace (the module's docstring) and filled by `fill`."""
    from fedac.settings.clock import AVAILABILITY  # (settings: the core layer)

    if spec in AVAILABILITY:
        return Availability(model_schedules(spec, AVAILABILITY.load(spec)(clients, seed), clients))
    path, schedules = read_availability(spec)
    return Availability(_fill("system.availability", path, schedules, clients, fill))


def model_schedules(name: str, schedules: object, clients: list[str]) -> dict[str, Schedule]:
    """An availability model's answer checked: a Schedule for each of `clients` (a ConfigError
    naming the model and the first client it got wrong)."""
    if not isinstance(schedules, Mapping):
        raise ConfigError(
            f"availability model {name!r} returned {type(schedules).__name__}; it must return "
            "{client: Schedule} (docs/extending.md)"
        )
    for client in clients:
        if not isinstance(schedules.get(client), Schedule):
            raise ConfigError(
                f"availability model {name!r} gave client {client!r} "
                f"{type(schedules.get(client)).__name__}, not a fedac.data.traces.Schedule"
            )
    return {client: schedules[client] for client in clients}


def always_online(clients: list[str], seed: int) -> dict[str, Schedule]:
    """Every client online at every instant (`system.availability=always`)."""
    return {client: ALWAYS for client in clients}


def synthetic_availability(clients: list[str], seed: int) -> dict[str, Schedule]:
    """Each client's daily online window (`synthetic_schedule`), drawn from seed and client name."""
    return {client: synthetic_schedule(seed, client) for client in clients}


# ---- synthetic traces -------------------------------------------------------------------------


def _three_figures(x: float) -> float:
    """x to three significant figures: a trace's precision, and readable when written."""
    return float(f"{x:.3g}")


def synthetic_device(seed: int, client: str) -> DeviceProfile:
    """One client's log-normal device (the SYNTHETIC_* constants), from (seed, client) alone."""
    z = numpy_rng(seed, "synthetic-device", client).standard_normal(5)
    shared, own = math.sqrt(SYNTHETIC_LINK_CORRELATION), math.sqrt(1 - SYNTHETIC_LINK_CORRELATION)
    link_up, link_down = shared * z[1] + own * z[2], shared * z[1] + own * z[3]
    memory = SYNTHETIC_MEMORY_MEDIAN_MB * math.exp(SYNTHETIC_MEMORY_SIGMA * z[4])
    step = SYNTHETIC_MEMORY_STEP_MB
    return DeviceProfile(
        flops_per_s=_three_figures(SYNTHETIC_FLOPS_MEDIAN * math.exp(SYNTHETIC_FLOPS_SIGMA * z[0])),
        up_bps=_three_figures(SYNTHETIC_UP_MEDIAN * math.exp(SYNTHETIC_BANDWIDTH_SIGMA * link_up)),
        down_bps=_three_figures(
            SYNTHETIC_DOWN_MEDIAN * math.exp(SYNTHETIC_BANDWIDTH_SIGMA * link_down)
        ),
        memory_mb=max(step, round(memory / step) * step),
    )


def synthetic_schedule(seed: int, client: str) -> Schedule:
    """One client's daily online window: it starts at a uniform whole second of the day (the
    client's time zone and habits) and lasts SYNTHETIC_WINDOW_S, repeating every DAY_S; a window
    that crosses midnight is two intervals of the period."""
    rng = numpy_rng(seed, "synthetic-availability", client)
    start = float(rng.integers(0, int(DAY_S)))
    length = float(rng.integers(SYNTHETIC_WINDOW_S[0], SYNTHETIC_WINDOW_S[1] + 1))
    end = start + length
    spans = [(start, end)] if end <= DAY_S else [(start, DAY_S), (0.0, end - DAY_S)]
    return merged(spans, DAY_S)


# ---- writing traces ---------------------------------------------------------------------------


def _cell(x: float | None) -> str:
    """A number as written to a trace: up to 12 significant figures, `inf`, or empty for None."""
    return "" if x is None else format(x, ".12g")


def _write_rows(path: Path, header: Sequence[str], rows: Iterator[Sequence[str]]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(header)
        for row in rows:
            writer.writerow(row)
            count += 1
    return count


def write_devices(path: Path, devices: Mapping[str, DeviceProfile]) -> int:
    """A device trace CSV (memory_mb included when any device has one); returns its rows."""
    with_memory = any(d.memory_mb is not None for d in devices.values())
    header = DEVICE_COLUMNS if with_memory else DEVICE_COLUMNS[:4]
    rows = (
        [client, *map(_cell, (d.flops_per_s, d.up_bps, d.down_bps, d.memory_mb))][: len(header)]
        for client, d in devices.items()
    )
    return _write_rows(path, header, rows)


def write_availability(path: Path, schedules: Mapping[str, Schedule]) -> int:
    """An availability trace CSV: one row per interval (period_s when the client repeats), one row
    with empty times per never-online client; returns its rows."""

    def rows() -> Iterator[list[str]]:
        for client, s in schedules.items():
            if not s.starts:
                yield [client, "", "", ""]
            for start, end in zip(s.starts, s.ends):
                yield [client, _cell(start), _cell(end), _cell(s.period)]

    return _write_rows(path, INTERVAL_COLUMNS, rows())


def _fresh(out: Path) -> tuple[Path, Path]:
    """out/devices.csv and out/availability.csv, refused before anything is written if either
    exists (a trace may have been edited by hand)."""
    paths = out / "devices.csv", out / "availability.csv"
    for path in paths:
        if path.exists():
            raise ConfigError(f"{path} exists; remove it or choose another --out")
    return paths


def write_synthetic(out: Path, clients: list[str], seed: int) -> dict[str, int]:
    """`synthetic` devices and availability of `clients` as out/devices.csv and
    out/availability.csv: the numbers the settings draw for these names and this seed."""
    devices, availability = _fresh(out)
    return {
        "devices": write_devices(devices, {c: synthetic_device(seed, c) for c in clients}),
        "intervals": write_availability(
            availability, {c: synthetic_schedule(seed, c) for c in clients}
        ),
    }


# ---- FedScale's traces ------------------------------------------------------------------------

FEDSCALE_REFERENCE_GFLOPS = 0.6
"""FLOPs (in G) of the one-sample inference that FedScale's `computation` times: the trace does
not name its model; fedac assumes MobileNet V2 at 224 x 224 (about 0.3 G multiply-adds, 0.6
GFLOP), the usual on-device benchmark model (`--reference-gflops` sets another)."""


def _unpickled(path: Path, what: str) -> dict:
    """A FedScale trace pickle's dict. Unpickling runs code: only a file the user names."""
    try:
        with path.open("rb") as f:
            data = pickle.load(f)
    except OSError as exc:
        raise ConfigError(f"FedScale {what} trace {path}: cannot be read ({exc})") from exc
    except Exception as exc:  # (whatever a broken pickle raises)
        raise ConfigError(f"FedScale {what} trace {path}: not a pickle ({exc})") from exc
    if not isinstance(data, dict) or not data:
        raise ConfigError(
            f"FedScale {what} trace {path}: expected a non-empty dict client id -> record, "
            f"found {type(data).__name__}{' (empty)' if isinstance(data, dict) else ''}"
        )
    return data


def _fedscale_fields(path: Path, key: object, value: object, fields: Sequence[str]) -> dict:
    if not isinstance(value, dict) or any(f not in value for f in fields):
        raise ConfigError(
            f"FedScale trace {path}: client {key!r} holds {value!r:.80}; expected a dict with "
            f"{', '.join(fields)}"
        )
    return value


def _fedscale_number(path: Path, key: object, field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"FedScale trace {path}: client {key!r}'s {field} {value!r} is no number")
    number = float(value)
    if not math.isfinite(number):
        raise ConfigError(f"FedScale trace {path}: client {key!r}'s {field} is {number}")
    return number


def fedscale_devices(path: Path, reference_gflops: float) -> dict[str, DeviceProfile]:
    """FedScale's device capacity pickle ({client: {'computation': ms per sample of the reference
    inference, 'communication': kbit/s}}) as profiles: flops_per_s = reference FLOPs / (computation
    / 1000) and up_bps = down_bps = communication x 1000. Training FLOPs (forward + backward, about
    3x the forward pass) divided by this speed give FedScale's time, which is 3x the inference
    time."""
    devices = {}
    for key, value in _unpickled(path, "device").items():
        record = _fedscale_fields(path, key, value, ("computation", "communication"))
        ms = _fedscale_number(path, key, "computation", record["computation"])
        kbps = _fedscale_number(path, key, "communication", record["communication"])
        if ms <= 0 or kbps <= 0:
            raise ConfigError(
                f"FedScale trace {path}: client {key!r} has computation {ms:g} ms and "
                f"communication {kbps:g} kbit/s; both must be > 0"
            )
        devices[str(key)] = DeviceProfile(
            reference_gflops * 1e9 / (ms / 1000), kbps * 1e3, kbps * 1e3
        )
    return devices


def _fedscale_spans(path: Path, key: object, record: dict) -> tuple[list[tuple[float, float]], int]:
    """A client's intervals within [0, finish_time] (active[i] to inactive[i]; a last active
    without its inactive runs to finish_time) and how many were cut to fit or dropped as empty."""
    finish = _fedscale_number(path, key, "finish_time", record["finish_time"])
    active, inactive = record["active"], record["inactive"]
    if (
        finish <= 0
        or not isinstance(active, (list, tuple))
        or not isinstance(inactive, (list, tuple))
    ):
        raise ConfigError(
            f"FedScale trace {path}: client {key!r} needs finish_time > 0 and lists active and "
            f"inactive (found {finish:g}, {type(active).__name__}, {type(inactive).__name__})"
        )
    if not len(inactive) <= len(active) <= len(inactive) + 1:
        raise ConfigError(
            f"FedScale trace {path}: client {key!r} has {len(active)} active and {len(inactive)} "
            "inactive times; each active time needs its inactive one (the last may run to "
            "finish_time)"
        )
    ends = [*inactive, finish][: len(active)]
    spans, adjusted = [], 0
    for i, (a, b) in enumerate(zip(active, ends)):
        start = _fedscale_number(path, key, f"active[{i}]", a)
        end = _fedscale_number(path, key, f"inactive[{i}]", b)
        if end < start:
            raise ConfigError(
                f"FedScale trace {path}: client {key!r} goes inactive at {end:g} before it is "
                f"active at {start:g} (interval {i})"
            )
        start, end, cut = max(start, 0.0), min(end, finish), start < 0 or end > finish
        adjusted += cut or end <= start
        if end > start:
            spans.append((start, end))
    return spans, adjusted


def fedscale_schedules(path: Path) -> tuple[dict[str, Schedule], int]:
    """FedScale's behaviour pickle ({client: {'active': [s], 'inactive': [s], 'finish_time': s,
    ...}}: online from active[i] to inactive[i], repeating every finish_time; 'duration' and
    'model' are not used) as schedules, and how many intervals were cut to [0, finish_time] or
    dropped as empty."""
    schedules, adjusted = {}, 0
    for key, value in _unpickled(path, "behaviour").items():
        record = _fedscale_fields(path, key, value, ("active", "inactive", "finish_time"))
        spans, cut = _fedscale_spans(path, key, record)
        finish = float(record["finish_time"])
        schedules[str(key)] = merged(spans, finish)
        adjusted += cut
    return schedules, adjusted


def import_fedscale(
    device_pkl: Path,
    behaviour_pkl: Path,
    out: Path,
    reference_gflops: float = FEDSCALE_REFERENCE_GFLOPS,
) -> dict[str, int]:
    """FedScale's device and behaviour pickles as out/devices.csv and out/availability.csv.
    Unpickling runs code: import only trusted files."""
    if not reference_gflops > 0:
        raise ConfigError(f"--reference-gflops must be > 0, not {reference_gflops:g}")
    devices_csv, availability_csv = _fresh(out)
    devices = fedscale_devices(device_pkl, reference_gflops)
    schedules, adjusted = fedscale_schedules(behaviour_pkl)
    return {
        "devices": write_devices(devices_csv, devices),
        "clients": len(schedules),
        "intervals": write_availability(availability_csv, schedules),
        "never_online": sum(not s.starts for s in schedules.values()),
        "adjusted": adjusted,
    }
