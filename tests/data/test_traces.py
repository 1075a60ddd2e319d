"""Device and availability traces (data/traces.py): the file formats and their errors, the fill
policies, the synthetic model, the queries against a hand computation and a brute-force scan, the
FedScale import and `fedac data import-trace`."""

from __future__ import annotations

import csv
import json
import logging
import math
import pickle
import time
from pathlib import Path

import numpy as np
import pytest

from fedac.cli import main
from fedac.data import traces
from fedac.data.traces import (
    DeviceProfile,
    Schedule,
    ignored_clients,
    load_availability,
    load_devices,
    merged,
    synthetic_device,
)
from fedac.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
GSC_CLIENTS = 2618  # the Speech Commands stand-in's clients


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


# ---- the formats ------------------------------------------------------------------------------


def test_device_csv_with_and_without_memory(tmp_path):
    spec = write(
        tmp_path / "d.csv",
        "client,flops_per_s,up_bps,down_bps,memory_mb\na,1e9,2e6,8e6,4096\nb,5e8,1e6,4e6,\n",
    )
    assert load_devices(spec, ["a", "b"], seed=0) == {
        "a": DeviceProfile(1e9, 2e6, 8e6, 4096.0),
        "b": DeviceProfile(5e8, 1e6, 4e6, None),
    }
    short = write(tmp_path / "e.csv", "down_bps,client,up_bps,flops_per_s\n3,x,2,1\n")
    assert load_devices(short, ["x"], 0) == {"x": DeviceProfile(1.0, 2.0, 3.0)}


def test_device_json_as_a_list_and_keyed_by_client(tmp_path):
    rows = [{"client": "a", "flops_per_s": 1e9, "up_bps": 2e6, "down_bps": 8e6, "memory_mb": 4096}]
    keyed = {"b": {"flops_per_s": "5e8", "up_bps": 1e6, "down_bps": 4e6}}
    assert load_devices(write(tmp_path / "l.json", json.dumps(rows)), ["a"], 0) == {
        "a": DeviceProfile(1e9, 2e6, 8e6, 4096.0)
    }
    assert load_devices(write(tmp_path / "k.json", json.dumps(keyed)), ["b"], 0) == {
        "b": DeviceProfile(5e8, 1e6, 4e6)
    }


def test_availability_csv_and_json_give_the_same_schedules(tmp_path):
    text = (
        "client,start_s,end_s,period_s\n"
        "a,10,20,100\na,15,30,100\na,50,60,100\n"  # overlapping rows merge
        "b,0,5,\nb,5,inf,\n"  # touching rows merge; inf: for ever
        "c,,,\n"  # never online
    )
    from_csv = load_availability(write(tmp_path / "a.csv", text), ["a", "b", "c"], 0)
    keyed = {
        "a": [
            {"start_s": 10, "end_s": 30, "period_s": 100},
            {"start_s": 50, "end_s": 60, "period_s": 100},
        ],
        "b": [{"start_s": 0, "end_s": "inf"}],
        "c": [],
    }
    listed = [{"client": "b", "start_s": 0, "end_s": 1e300}, {"client": "c"}]
    from_json = load_availability(write(tmp_path / "a.json", json.dumps(keyed)), list(keyed), 0)
    assert (
        from_csv.schedules
        == from_json.schedules
        == {
            "a": Schedule((10.0, 50.0), (30.0, 60.0), 100.0),
            "b": Schedule((0.0,), (math.inf,)),
            "c": Schedule((), ()),
        }
    )
    assert from_csv.never_online() == ["c"]
    from_list = load_availability(write(tmp_path / "l.json", json.dumps(listed)), ["b", "c"], 0)
    assert from_list.schedules == {"b": Schedule((0.0,), (1e300,)), "c": Schedule((), ())}


# ---- bad input --------------------------------------------------------------------------------

DEVICE_HEAD = "client,flops_per_s,up_bps,down_bps\n"
INTERVAL_HEAD = "client,start_s,end_s,period_s\n"
BAD_FILES = {
    "malformed row": ("d.csv", DEVICE_HEAD + "a,1,1,1\nb,1,1\n", ["line 3", "malformed row"]),
    "unknown column": (
        "d.csv",
        "client,flops_per_s,up_bps,down_bps,ram\na,1,1,1,1\n",
        ["line 1", "'ram'", "client, flops_per_s, up_bps, down_bps, memory_mb"],
    ),
    "missing column": ("d.csv", "client,flops_per_s,up_bps\na,1,1\n", ["line 1", "'down_bps'"]),
    "zero speed": ("d.csv", DEVICE_HEAD + "a,1,1,1\nb,0,1,1\n", ["line 3", "flops_per_s"]),
    "negative bandwidth": ("d.csv", DEVICE_HEAD + "a,1,-5,1\n", ["line 2", "up_bps"]),
    "not a number": ("d.csv", DEVICE_HEAD + "\na,1,1,fast\n", ["line 3", "'fast'"]),
    "duplicate client": (
        "d.csv",
        DEVICE_HEAD + "a,1,1,1\nb,1,1,1\na,2,2,2\n",
        ["line 4", "'a'", "line 2"],
    ),
    "json entry": (
        "d.json",
        json.dumps(
            [
                {"client": "a", "flops_per_s": 1, "up_bps": 1, "down_bps": 1},
                {"client": "b", "flops_per_s": 1, "up_bps": 1, "down_bps": 0},
            ]
        ),
        ["entry 1", "down_bps"],
    ),
    "json unknown key": (
        "d.json",
        json.dumps({"a": {"flops_per_s": 1, "up_bps": 1, "down_bps": 1, "gpu": 1}}),
        ["key 'a'", "'gpu'", "memory_mb"],
    ),
    "not json": ("d.json", '[{"client": "a",\n', ["line 2", "not JSON"]),
    "end before start": ("a.csv", INTERVAL_HEAD + "a,0,5,\na,9,9,\n", ["line 3", "end_s 9"]),
    "end beyond period": ("a.csv", INTERVAL_HEAD + "a,0,120,100\n", ["line 2", "period_s 100"]),
    "two periods": (
        "a.csv",
        INTERVAL_HEAD + "a,0,10,100\nb,0,1,\na,20,30,50\n",
        ["line 4", "line 2"],
    ),
    "half an interval": ("a.csv", INTERVAL_HEAD + "a,0,,\n", ["line 2", "both start_s and end_s"]),
    "json interval": (
        "a.json",
        json.dumps({"a": [{"start_s": 0, "end_s": 5}, {"start_s": "x", "end_s": 9}]}),
        ["key 'a', entry 1", "start_s 'x'"],
    ),
}


@pytest.mark.parametrize("case", BAD_FILES, ids=list(BAD_FILES))
def test_bad_trace_names_the_file_and_the_line(tmp_path, case):
    name, text, expected = BAD_FILES[case]
    spec = write(tmp_path / name, text)
    load = load_devices if name.startswith("d") else load_availability
    with pytest.raises(ConfigError) as err:
        load(spec, ["a", "b"], 0)
    message = str(err.value)
    assert spec in message, message
    for part in expected:
        assert part in message, (part, message)


def test_unknown_spec_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="synthetic or the path of a .csv or .json"):
        load_devices("fast", ["a"], 0)
    with pytest.raises(ConfigError, match="not found"):
        load_availability(str(tmp_path / "gone.csv"), ["a"], 0)


# ---- filling the clients a trace omits --------------------------------------------------------


def test_fill_cycle_maps_the_missing_clients_by_position_with_one_warning(tmp_path, caplog):
    spec = write(tmp_path / "d.csv", DEVICE_HEAD + "x,1,1,1\nc,3,3,3\ny,2,2,2\nz,9,9,9\n")
    clients = ["a", "b", "c", "d", "e"]
    with caplog.at_level(logging.WARNING, logger="fedac.data.traces"):
        devices = load_devices(spec, clients, 0, fill="cycle")
    # c keeps its own row; the others take row i mod 4 of (x, c, y, z): a->x, b->c, d->z, e->x
    assert [devices[c].flops_per_s for c in clients] == [1.0, 3.0, 3.0, 9.0, 1.0]
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert "1 of the run's 5 clients" in message and "the other 4" in message
    assert "cycle" in message
    assert message.endswith("; 3 trace clients are not in the run and are ignored (x, y, z)")


def test_the_ignored_trace_clients_are_named_with_the_right_number():
    clients = ["a", "b"]
    assert ignored_clients({"a": 1, "b": 2}, clients) == ""
    assert ignored_clients({"a": 1, "q": 2}, clients) == (
        "; 1 trace client is not in the run and is ignored (q)"
    )
    many = {f"t{i}": i for i in range(7)}
    assert ignored_clients(many, clients) == (
        "; 7 trace clients are not in the run and are ignored (t0, t1, t2, t3, t4, ...)"
    )


def test_fill_error_names_how_many_and_the_first_missing(tmp_path):
    spec = write(tmp_path / "a.csv", INTERVAL_HEAD + "b,0,10,\n")
    clients = [f"c{i}" for i in range(8)] + ["b"]
    with pytest.raises(ConfigError) as err:
        load_availability(spec, clients, 0, fill="error")
    assert "lacks 8 of the run's 9 clients (first: c0, c1, c2, c3, c4)" in str(err.value)
    assert spec in str(err.value)
    complete = load_availability(spec, ["b"], 0, fill="error")
    assert complete.online("b", 5.0) and not complete.online("b", 10.0)


# ---- the queries ------------------------------------------------------------------------------


@pytest.fixture
def three(tmp_path):
    """a: period 100, [0, 20) [50, 70) [90, 100): its last interval runs on into the next period's
    first. b: period 50, [10, 20). c: once, [5, 15) [15, 25) (touching: one) and [40, inf)."""
    text = INTERVAL_HEAD + (
        "a,90,100,100\na,0,20,100\na,50,70,100\n"
        "b,10,20,50\n"
        "c,5,15,\nc,15,25,\nc,40,inf,\n"
        "d,0,100,100\n"
    )
    return load_availability(write(tmp_path / "a.csv", text), ["a", "b", "c", "d"], 0)


@pytest.mark.parametrize(
    "client, t, online, until, following",
    [
        ("a", 0, True, 20, 0),
        ("a", 20, False, 20, 50),  # end excluded
        ("a", 30, False, 30, 50),
        ("a", 75, False, 75, 90),
        ("a", 95, True, 120, 95),  # wraps over the period into [100, 120)
        ("a", 105, True, 120, 105),
        ("a", 195, True, 220, 195),
        ("a", 170, False, 170, 190),
        ("b", 0, False, 0, 10),
        ("b", 15, True, 20, 15),
        ("b", 25, False, 25, 60),  # the next period's interval
        ("b", 65, True, 70, 65),
        ("c", 0, False, 0, 5),
        ("c", 10, True, 25, 10),
        ("c", 30, False, 30, 40),
        ("c", 1e9, True, math.inf, 1e9),
        ("d", 250, True, math.inf, 250),  # online over the whole period
    ],
)
def test_queries_against_a_hand_computation(three, client, t, online, until, following):
    assert three.online(client, t) is online
    assert three.online_until(client, t) == until
    assert three.next_online(client, t) == following
    assert three.never_online() == []


def brute_online(spans, period, t):
    tau = t % period if period else t
    return any(start <= tau < end for start, end in spans)


def brute_scan(spans, period, t, want, horizon):
    """The first whole second >= t at which online == want (math.inf past the horizon)."""
    s = t
    while s < t + horizon:
        if brute_online(spans, period, s) == want:
            return s
        s += 1
    return math.inf


def test_queries_against_a_brute_force_scan():
    rng = np.random.default_rng(7)
    for case in range(40):
        period = int(rng.integers(5, 30)) if case % 4 else None
        top = period or 60
        spans = []
        for _ in range(int(rng.integers(0, 5))):
            start = int(rng.integers(0, top))
            spans.append((start, int(rng.integers(start + 1, top + 1))))
        schedule = merged([(float(a), float(b)) for a, b in spans], period)
        horizon = 3 * top + 2
        for t in range(0, 3 * top):
            on = brute_online(spans, period, t)
            assert schedule.online(t) is on, (spans, period, t)
            until = brute_scan(spans, period, t, False, horizon) if on else t
            assert schedule.online_until(t) == until, (spans, period, t)
            assert schedule.next_online(t) == brute_scan(spans, period, t, True, horizon)


def test_a_time_keeps_its_place_within_the_period_despite_rounding():
    """1.7 / 0.1 rounds to 17.0 although 17 x 0.1 = 1.7000000000000002 > 1.7: the time is placed at
    the end of the 16th period, not before the start of the 17th."""
    schedule = merged([(0.0, 0.05), (0.09, 0.1)], 0.1)
    for t in (1.7, 3.4, 3.9, 6.8):
        offset, tau, _ = schedule._locate(t)
        assert 0.0 <= tau < 0.1 and offset <= t, t
        assert schedule.online(t)  # in [0.09, 0.1), running on into the next period
        assert schedule.online_until(t) == pytest.approx(t + 0.05, abs=1e-12)


# ---- synthetic --------------------------------------------------------------------------------

CLIENTS = [f"speaker{i}" for i in range(GSC_CLIENTS)]


def test_synthetic_devices_are_seeded_per_client_and_heavy_tailed():
    first = load_devices("synthetic", CLIENTS, seed=3)
    assert first == load_devices("synthetic", CLIENTS, seed=3)
    other = load_devices("synthetic", CLIENTS, seed=4)
    assert sum(first[c] != other[c] for c in CLIENTS) == len(CLIENTS)
    # a client's device depends on its name and the seed only, not on the run's other clients
    assert load_devices("synthetic", CLIENTS[5:9][::-1], seed=3) == {
        c: first[c] for c in CLIENTS[5:9]
    }
    for field, median, sigma in (
        ("flops_per_s", traces.SYNTHETIC_FLOPS_MEDIAN, traces.SYNTHETIC_FLOPS_SIGMA),
        ("up_bps", traces.SYNTHETIC_UP_MEDIAN, traces.SYNTHETIC_BANDWIDTH_SIGMA),
        ("down_bps", traces.SYNTHETIC_DOWN_MEDIAN, traces.SYNTHETIC_BANDWIDTH_SIGMA),
    ):
        values = np.array([getattr(first[c], field) for c in CLIENTS])
        p1, p50, p99 = np.percentile(values, [1, 50, 99])
        assert p99 / p50 > 10 and p50 / p1 > 10, field  # the slow tail too
        # 2,618 draws: the median within 10 %, the log-sd within 0.1 of the stated values
        assert p50 == pytest.approx(median, rel=0.1), field
        assert np.log(values).std() == pytest.approx(sigma, abs=0.1), field
    memory = np.array([first[c].memory_mb for c in CLIENTS])
    assert np.median(memory) == pytest.approx(traces.SYNTHETIC_MEMORY_MEDIAN_MB, rel=0.1)
    assert (memory % traces.SYNTHETIC_MEMORY_STEP_MB == 0).all()


def test_synthetic_availability_is_a_daily_window_with_most_clients_online():
    availability = load_availability("synthetic", CLIENTS, seed=3)
    again = load_availability("synthetic", CLIENTS, seed=3)
    other = load_availability("synthetic", CLIENTS, seed=4)
    assert availability.schedules == again.schedules != other.schedules
    low, high = traces.SYNTHETIC_WINDOW_S
    for schedule in availability.schedules.values():
        assert schedule.period == traces.DAY_S
        online = sum(e - s for s, e in zip(schedule.starts, schedule.ends))
        assert low <= online <= high
    shares = [np.mean([availability.online(c, t) for c in CLIENTS]) for t in range(0, 86400, 3600)]
    assert 0.5 < min(shares) and max(shares) < 0.67  # 14 h of 24 on average: 58 %
    assert availability.never_online() == []


# ---- FedScale's pickles and the command ---------------------------------------------------------


def fedscale_pickles(tmp_path: Path) -> tuple[Path, Path]:
    device = {
        101: {"computation": 162.0, "communication": 5648.0},
        102: {"computation": 50, "communication": 1000},
    }
    behaviour = {
        101: {
            "duration": 9,
            "inactive": [300, 900],
            "finish_time": 1000,
            "active": [100, 600],
            "model": "m",
        },
        102: {
            "duration": 9,
            "inactive": [200],
            "finish_time": 800,
            "active": [0, 500],
            "model": "m",
        },  # ragged: the last interval runs to finish_time
        103: {"duration": 9, "inactive": [50], "finish_time": 100, "active": [50], "model": "m"},
    }
    paths = tmp_path / "device.pkl", tmp_path / "behave.pkl"
    for path, data in zip(paths, (device, behaviour)):
        path.write_bytes(pickle.dumps(data))
    return paths


def rows(path: Path) -> list[list[str]]:
    with path.open(newline="") as f:
        return list(csv.reader(f))


def import_trace(device: Path, behaviour: Path, out: Path, *options: str) -> int:
    return main(
        [
            "data",
            "import-trace",
            "--fedscale",
            str(device),
            str(behaviour),
            "--out",
            str(out),
            *options,
        ]
    )


def test_fedscale_import_writes_the_hand_computed_rows(tmp_path):
    device, behaviour = fedscale_pickles(tmp_path)
    assert import_trace(device, behaviour, tmp_path / "out") == 0
    # 0.6 GFLOP in 162 ms: 3.7037e9 FLOP/s; in 50 ms: 1.2e10; 5648 kbit/s: 5.648e6 bit/s
    assert rows(tmp_path / "out" / "devices.csv") == [
        ["client", "flops_per_s", "up_bps", "down_bps"],
        ["101", "3703703703.7", "5648000", "5648000"],
        ["102", "12000000000", "1000000", "1000000"],
    ]
    assert rows(tmp_path / "out" / "availability.csv") == [
        ["client", "start_s", "end_s", "period_s"],
        ["101", "100", "300", "1000"],
        ["101", "600", "900", "1000"],
        ["102", "0", "200", "800"],
        ["102", "500", "800", "800"],
        ["103", "", "", ""],  # its one interval is empty: never online
    ]
    availability = load_availability(
        str(tmp_path / "out" / "availability.csv"), ["101", "102", "103"], 0
    )
    assert availability.never_online() == ["103"]
    assert availability.online_until("102", 600) == 1000  # [500, 800) joins [800, 1000)
    # the reference model's FLOPs scale the speeds, nothing else
    assert import_trace(device, behaviour, tmp_path / "big", "--reference-gflops", "1.2") == 0
    big = load_devices(str(tmp_path / "big" / "devices.csv"), ["101"], 0)["101"]
    # (written to 12 significant figures)
    assert big.flops_per_s == pytest.approx(1.2e9 / 0.162, rel=1e-11)
    assert (big.up_bps, big.down_bps) == (5648000.0, 5648000.0)


@pytest.mark.parametrize(
    "which, data, expected",
    [
        ("device", [1, 2], "expected a non-empty dict"),
        ("device", {7: {"computation": 1.0}}, "client 7"),
        ("device", {7: {"computation": 0.0, "communication": 5.0}}, "client 7"),
        ("behaviour", {"u": {"active": [5], "inactive": [2], "finish_time": 9}}, "client 'u'"),
        ("behaviour", {"u": {"active": [1], "inactive": [2, 4], "finish_time": 9}}, "client 'u'"),
        ("behaviour", {"u": {"active": ["x"], "inactive": [2], "finish_time": 9}}, "no number"),
    ],
)
def test_fedscale_import_refuses_a_bad_pickle(tmp_path, capsys, which, data, expected):
    device, behaviour = fedscale_pickles(tmp_path)
    bad = device if which == "device" else behaviour
    bad.write_bytes(pickle.dumps(data))
    out = tmp_path / "out"
    assert import_trace(device, behaviour, out) == 2
    message = capsys.readouterr().err
    assert str(bad) in message and expected in message, message
    assert not out.exists()  # nothing half-written


def test_synthetic_trace_command_round_trips_and_never_overwrites(tmp_path, capsys):
    out = tmp_path / "t"
    assert (
        main(["data", "import-trace", "--synthetic", "12", "--seed", "5", "--out", str(out)]) == 0
    )
    names = [f"client{i:02d}" for i in range(12)]
    assert load_devices(str(out / "devices.csv"), names, 0, fill="error") == load_devices(
        "synthetic", names, 5
    )
    written = load_availability(str(out / "availability.csv"), names, 0, fill="error")
    assert written.schedules == load_availability("synthetic", names, 5).schedules
    before = (out / "devices.csv").read_text()
    assert main(["data", "import-trace", "--synthetic", "3", "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err
    assert (out / "devices.csv").read_text() == before


def test_data_help_lists_import_trace(capsys):
    with pytest.raises(SystemExit):
        main(["data", "--help"])
    assert "import-trace" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["data", "import-trace", "--help"])
    assert "runs code" in " ".join(capsys.readouterr().out.split())


def test_the_example_trace_is_the_stated_command_s_output():
    """configs/traces/ holds `fedac data import-trace --synthetic 20 --seed 0 --out
    configs/traces` (its README says so)."""
    folder = REPO / "configs" / "traces"
    names = [f"client{i:02d}" for i in range(20)]
    devices = load_devices(str(folder / "devices.csv"), names, 0, fill="error")
    assert devices == {c: synthetic_device(0, c) for c in names}
    availability = load_availability(str(folder / "availability.csv"), names, 0, fill="error")
    assert availability.schedules == load_availability("synthetic", names, 0).schedules
    assert "import-trace --synthetic 20 --seed 0" in (folder / "README.md").read_text()


def test_a_trace_of_the_gsc_clients_loads_well_under_a_second(tmp_path):
    traces.write_synthetic(tmp_path, CLIENTS, seed=0)
    start = time.perf_counter()
    devices = load_devices(str(tmp_path / "devices.csv"), CLIENTS, 0)
    availability = load_availability(str(tmp_path / "availability.csv"), CLIENTS, 0)
    took = time.perf_counter() - start
    assert len(devices) == len(availability.schedules) == GSC_CLIENTS
    assert took < 1.0, took  # measured 0.07 s (both files, 2,618 clients, about 4,200 intervals)
