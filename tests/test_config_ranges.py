"""Every numeric setting declares its valid range, and load_config refuses a value outside it before
any work; --rounds governs zero-shot runs too, and a saved config.yaml repeats the rounds that
ran."""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from pathlib import Path

import pytest
import yaml

from fedac.config import Config, algorithm_sections, load_config, save_config
from fedac.errors import ConfigError
from fedac.fields import Range

REPO = Path(__file__).resolve().parents[1]


def numeric_settings(cls: type = Config, prefix: str = ""):
    """(key, dataclass field, int or float, is a list) of every int/float setting, found by walking
    the dataclasses from Config and every registered algorithm's settings (plug-ins' too, when
    installed): a setting added later is found without editing this test."""
    hints = typing.get_type_hints(cls)
    if cls is Config:  # the algorithms' sections come from the registry, not Config's fields
        for name, section in algorithm_sections().items():
            yield from numeric_settings(section, name + ".")
    for f in dataclasses.fields(cls):
        kind, key = hints[f.name], prefix + f.name
        if dataclasses.is_dataclass(kind):
            yield from numeric_settings(kind, key + ".")
            continue
        if typing.get_origin(kind) in (typing.Union, types.UnionType):
            kind = next(a for a in typing.get_args(kind) if a is not type(None))
        is_list = typing.get_origin(kind) is list
        if is_list:
            (kind,) = typing.get_args(kind)
        if kind in (int, float):
            yield key, f, kind, is_list


SETTINGS = list(numeric_settings())
IDS = [key for key, *_ in SETTINGS]


def outside(valid: Range, kind: type) -> list[float]:
    """Values just past each bound (the bound itself where it is open); NaN and inf for floats."""
    step = 1 if kind is int else 0.5
    values: list[float] = [math.nan, math.inf, -math.inf] if kind is float else []
    if valid.low is not None:
        values.append(kind(valid.low) if valid.low_open else kind(valid.low - step))
    if valid.high is not None:
        values.append(kind(valid.high) if valid.high_open else kind(valid.high + step))
    return values


def inside(valid: Range, kind: type) -> list[float]:
    """Closed bounds (where special values such as 0 = "all" live) and a value between the
    bounds."""
    values = [
        kind(b)
        for b, is_open in ((valid.low, valid.low_open), (valid.high, valid.high_open))
        if b is not None and not is_open
    ]
    if valid.low is None:
        values.append(kind(-2.5) if kind is float else -3)
    elif valid.high is None:
        values.append(kind(valid.low + 1.5) if kind is float else int(valid.low) + 2)
    else:
        values.append((valid.low + valid.high) / 2 if kind is float else int(valid.low) + 1)
    return values


def as_text(value: float, is_list: bool) -> str:
    """The value as `--set` YAML (.nan, .inf), in a list for list settings."""
    if math.isnan(value):
        text = ".nan"
    elif math.isinf(value):
        text = ".inf" if value > 0 else "-.inf"
    else:
        text = repr(value)
    return f"[{text}]" if is_list else text


def value_of(cfg: Config, key: str):
    node = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def test_every_numeric_setting_declares_a_range():
    assert len(SETTINGS) >= 90  # the walk reaches every section's numbers
    missing = [key for key, f, *_ in SETTINGS if not isinstance(f.metadata.get("valid"), Range)]
    assert not missing, (
        f"declare a range (config.number(default, '>= 1') ...) for: {', '.join(missing)}"
    )
    unbounded_ints = [
        key for key, f, kind, _ in SETTINGS if kind is int and f.metadata["valid"].low is None
    ]
    assert not unbounded_ints, f"integer settings need a lower bound: {unbounded_ints}"


def test_defaults_lie_in_their_ranges():
    load_config()  # checks every default
    for key, f, _, _ in SETTINGS:
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        for v in default if isinstance(default, list) else [default]:
            assert v is None or v in f.metadata["valid"], key


@pytest.mark.parametrize(("key", "f", "kind", "is_list"), SETTINGS, ids=IDS)
def test_out_of_range_values_are_refused_naming_key_value_and_range(key, f, kind, is_list):
    valid = f.metadata.get("valid")
    assert isinstance(valid, Range), f"{key} declares no range"
    bad = outside(valid, kind)
    assert bad, f"{key}: an integer setting with no bound"
    for value in bad:
        with pytest.raises(ConfigError) as caught:
            load_config(overrides=[f"{key}={as_text(value, is_list)}"])
        message = str(caught.value)
        assert (
            message.startswith(f"{key} must ") and str(valid) in message and repr(value) in message
        ), message


@pytest.mark.parametrize(("key", "f", "kind", "is_list"), SETTINGS, ids=IDS)
def test_in_range_values_and_none_are_accepted(key, f, kind, is_list):
    valid = f.metadata["valid"]
    for value in inside(valid, kind):
        cfg = load_config(overrides=[f"{key}={as_text(value, is_list)}"])
        assert value_of(cfg, key) == ([value] if is_list else value)
    if f.default is None:
        assert value_of(load_config(overrides=[f"{key}=null"]), key) is None


def test_range_notation_and_messages():
    assert str(Range.parse(">= 1")) == ">= 1" and str(Range.parse("(0, 1]")) == "in (0, 1]"
    assert (
        0 not in Range.parse("(0, 1]")
        and 1 in Range.parse("(0, 1]")
        and 1 not in Range.parse("[0, 1)")
    )
    assert math.nan not in Range.parse("finite") and -1e9 in Range.parse("finite")
    with pytest.raises(ValueError):
        Range.parse("0..1")
    with pytest.raises(ConfigError, match=r"^train.rounds must be >= 1, got -3$"):
        load_config(overrides=["train.rounds=-3"])
    with pytest.raises(ConfigError, match=r"^train.fraction must lie in \(0, 1\], got 1.5$"):
        load_config(overrides=["train.fraction=1.5"])
    with pytest.raises(
        ConfigError, match=r"^earlyexit.exits must hold numbers in \[1, 12\], got \[3, 13\]$"
    ):
        load_config(overrides=["earlyexit.exits=3,13"])
    # The flag layer is checked too, and so is a config file.
    with pytest.raises(ConfigError, match=r"^train.rounds must be >= 1, got -1$"):
        load_config(**{"train.rounds": -1})


def test_a_config_file_value_is_checked(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lr: -1\n")
    with pytest.raises(ConfigError, match=r"^train.lr must be > 0, got -1.0$"):
        load_config(path)


# --- the CLI -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad", [["--rounds", "-1"], ["--set", "train.rounds=-3"], ["--set", "train.lr=-1"]]
)
def test_cli_refuses_a_bad_number_with_one_line_and_no_run_directory(
    bad, tmp_path, monkeypatch, capsys
):
    from fedac.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["run", "--quiet", *bad]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("fedac: error: train.") and " must be " in line
    assert list(tmp_path.iterdir()) == []  # no runs/<...> directory


# --- zero-shot rounds ----------------------------------------------------------------------------


def zeroshot(*overrides, path=None, **flags):
    return load_config(path, ["algorithm=zeroshot", *overrides], **flags)


def test_zeroshot_rounds_scenario_default_flag_and_set_and_the_later_layer_wins(tmp_path):
    assert (
        zeroshot().train.rounds == 10
        and zeroshot("zeroshot.scenario=heterogeneous").train.rounds == 30
    )
    assert zeroshot(**{"train.rounds": 2}).train.rounds == 2
    assert zeroshot("train.rounds=3").train.rounds == 3
    cfg = zeroshot("zeroshot.rounds=5")
    assert (cfg.train.rounds, cfg.zeroshot.rounds) == (5, 5)
    # --set after the flag
    assert zeroshot("zeroshot.rounds=5", **{"train.rounds": 2}).train.rounds == 5
    cfg = zeroshot("zeroshot.rounds=5", "train.rounds=3")
    assert (cfg.train.rounds, cfg.zeroshot.rounds) == (3, 3)  # the saved file then holds one count
    assert zeroshot("train.rounds=3", "zeroshot.rounds=0").train.rounds == 3  # 0: not a count
    path = tmp_path / "both.yaml"
    path.write_text("algorithm: zeroshot\ntrain:\n  rounds: 3\nzeroshot:\n  rounds: 5\n")
    with pytest.raises(
        ConfigError, match=r"train.rounds=3 and zeroshot.rounds=5 disagree in one config file"
    ):
        load_config(path)
    assert load_config(path, **{"train.rounds": 4}).train.rounds == 4  # a flag overrides the file
    with pytest.raises(
        ConfigError, match="zeroshot.scenario must be homogeneous or heterogeneous, got 'mixed'"
    ):
        zeroshot("zeroshot.scenario=mixed")


def test_a_saved_zeroshot_config_repeats_its_rounds(tmp_path):
    for cfg in (
        zeroshot(),
        zeroshot(**{"train.rounds": 2}),
        zeroshot("zeroshot.rounds=7", "train.rounds=4"),
    ):
        save_config(cfg, tmp_path / "config.yaml")
        again = load_config(tmp_path / "config.yaml")
        assert (again.train.rounds, again.zeroshot.rounds) == (
            cfg.train.rounds,
            cfg.zeroshot.rounds,
        )


def test_committed_zeroshot_configs_give_the_rounds_they_ran():
    configs = sorted((REPO / "docs" / "results").glob("zeroshot-*/*/config.yaml"))
    assert configs
    for path in configs:
        ran = json.loads((path.parent / "results.json").read_text())["rounds"]
        assert load_config(path).train.rounds == ran, path
    for path in sorted((REPO / "configs").glob("*.yaml")):
        load_config(path)


def test_reproduce_keeps_the_paper_schedule():
    # zeroshot_tables.reproduce's call: no train.rounds, so each table runs its scenario's rounds.
    for scenario, rounds in (("homogeneous", 10), ("heterogeneous", 30)):
        cfg = load_config(None, [f"zeroshot.scenario={scenario}"], algorithm="zeroshot", seed=0)
        assert cfg.train.rounds == rounds


def test_cli_zeroshot_runs_the_rounds_of_the_flag(gsc_root, tmp_path, capsys):
    from fedac.cli import main

    out = tmp_path / "run"
    # zeroshot.scale 0: the largest the 2 clips per word and speaker allow; no registration in 2
    # rounds.
    assert (
        main(
            [
                "run",
                "--algorithm",
                "zeroshot",
                "--rounds",
                "2",
                "--quiet",
                "--out",
                str(out),
                "--set",
                f"data.root={gsc_root}",
                "--set",
                f"data.cache_dir={tmp_path}",
                "--set",
                "train.local_epochs=1",
            ]
        )
        == 0
    )
    assert "rounds" in capsys.readouterr().out
    assert json.loads((out / "results.json").read_text())["rounds"] == 2
    assert len((out / "metrics.csv").read_text().splitlines()) == 1 + 2
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["train"]["rounds"] == 2
    assert load_config(out / "config.yaml").train.rounds == 2  # --resume and --config repeat it
