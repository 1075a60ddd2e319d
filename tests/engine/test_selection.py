"""Client selection (engine/clock/selection.py): Oort's utility, its exploitation / exploration
split and its pacer, power-of-choice's choice and FedCS's greedy set, each on a 5-client example
computed by hand; random as the engine drew before; the refusals and the unread settings; then
whole runs: each rule on the virtual clock, stacked, clients.csv's columns, and a killed Oort run
resuming to the uninterrupted numbers."""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from pathlib import Path

import pytest
import torch

from fedac.config import load_config, save_config
from fedac.engine.clock.model import ClientTimes
from fedac.engine.clock.selection import (
    FedCS,
    Oort,
    PowerOfChoice,
    RandomSelection,
    build_selection,
    fedcs_greedy,
    paced_threshold,
    preferred_duration,
)
from fedac.engine.data import build_federated_data
from fedac.engine.simulator import Simulator, sample_cohort
from fedac.errors import ConfigError
from helpers import tiny_run

pytestmark = pytest.mark.usefixtures("one_thread")

SIZES = {"a": 10, "b": 20, "c": 30, "d": 40, "e": 50}
#: (update seconds, upload seconds): totals a 3, b 1.5, c 5, d 2.5, e 4
SPLIT = {"a": (1.0, 2.0), "b": (0.5, 1.0), "c": (4.0, 1.0), "d": (2.0, 0.5), "e": (1.0, 3.0)}
TIMES = {c: ClientTimes(0.0, (u,), up) for c, (u, up) in SPLIT.items()}
#: Oort's example: durations 1..5 (a fastest)
DURATIONS = {c: ClientTimes(0.0, (float(i + 1),), 0.0) for i, c in enumerate(SIZES)}


def cfg(*settings: str):
    return load_config(overrides=list(settings))


def with_history(rule, losses: dict[str, float], last: dict[str, int]):
    """Clients that reported `losses` in the rounds `last`."""
    rule.bind({})
    for name, loss in losses.items():
        rule.observe(last[name], {name: loss})
    rule.history.pop("fresh", None)
    return rule


def test_oort_utility_penalty_and_staleness_by_hand():
    """U = n x loss: a 20, b 10, c 30; clip = sorted[int(3 x 0.9)] = 30, min 10 x 0.999 = 9.99,
    range 20.01; round 3: bonus sqrt(0.1 ln 3 / r_i) = 0.331453 (r 1), 0.234373 (r 2). T = the
    30th percentile of durations 1..5 = sorted[1] = 2: c (3 s) x (2/3)^2; d x (2/4)^2, e x
    (2/5)^2 for exploration (n x penalty: d 10, e 8)."""
    rule = with_history(
        Oort(cfg("selection.method=oort"), SIZES),
        {"a": 2.0, "b": 0.5, "c": 1.0},
        {"a": 1, "b": 2, "c": 2},
    )
    penalty = {"a": 1.0, "b": 1.0, "c": (2 / 3) ** 2}
    scores = rule.scores(["a", "b", "c"], 3, penalty.__getitem__)
    bonus1, bonus2 = math.sqrt(0.1 * math.log(3)), math.sqrt(0.1 * math.log(3) / 2)
    assert scores["a"] == pytest.approx((20 - 9.99) / 20.01 + bonus1, rel=1e-12)
    assert scores["b"] == pytest.approx((10 - 9.99) / 20.01 + bonus2, rel=1e-12)
    assert scores["c"] == pytest.approx(((30 - 9.99) / 20.01 + bonus2) * 4 / 9, rel=1e-12)
    assert scores["a"] == pytest.approx(0.831703, abs=1e-6)
    assert scores["c"] == pytest.approx(0.548610, abs=1e-6)
    assert preferred_duration([t.total for t in DURATIONS.values()], 30) == 2.0


def test_oort_exploits_above_the_cutoff_and_explores_the_largest_unheard():
    """K = 3, epsilon 0.5 (no decay): int(3 x 0.5) = 1 slot explores, 2 exploit. Scores (above):
    a 0.8317, c 0.5486, b 0.2349; the cut-off 0.95 x c's leaves {a, c}: both. Exploration:
    d (40 x 1/4 = 10) before e (50 x 4/25 = 8); a sample window of 1 keeps d alone."""
    settings = (
        "selection.method=oort",
        "selection.exploration=0.5",
        "selection.exploration_decay=1",
        "selection.exploration_min=0",
        "selection.sample_window=1",
    )
    rule = with_history(
        Oort(cfg(*settings), SIZES),
        {"a": 2.0, "b": 0.5, "c": 1.0},
        {"a": 1, "b": 2, "c": 2},
    )
    picked = rule.choose(list(SIZES), 3, ("cohort", 3), 3, DURATIONS.__getitem__)
    assert picked == ["a", "c", "d"]
    entries = rule.history["clients"]
    assert entries["a"]["utility"] == pytest.approx(0.831703, abs=1e-6)
    assert entries["d"]["utility"] == pytest.approx(10.0)
    assert entries["e"]["utility"] == pytest.approx(8.0)
    assert [entries[c]["selected"] for c in SIZES] == [1, 0, 1, 1, 0]
    assert sorted(rule.history["oort"]["exploit"]) == ["a", "c"]


def test_oort_pacer_relaxes_the_preferred_duration_when_utility_stalls():
    """W = 20, delta 5: at round 40 the last 20 rounds' utility within 10 % of the 20 before
    raises the percentile 30 -> 35 (T: sorted durations[int(5 x 0.35)] = 2 s -> at 40, 3 s);
    5x more lowers it; in between, or off a multiple of W, it stays."""
    flat = [1.0] * 40
    assert paced_threshold(30.0, flat, 40, 20, 5.0) == 35.0
    assert paced_threshold(30.0, [1.0] * 20 + [6.0] * 20, 40, 20, 5.0) == 25.0
    assert paced_threshold(30.0, [1.0] * 20 + [2.0] * 20, 40, 20, 5.0) == 30.0
    assert paced_threshold(30.0, flat, 39, 20, 5.0) == 30.0
    assert paced_threshold(98.0, flat, 40, 20, 5.0) == 100.0
    durations = [float(i) for i in range(1, 6)]
    assert preferred_duration(durations, 35) == 2.0
    assert preferred_duration(durations, 40) == 3.0
    assert preferred_duration(durations, 100) == math.inf
    # in the rule: the pacer runs once per round, before it chooses
    rule = Oort(cfg("selection.method=oort", "selection.pacer_step=2"), SIZES)
    rule.bind({})
    rule.observe(3, {"a": 0.3})  # a exploited in round 3: utility 10 x 0.3 = 3
    rule.history["oort"] = {"exploited": [3.0, 3.0, 3.0], "round": 3, "exploit": ["a"]}
    rule._advance(4)
    assert rule.history["oort"]["exploited"][-1] == pytest.approx(3.0, rel=1e-4)
    assert rule.history["oort"]["threshold"] == 35.0


def test_power_of_choice_takes_the_highest_last_losses_never_trained_first():
    """d = 5 (every client a candidate): losses a 2, b 0.5, c 1, e 3, d never trained (+inf):
    K = 2 -> d, e; K = 3 -> d, e, a."""
    rule = with_history(
        PowerOfChoice(cfg("selection.method=poc", "selection.candidates=5"), SIZES),
        {"a": 2.0, "b": 0.5, "c": 1.0, "e": 3.0},
        dict.fromkeys("abce", 1),
    )
    assert rule.choose(list(SIZES), 2, ("cohort", 2), 2) == ["d", "e"]
    assert rule.choose(list(SIZES), 3, ("cohort", 3), 3) == ["a", "d", "e"]
    assert rule.history["clients"]["d"]["utility"] == math.inf


def test_power_of_choice_draws_candidates_by_data_size():
    """d = 1, K = 1: each client is chosen with probability n_k / n (e: 50 / 150)."""
    rule = PowerOfChoice(cfg("selection.method=poc", "selection.candidates=1"), SIZES)
    rule.bind({})
    counts = Counter(rule.choose(list(SIZES), 1, ("cohort", r), r)[0] for r in range(3000))
    for name, n in SIZES.items():
        assert counts[name] / 3000 == pytest.approx(n / 150, abs=0.03)


def test_fedcs_greedy_set_by_hand():
    """Shared channel, deadline 5: b ends 0.5 + 1 = 1.5; then d max(1.5, 2) + 0.5 = 2.5; then a
    2.5 + 2 = 4.5; the next best, c, would end max(4.5, 4) + 1 = 5.5 > 5: {b, d, a}. Parallel
    (fedac's clock): every client whose whole time fits, fastest first."""
    ends: dict[str, float] = {}
    assert fedcs_greedy(TIMES, 5, 5.0, True, ends.__setitem__) == ["b", "d", "a"]
    assert ends == {"b": 1.5, "d": 2.5, "a": 4.5}
    assert fedcs_greedy(TIMES, 5, 4.5, False) == ["b", "d", "a", "e"]
    assert fedcs_greedy(TIMES, 2, 5.0, False) == ["b", "d"]
    rule = FedCS(
        cfg("selection.method=fedcs", "system.devices=synthetic", "system.deadline=5"),
        SIZES,
    )
    rule.bind({})
    assert rule.choose(list(SIZES), 5, ("cohort", 1), 1, TIMES.__getitem__) == ["a", "b", "d"]


def test_fedcs_heaps_choose_as_the_papers_loop():
    """The O(n log n) greedy against Alg. 2 written as a loop (every client tried, the one ending
    the round earliest taken when it fits, passed over when not), on 200 random federations."""

    def plain(times, size, deadline):
        def end_with(c, end):
            return max(end, times[c].total - times[c].up_s) + times[c].up_s

        left, chosen, end = list(times), [], 0.0
        while left and len(chosen) < size:
            best = min(left, key=lambda c: end_with(c, end))
            left.remove(best)
            if end_with(best, end) <= deadline:
                chosen.append(best)
                end = end_with(best, end)
        return chosen

    for trial in range(200):
        r = random.Random(trial)
        n = r.randint(1, 25)
        times = {
            f"c{i}": ClientTimes(
                0.0, (r.choice([0.5, 1.0, 3 * r.random()]),), r.choice([0.5, r.random()])
            )
            for i in range(n)
        }
        size, deadline = r.randint(1, n), 8 * r.random()
        assert fedcs_greedy(times, size, deadline, True) == plain(times, size, deadline)


def test_random_draws_as_the_engine_did_and_keeps_no_history():
    clients = [f"c{i}" for i in range(40)]
    rule = RandomSelection(cfg(), {c: 1 for c in clients})
    rule.bind(history := {})
    for r in range(1, 6):
        assert rule.choose(clients, 4, ("cohort", r), r) == sample_cohort(clients, 0.1, 0, r)
    assert history == {} and rule.columns("c1") == {}


def test_rules_that_need_the_clock_are_refused_with_what_to_set(caplog, tmp_path):
    """By the compatibility matrix, from what each rule declares (`clock_need`)."""
    from fedac.settings.compatibility import check

    clock = ("system.devices=synthetic",)
    with pytest.raises(ConfigError, match="system.deadline > 0") as refused:
        check(cfg("selection.method=fedcs", *clock))
    assert "selection.method=fedcs chooses the clients predicted to meet" in str(refused.value)
    check(cfg("selection.method=fedcs", *clock, "system.deadline=5"))
    with pytest.raises(ConfigError, match="selection.round_penalty=0"):
        check(cfg("selection.method=oort"))
    check(cfg("selection.method=oort", *clock))
    check(cfg("selection.method=oort", "selection.round_penalty=0"))
    check(cfg("selection.method=oort", "selection.round_threshold=100"))
    check(cfg("selection.method=poc"))
    # a setting of a rule not chosen: one warning, and config.yaml notes it
    given = cfg("selection.method=poc", "selection.round_penalty=1", "selection.candidates=3")
    build_selection(given, SIZES)
    assert "selection.round_penalty not read under selection.method=poc" in caplog.text
    assert "candidates" not in caplog.text
    save_config(given, tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text()
    assert "round_penalty: 1.0  # not read under selection.method=poc; read by oort" in text
    assert "  candidates: 3\n" in text
    # A saved config.yaml gives every key, each rule's at its default: read back (fedac run
    # --resume, --config), it warns of none; a value given at its default is quiet too.
    caplog.clear()
    build_selection(load_config(tmp_path / "config.yaml"), SIZES)
    assert "selection.round_penalty not read" in caplog.text  # (1, not the default 2)
    caplog.clear()
    save_config(cfg("selection.method=random"), tmp_path / "random.yaml")
    build_selection(load_config(tmp_path / "random.yaml"), SIZES)
    build_selection(cfg("selection.method=poc", "selection.round_penalty=2"), SIZES)
    assert "not read under" not in caplog.text
    with pytest.raises(ConfigError, match="unknown selection.method 'ort'"):
        cfg("selection.method=ort")


# --- whole runs ----------------------------------------------------------------------------------
ROUNDS = 4


@pytest.fixture(scope="module")
def settings(gsc_root, tmp_path_factory):
    return {
        **tiny_run(gsc_root, tmp_path_factory.mktemp("selection_cache")),
        "train.rounds": ROUNDS,
        "train.local_epochs": 1,
        "train.fraction": 0.25,
        "system.devices": "synthetic",
        "system.availability": "synthetic",
        "system.deadline": 60.0,
        "system.overcommit": 1.5,
        "runtime.execution": "cohort",
    }


def config(settings, **extra):
    return load_config(overrides=[f"{k}={v}" for k, v in {**settings, **extra}.items()])


@pytest.fixture(scope="module")
def data(settings):
    return build_federated_data(config(settings), progress=False)


def run(settings, data, where: Path, stop_after=None, resume=False, **extra):
    sim = Simulator(config(settings, **extra), where, data, progress=False)
    return sim, sim.run(stop_after=stop_after, resume=resume)


@pytest.mark.parametrize("method", ["poc", "fedcs"])
def test_each_rule_runs_stacked_on_the_clock(settings, data, tmp_path, method):
    sim, results = run(settings, data, tmp_path, **{"selection.method": method})
    assert results["execution"] == "stacked"
    clients = sim.state.selection["clients"]
    assert sum(e["selected"] for e in clients.values()) == sum(
        r["sampled"] for r in sim.state.system.rows
    )
    lines = (tmp_path / "clients.csv").read_text().splitlines()
    header = lines[0].split(",")
    assert "times_selected" in header and "selection_utility" in header


@pytest.mark.slow  # (about 15-20 s on 2 busy cores: three runs)
def test_a_killed_oort_run_resumes_to_the_uninterrupted_numbers(settings, data, tmp_path):
    extra = {"selection.method": "oort", "selection.exploration": 0.5}
    whole, results = run(settings, data, tmp_path / "whole", **extra)
    assert results["execution"] == "stacked"
    assert run(settings, data, tmp_path / "killed", stop_after=2, **extra)[1] is None
    resumed, again = run(settings, data, tmp_path / "killed", resume=True, **extra)
    assert again["resumed_from"] == 2
    final = whole.state.server["params"]
    assert all(torch.equal(final[k], resumed.state.server["params"][k]) for k in final)
    assert json.dumps(whole.state.selection, sort_keys=True) == json.dumps(
        resumed.state.selection, sort_keys=True
    )
    assert whole.state.selection["oort"]["round"] == ROUNDS


def test_oort_chooses_whom_fedbuff_dispatches(settings, data, tmp_path):
    extra = {
        "selection.method": "oort",
        "system.mode": "fedbuff",
        "system.buffer": 2,
        "system.concurrency": 4,
        "system.deadline": 0,
        "system.overcommit": 1,
    }
    sim, results = run(settings, data, tmp_path, **extra)
    clients = sim.state.selection["clients"]
    assert sum(e["selected"] for e in clients.values()) == sim.state.system.dispatched
    assert sum(e["reported"] for e in clients.values()) == 2 * ROUNDS
