"""The virtual clock (engine/clock/): a 3-client federation computed by hand (who arrives, when,
with what staleness weight, what each client is charged when the server stops it), then whole
runs: increasing virtual time with late and dropped clients,
two runs of one command alike, over-commitment shortening rounds, FedBuff stacked and resumed
exactly, a deadline no client can meet refused, and the clock off leaving a run as it was."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from fedac.config import load_config
from fedac.engine.clock import virtual
from fedac.engine.clock.asynchronous import AsyncSchedule
from fedac.engine.clock.book import ClientLedger, Job, SystemBook
from fedac.engine.clock.model import (
    ClientTimes,
    client_outcome,
    plan_sync_round,
    staleness_weight,
)
from fedac.engine.clock.schedule import IdealSchedule, traffic
from fedac.engine.clock.start import start_schedule
from fedac.engine.clock.virtual import SystemClock
from fedac.engine.data import build_federated_data
from fedac.engine.simulator import Simulator
from fedac.errors import ConfigError
from helpers import tiny_run

pytestmark = pytest.mark.usefixtures("one_thread")

DEVICES = """client,flops_per_s,up_bps,down_bps
a,1e6,8000,16000
b,1e5,16000,16000
c,1e6,8000,8000
"""
# (c's device goes offline at 1.0 s: before it can finish)
AVAILABILITY = """client,start_s,end_s
a,0,inf
b,0,inf
c,0,1.0
"""
FLOPS_PER_SAMPLE = 1e4
BYTES = 1000  # down and up


def hand_config(tmp_path: Path, settings, availability: str, devices: str = DEVICES):
    (tmp_path / "devices.csv").write_text(devices)
    (tmp_path / "availability.csv").write_text(availability)
    return load_config(
        overrides=[
            f"system.devices={tmp_path / 'devices.csv'}",
            f"system.availability={tmp_path / 'availability.csv'}",
            "train.batch_size=2",
            "train.local_epochs=1",
            *settings,
        ]
    )


SIZES = {"a": 4, "b": 6, "c": 2}


def hand_clock(
    tmp_path: Path, *settings: str, availability: str = AVAILABILITY, devices: str = DEVICES
) -> SystemClock:
    """Three clients of 4, 6 and 2 clips, batches of 2, one epoch: a [2, 2], b [2, 2, 2], c [2].
    a: down 8 x 1000 / 16000 = 0.5 s, steps 1e4 x 2 / 1e6 = 0.02 s each, up 1.0 s: 1.54 s.
    b: down 0.5, steps 0.2 each, up 0.5: 1.6 s.  c: down 1.0, one step 0.02, up 1.0: 2.02 s."""
    cfg = hand_config(tmp_path, settings, availability, devices)
    return SystemClock(cfg, SIZES, lambda _: "m", lambda _: FLOPS_PER_SAMPLE)


def hand_schedule(tmp_path: Path, *settings: str, availability: str = AVAILABILITY):
    """`hand_clock`'s federation under the schedule its settings choose (cohort K = 2)."""
    return start_schedule(
        hand_config(tmp_path, settings, availability),
        SIZES,
        2,
        compression=None,
        architecture=lambda _: "m",
        flops=lambda _: FLOPS_PER_SAMPLE,
    )


def test_a_clients_time_is_its_download_its_steps_and_its_upload(tmp_path):
    clock = hand_clock(tmp_path)
    a = clock.times("a", BYTES, BYTES)
    assert a.down_s == pytest.approx(0.5) and a.up_s == pytest.approx(1.0)
    assert a.step_s == pytest.approx((0.02, 0.02))
    assert clock.times("b", BYTES, BYTES).total == pytest.approx(1.6)
    assert clock.times("c", BYTES, BYTES).total == pytest.approx(2.02)


def test_a_sync_round_keeps_the_first_k_and_ends_at_the_kth(tmp_path):
    # over-commit 1.5 of K = 2: all three sampled; c goes offline at 1.0 s, a and b arrive
    clock = hand_clock(tmp_path, "system.overcommit=1.5")
    book = SystemBook()
    kept, metrics = clock.sync_round(book, 1, 2, BYTES, BYTES)
    assert [(o.client, o.status) for o in kept] == [("a", "arrived"), ("b", "arrived")]
    assert [o.at for o in kept] == pytest.approx([1.54, 1.6])
    assert book.time == pytest.approx(1.6) and metrics["round_s"] == pytest.approx(1.6)
    assert (metrics["sampled"], metrics["arrived"], metrics["dropped"], metrics["late"]) == (
        3,
        2,
        1,
        0,
    )
    # c spent its one second downloading; a its 0.04 s computing and 1.5 s sending
    assert book.client_columns("c")["comm_s"] == pytest.approx(1.0)
    assert book.client_columns("c")["dropped"] == 1
    assert book.client_columns("a")["compute_s"] == pytest.approx(0.04)
    assert book.client_columns("a")["comm_s"] == pytest.approx(1.5)


def test_a_deadline_makes_clients_late_and_partial_work_sends_the_steps_done(tmp_path):
    kept, metrics = hand_clock(tmp_path, "system.deadline=1.55").sync_round(
        SystemBook(), 1, 3, BYTES, BYTES
    )
    assert [o.client for o in kept] == ["a"]  # b needs 1.6 s
    assert (metrics["late"], metrics["dropped"], metrics["round_s"]) == (1, 1, pytest.approx(1.55))
    clock = hand_clock(tmp_path, "system.deadline=1.55", "system.partial=true")
    kept, _ = clock.sync_round(SystemBook(), 1, 3, BYTES, BYTES)
    # b: 1.55 - 0.5 - 0.5 = 0.55 s leaves two steps of 0.2: it arrives at 1.4 s with 4 of 6 clips
    assert [(o.client, o.steps) for o in kept] == [("b", 2), ("a", None)]
    assert kept[0].at == pytest.approx(1.4)
    assert clock.share_done("b", 2) == pytest.approx(4 / 6)


def test_over_commitment_and_dropout_by_hand():
    times = ClientTimes(1.0, (1.0, 1.0), 1.0)
    late = client_outcome("x", 10.0, times, math.inf, None, 2.5, False)
    assert (late.status, late.at) == ("late", 12.5)
    # offline after the deadline: late (it was told to stop first), not dropped
    assert client_outcome("x", 10.0, times, 13.0, None, 2.5, False).status == "late"
    assert client_outcome("x", 10.0, times, 12.0, None, 2.5, False).status == "dropped"
    dropped = client_outcome("x", 10.0, times, math.inf, 0.5, 0, False)
    assert (dropped.status, dropped.at, dropped.compute_s, dropped.comm_s) == (
        "dropped",
        12.0,
        1.0,
        1.0,
    )
    outcomes = [
        client_outcome(n, 0.0, ClientTimes(0, (t,), 0), math.inf, None, 0, False)
        for n, t in [("p", 3.0), ("q", 1.0), ("r", 2.0)]
    ]
    kept, end = plan_sync_round(0.0, outcomes, 2, 0)
    assert [o.client for o in kept] == ["q", "r"] and end == 2.0
    assert outcomes[0].status == "late" and outcomes[0].at == 2.0  # told to stop at the round's end


# c's device 100x slower: one step of 2 clips x 1e4 FLOPs / 1e4 FLOP/s = 2.0 s; c takes
# down 1.0 + 2.0 + up 1.0 = 4.0 s (a 1.54 s and b 1.6 s as in `hand_clock`)
SLOW_C = DEVICES.replace("c,1e6,8000,8000", "c,1e4,8000,8000")
ALWAYS3 = "client,start_s,end_s\na,0,inf\nb,0,inf\nc,0,inf\n"


def charged(book: SystemBook, client: str) -> tuple:
    """clients.csv's clock columns of `client`: compute_s, comm_s, arrived, late, dropped."""
    cols = book.client_columns(client)
    return (
        pytest.approx(cols["compute_s"]),
        pytest.approx(cols["comm_s"]),
        cols["arrived"],
        cols["late"],
        cols["dropped"],
    )


def clock_row(metrics: dict) -> tuple:
    return (
        pytest.approx(metrics["virtual_time_s"]),
        metrics["arrived"],
        metrics["late"],
        metrics["dropped"],
    )


def c_fails_at(monkeypatch, share: float) -> None:
    """system.dropout's draw fixed: c fails after `share` of its work, a and b never."""
    monkeypatch.setattr(virtual, "failure_point", lambda cfg, seed, key, c: {"c": share}.get(c))


def test_over_commitment_stops_a_client_before_its_device_leaves(tmp_path):
    """K = 2 of 3 sampled (over-commit 1.5): a arrives at 1.54 s, b at 1.6 s, which ends the
    round. c's device goes offline at 3.5 s, before c could finish (4.0 s), but the server told c
    to stop at 1.6 s: late, charged its 1.0 s download and 0.6 s of its step (not dropped at 3.5 s
    with 2.0 s of compute and 1.5 s of communication charged to a 1.6 s round)."""
    offline_later = AVAILABILITY.replace("c,0,1.0", "c,0,3.5")
    clock = hand_clock(
        tmp_path, "system.overcommit=1.5", availability=offline_later, devices=SLOW_C
    )
    book = SystemBook()
    kept, metrics = clock.sync_round(book, 1, 2, BYTES, BYTES)
    assert [o.client for o in kept] == ["a", "b"]
    assert clock_row(metrics) == (1.6, 2, 1, 0)
    assert book.time == pytest.approx(1.6)
    assert charged(book, "c") == (0.6, 1.0, 0, 1, 0)
    assert charged(book, "a") == (0.04, 1.5, 1, 0, 0)
    assert charged(book, "b") == (0.6, 1.0, 1, 0, 0)


def test_dropout_failing_after_the_deadline_is_late(tmp_path, monkeypatch):
    """Deadline 1.8 s, K = 3: a and b arrive (1.54 s, 1.6 s); c would fail at 0.9 x 4.0 = 3.6 s,
    after the deadline that stopped it: late at 1.8 s, charged 1.0 s download and 0.8 s of its
    step; the round ends at the deadline."""
    c_fails_at(monkeypatch, 0.9)
    clock = hand_clock(
        tmp_path, "system.deadline=1.8", "system.dropout=0.5", availability=ALWAYS3, devices=SLOW_C
    )
    book = SystemBook()
    kept, metrics = clock.sync_round(book, 1, 3, BYTES, BYTES)
    assert [o.client for o in kept] == ["a", "b"]
    assert clock_row(metrics) == (1.8, 2, 1, 0)
    assert charged(book, "c") == (0.8, 1.0, 0, 1, 0)


def test_dropout_failing_after_the_kth_arrival_is_late_and_before_it_dropped(tmp_path, monkeypatch):
    """Over-commit 1.5 of K = 2, no deadline: the round ends at b's arrival (1.6 s). c failing at
    3.6 s (0.9 of its 4.0 s) had been told to stop at 1.6 s: late, charged 1.0 s + 0.6 s. Failing
    at 0.8 s (0.2 of its work, in its download), before the round ended: dropped, charged 0.8 s of
    communication."""
    c_fails_at(monkeypatch, 0.9)
    settings = ("system.overcommit=1.5", "system.dropout=0.5")
    clock = hand_clock(tmp_path, *settings, availability=ALWAYS3, devices=SLOW_C)
    book = SystemBook()
    _, metrics = clock.sync_round(book, 1, 2, BYTES, BYTES)
    assert clock_row(metrics) == (1.6, 2, 1, 0)
    assert charged(book, "c") == (0.6, 1.0, 0, 1, 0)
    c_fails_at(monkeypatch, 0.2)
    book = SystemBook()
    _, metrics = clock.sync_round(book, 1, 2, BYTES, BYTES)
    assert clock_row(metrics) == (1.6, 2, 0, 1)
    assert charged(book, "c") == (0.0, 0.8, 0, 0, 1)


def test_the_book_checkpoints_as_plain_data_and_reads_the_older_form():
    book = SystemBook(time=2.0)
    book.record("a", "arrived", 0.5, 1.0, staleness=2)
    book.jobs.append(Job("b", 0, 3.0, "dropped", 0.1, 0.2))
    plain = book.to_plain()
    assert plain["clients"]["a"]["staleness"] == 2 and plain["jobs"][0]["client"] == "b"
    assert SystemBook.from_plain(plain) == book
    older = {  # (a checkpoint of a fedac whose jobs were dicts and totals lists)
        "time": 2.0,
        "jobs": [{**plain["jobs"][0]}],
        "clients": {"a": [0.5, 1.0, 1.0, 0.0, 0.0, 2.0]},
    }
    read = SystemBook.from_plain(older)
    assert read.jobs == book.jobs and read.clients == {"a": ClientLedger(0.5, 1.0, 1, 0, 0, 2)}
    assert read.client_columns("a")["mean_staleness"] == 2.0


def test_fedasync_events_by_hand(tmp_path):
    """Three always-online clients, all in flight at once, FedAsync (alpha 0.5): a arrives at
    1.54 s (staleness 0) and is sent the new model; b at 1.6 s has staleness 1, c at 2.02 s
    staleness 2; a's second job (dispatched at 1.54 s on version 1) arrives at 3.08 s with
    staleness 2."""
    always = "client,start_s,end_s\na,0,inf\nb,0,inf\nc,0,inf\n"
    schedule = hand_schedule(
        tmp_path,
        "system.mode=fedasync",
        "system.concurrency=3",
        "system.alpha=0.5",
        availability=always,
    )
    assert isinstance(schedule, AsyncSchedule) and schedule.needed(schedule.system) == 1
    book = SystemBook()
    seen = []
    for _ in range(4):
        schedule.dispatch(book, 3, BYTES, BYTES)
        job = schedule.next_event(book)
        seen.append((job.client, round(job.at, 6), book.version - job.version))
        book.version += 1  # (FedAsync: every arrival is a server update)
    assert seen == [("a", 1.54, 0), ("b", 1.6, 1), ("c", 2.02, 2), ("a", 3.08, 2)]
    assert staleness_weight(2, 0.5) == pytest.approx(1 / math.sqrt(3))
    # the mixing: x + alpha w(s) (u - x)
    job = Job("a", 0, 0.0, "arrived", result=type("R", (), {"upload": {"w": torch.tensor([3.0])}}))
    mixed = schedule.rebased(job, {"w": torch.tensor([1.0])}, 2)
    assert mixed["w"].item() == pytest.approx(1 + 0.5 / math.sqrt(3) * 2)


def test_fedbuff_rebases_the_difference_with_its_staleness_weight(tmp_path):
    always = "client,start_s,end_s\na,0,inf\nb,0,inf\nc,0,inf\n"
    schedule = hand_schedule(
        tmp_path, "system.mode=fedbuff", "system.buffer=2", availability=always
    )
    assert schedule.needed(schedule.system) == 2
    job = Job("a", 1, 0.0, "arrived", result=type("R", (), {"upload": {"w": torch.tensor([2.0])}}))
    # a difference of 2 computed on version 1, applied at version 4: x + 2 / sqrt(4)
    assert schedule.rebased(job, {"w": torch.tensor([1.0])}, 4)["w"].item() == pytest.approx(2.0)


def test_async_modes_refuse_sync_settings_and_methods_that_upload_no_model(tmp_path):
    """The settings alone decide two refusals (the compatibility matrix, before any data); the
    buffer against the clients the trace ever puts online needs the trace (the schedule's start)."""
    from fedac.settings.compatibility import check

    fedbuff = ("system.mode=fedbuff", "system.buffer=2")
    with pytest.raises(ConfigError, match="shape sync rounds"):
        check(hand_config(tmp_path, (*fedbuff, "system.deadline=5"), AVAILABILITY))
    with pytest.raises(ConfigError, match="fedkwsui does not upload a model"):
        check(hand_config(tmp_path, (*fedbuff, "algorithm=fedkwsui"), AVAILABILITY))
    check(hand_config(tmp_path, fedbuff, AVAILABILITY))
    with pytest.raises(ConfigError, match="buffer=5"):
        hand_schedule(tmp_path, "system.mode=fedbuff", "system.buffer=5")


# --- whole runs ----------------------------------------------------------------------------------
ROUNDS = 4


@pytest.fixture(scope="module")
def settings(gsc_root, tmp_path_factory):
    return {
        **tiny_run(gsc_root, tmp_path_factory.mktemp("system_cache")),
        "train.rounds": ROUNDS,
        "train.local_epochs": 1,
        "system.devices": "synthetic",
        "system.availability": "synthetic",
    }


def config(settings, **extra):
    return load_config(overrides=[f"{k}={v}" for k, v in {**settings, **extra}.items()])


@pytest.fixture(scope="module")
def data(settings):
    return build_federated_data(config(settings), progress=False)


def run(settings, data, where: Path, stop_after=None, resume=False, **extra):
    sim = Simulator(config(settings, **extra), where, data, progress=False)
    return sim, sim.run(stop_after=stop_after, resume=resume)


def without_wall_time(results: dict) -> dict:
    """(and without the code's version: a source file edited between the runs changes it)"""
    out = {k: v for k, v in results.items() if k not in ("wall_seconds", "code_version")}
    out["history"] = [
        {k: v for k, v in row.items() if k != "wall_seconds"} for row in out["history"]
    ]
    return out


def test_a_sync_run_keeps_virtual_time_and_repeats_exactly(settings, data, tmp_path):
    extra = {"system.deadline": 0.5, "system.dropout": 0.2, "system.partial": True}
    sim = Simulator(config(settings, **extra), tmp_path / "one", data, progress=False)
    limits: list[int | None] = []
    real = sim.plan.run
    sim.plan.run = lambda payload, states, datas, *a: (
        limits.extend(d.step_limit for d in datas) or real(payload, states, datas, *a)
    )
    first = sim.run()
    assert any(limit is not None for limit in limits)  # late clients sent the steps they did
    _, second = run(settings, data, tmp_path / "two", **extra)
    assert json.dumps(without_wall_time(first), sort_keys=True) == json.dumps(
        without_wall_time(second), sort_keys=True
    )
    times = [row["virtual_time_s"] for row in first["history"]]
    assert all(b > a for a, b in zip(times, times[1:])) and times[0] > 0
    lines = (tmp_path / "one" / "system.csv").read_text().splitlines()
    assert lines[0].startswith("round,virtual_time_s,round_s,sampled,arrived,late,dropped")
    assert len(lines) == ROUNDS + 1
    rows = [dict(zip(lines[0].split(","), map(float, line.split(",")))) for line in lines[1:]]
    assert sum(r["late"] + r["dropped"] for r in rows) > 0  # the deadline and dropout bite
    summary = first["system"]
    assert summary["virtual_time_s"] == pytest.approx(times[-1])
    assert 0 <= summary["never_contributed_fraction"] < 1
    assert list(summary["training_flops_per_sample"]) == ["crnn_tiny"]  # FedAvg's model.name
    assert summary["training_flops_per_sample"]["crnn_tiny"] > 0
    header = (tmp_path / "one" / "clients.csv").read_text().splitlines()[0]
    assert "compute_s" in header and "late" in header and "mean_staleness" in header


def test_over_commitment_shortens_rounds_under_a_deadline(settings, data, tmp_path):
    extra = {"system.deadline": 30.0, "train.fraction": 0.25}
    plain, _ = run(settings, data, tmp_path / "plain", **extra)
    over, _ = run(settings, data, tmp_path / "over", **extra, **{"system.overcommit": 2.0})
    mean = lambda sim: sum(r["round_s"] for r in sim.state.system.rows) / ROUNDS  # noqa: E731
    assert mean(over) < mean(plain)


def test_a_deadline_no_client_meets_is_refused_with_advice(settings, data, tmp_path):
    with pytest.raises(ConfigError, match="raise system.deadline"):
        run(settings, data, tmp_path, **{"system.deadline": 1e-6})


def test_fedbuff_trains_one_stacked_call_per_model_version_and_resumes_exactly(
    settings, data, tmp_path
):
    extra = {
        "system.mode": "fedbuff",
        "system.buffer": 2,
        "system.concurrency": 4,
        "runtime.execution": "cohort",
    }
    whole, results = run(settings, data, tmp_path / "whole", **extra)
    assert results["execution"] == "stacked"
    assert [r["arrived"] for r in whole.state.system.rows] == [2] * ROUNDS
    calls: list[int] = []
    sim = Simulator(config(settings, **extra), tmp_path / "killed", data, progress=False)
    real = sim.plan.run
    sim.plan.run = lambda payload, states, datas, *a: (
        calls.append(len(datas)) or real(payload, states, datas, *a)
    )
    assert sim.run(stop_after=2) is None
    assert len(calls) <= 2  # (at most one stacked call per model version)
    resumed, again = run(settings, data, tmp_path / "killed", resume=True, **extra)
    assert again["resumed_from"] == 2
    final = whole.state.server["params"]
    assert all(torch.equal(final[k], resumed.state.server["params"][k]) for k in final)
    assert [r["virtual_time_s"] for r in again["history"]] == [
        r["virtual_time_s"] for r in results["history"]
    ]


def test_the_clock_off_leaves_no_trace(settings, data, tmp_path):
    off = {"system.devices": "none", "system.availability": "always"}
    sim, results = run(settings, data, tmp_path, **off)
    assert type(sim.schedule) is IdealSchedule and sim.state.system is None
    assert "system" not in results
    assert "virtual_time_s" not in results["history"][-1]
    assert not (tmp_path / "system.csv").exists()


def test_the_clock_times_compressed_uploads_and_async_modes_refuse_compression(
    settings, data, tmp_path
):
    from fedac.training.device import nbytes

    topk = {"compression.method": "topk", "compression.ratio": 0.01}
    sim = Simulator(config(settings, **topk), tmp_path / "sync", data, progress=False)
    payload = sim.algorithm.broadcast(sim.algorithm.init_server())
    down, up = traffic(payload, sim.server_step.compression)
    assert down == nbytes(payload) and up < 0.05 * nbytes(payload)
    assert up == sim.server_step.compression.wire_bytes(payload, payload)
    with pytest.raises(ConfigError, match="not combined yet"):
        Simulator(
            config(settings, **topk, **{"system.mode": "fedbuff", "system.buffer": 2}),
            tmp_path / "async",
            data,
            progress=False,
        )


# --- registered parts -------------------------------------------------------------------------


def test_clock_modes_are_registered_parts_a_plugin_can_add(tmp_path, monkeypatch):
    from fedac.engine.clock.sync import SyncSchedule
    from fedac.settings.clock import CLOCK_MODES

    with pytest.raises(ConfigError, match=r"Registered clock_modes: sync, fedbuff, fedasync"):
        load_config(overrides=["system.mode=fedbufff"])

    class Rounds(SyncSchedule):
        """sync rounds under another name (a plug-in's mode)"""

    monkeypatch.setitem(CLOCK_MODES._values, "rounds", Rounds)
    schedule = hand_schedule(tmp_path, "system.mode=rounds", availability=ALWAYS3)
    assert type(schedule) is Rounds and schedule.describe().startswith("virtual clock: rounds (")


def test_the_clock_counts_the_cpus_fused_attention():
    """KWT trains through the CPU's fused attention kernel, which torch's counter has no formula
    for: the clock's count of a forward pass equals models/flops.py's (which counts the attention
    products from the functions' shapes), and a training step's count holds the backward's
    attention products too (backward = twice the forward's products, so a step is over 3x)."""
    from fedac.engine.clock.model import count_flops
    from fedac.models import build_model
    from fedac.models.flops import count_forward_flops

    model, x = build_model("kwt", 40, 12).train(), torch.zeros(2, 40, 101)

    def forward():
        with torch.no_grad():
            model(x)

    def step():
        model(x).sum().backward()

    assert count_flops(forward) == count_forward_flops(model, x)
    assert count_flops(step) > 3 * count_flops(forward)
