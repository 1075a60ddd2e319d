"""`fedac reproduce selection` (experiments/selection.py): the rows resolve to the rule or objective
they name on the clock's protocol; the Gini coefficient and the participation read from
clients.csv against hand values."""

from __future__ import annotations

import pytest

from fedac.config import load_config
from fedac.experiments import selection
from fedac.experiments.catalog import experiment_named
from fedac.experiments.compare import method_config, parse_method


def test_the_rows_are_the_rules_and_the_objectives_on_the_clock(tmp_path):
    spec = experiment_named("selection")
    base = load_config(None, spec.protocol)
    cfgs = {
        m.label: method_config(base, m, 0, tmp_path / m.label, None, spec.protocol, [])
        for m in map(parse_method, spec.methods)
    }
    rules = [cfg.selection.method for cfg in cfgs.values()]
    assert rules == ["random", "oort", "poc", "fedcs", "random", "random", "random", "random"]
    assert [cfg.algorithm for cfg in cfgs.values()][4:] == ["qffl", "qffl", "afl", "term"]
    assert [cfgs["q-FFL (q 1)"].qffl.q, cfgs["q-FFL (q 5)"].qffl.q] == [1.0, 5.0]
    for cfg in cfgs.values():
        assert (cfg.system.devices, cfg.system.availability) == ("synthetic", "synthetic")
        assert (cfg.system.deadline, cfg.system.overcommit) == (selection.DEADLINE_S, 1.3)
        assert cfg.train.rounds == selection.ROUNDS


def test_gini_and_participation_by_hand(tmp_path):
    assert selection.gini([2, 2, 2]) == 0.0
    assert selection.gini([0, 0, 3]) == pytest.approx(2 / 3)  # sum |xi - xj| / (2 n^2 mean)
    assert selection.gini([1, 3]) == pytest.approx((2 * 2) / (2 * 4 * 2))
    assert selection.gini([]) == 0.0
    (tmp_path / "clients.csv").write_text(
        "round,client,arrived,late,dropped\n1,a,1,0,0\n1,b,0,0,0\n2,a,1,1,0\n2,b,0,0,1\n2,c,0,0,0\n"
    )
    assert sorted(selection.participation(tmp_path)) == [0.0, 1.0, 2.0]
