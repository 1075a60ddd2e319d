"""A key given by several --set warns once, naming every value and the one kept."""

from __future__ import annotations

import logging

from fedac.config import load_config


def test_a_key_set_twice_warns_and_keeps_the_last(caplog):
    with caplog.at_level(logging.WARNING, logger="fedac.config"):
        cfg = load_config(
            overrides=["system.devices=a.csv", "train.rounds=3", "system.devices=b.csv"]
        )
    assert cfg.system.devices == "b.csv"
    assert [r.getMessage() for r in caplog.records] == [
        "--set system.devices is given 2 times (a.csv, b.csv): the last one, "
        "system.devices=b.csv, is kept"
    ]


def test_keys_set_once_do_not_warn(caplog):
    with caplog.at_level(logging.WARNING, logger="fedac.config"):
        load_config(overrides=["train.rounds=3", "train.lr=0.1"], algorithm="fedmlac")
    assert not caplog.records  # (fedmlac's run defaults re-read the overrides: still no warning)
