"""Extending fedac without editing it (docs/extending.md): the example plug-in of
tests/plugin_example/ adds an algorithm with a setting, a model, a dataset, an aggregator and an
attack through entry points, and runs through the public CLI. The plug-in is made visible the way an
installed package is: a dist-info folder (its entry_points.txt written from the package's
pyproject.toml) on PYTHONPATH, no network, no pip."""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import yaml

from fedac.errors import ConfigError
from fedac.registry import Entry, Registry

REPO = Path(__file__).resolve().parents[1]
PLUGIN = REPO / "tests" / "plugin_example"
DOC = REPO / "docs" / "extending.md"
# the console script of the environment running the tests
FEDAC = Path(sys.executable).parent / "fedac"


def entry_points(
    drop: tuple[str, ...] = (), extra: dict[str, dict[str, str]] | None = None
) -> dict[str, dict[str, str]]:
    """The plug-in's entry points as its pyproject.toml declares them, without the names in
    `drop`."""
    declared = tomllib.loads((PLUGIN / "pyproject.toml").read_text())["project"]["entry-points"]
    groups = {
        group: {name: value for name, value in points.items() if name not in drop}
        for group, points in declared.items()
    }
    for group, points in (extra or {}).items():
        groups.setdefault(group, {}).update(points)
    return groups


def install(tmp_path: Path, **kwargs) -> dict[str, str]:
    """An environment in which the plug-in is installed (as `pip install` would leave its
    metadata)."""
    info = tmp_path / "site" / "fedac_example-0.1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fedac-example\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in points.items()) + "\n"
            for group, points in entry_points(**kwargs).items()
        )
    )
    return {
        **os.environ,
        # (the caller's path after: a checkout's own source on it stays the fedac tested)
        "PYTHONPATH": os.pathsep.join(
            [str(tmp_path / "site"), str(PLUGIN), str(REPO / "tests")]
            + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        ),
        "FEDAC_HOME": str(tmp_path / "home"),
        "COLUMNS": "200",
    }


def doc_blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", DOC.read_text(), flags=re.S | re.M)


def probe(env: dict[str, str], code: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


# --- the document is the plug-in -----------------------------------------------------------------


def test_every_file_of_the_plugin_is_a_block_of_the_doc_verbatim():
    """Each python / toml block opens with `# <path>` and equals that file; every file is shown."""
    shown = {}
    for block in doc_blocks("python") + doc_blocks("toml"):
        first = block.splitlines()[0]
        assert first.startswith("# "), f"a block of docs/extending.md names no file: {first!r}"
        path = first[2:].removeprefix("tests/plugin_example/")
        assert (PLUGIN / path).read_text() == block, (
            f"docs/extending.md's block differs from {path}"
        )
        shown[path] = block
    files = {
        str(p.relative_to(PLUGIN))
        for p in PLUGIN.rglob("*")
        if p.suffix in (".py", ".toml") and "__pycache__" not in p.parts
    }
    assert set(shown) == files, f"files not in docs/extending.md: {sorted(files - set(shown))}"
    assert not (
        set(re.findall(r"^```(\w*)$", DOC.read_text(), flags=re.M)) - {"python", "toml", "bash", ""}
    )


# --- through the public CLI ----------------------------------------------------------------------


def commands() -> list[list[str]]:
    """The doc's shell commands, continuation lines joined."""
    (block,) = doc_blocks("bash")
    return [shlex.split(line) for line in block.replace("\\\n", " ").splitlines() if line.strip()]


@pytest.mark.slow
def test_the_docs_commands_run_the_plugin_and_its_setting_changes_the_result(tmp_path):
    env = install(tmp_path)
    outputs = []
    for argv in commands():
        assert argv[0] == "fedac"
        done = subprocess.run(
            [str(FEDAC), *argv[1:]], env=env, cwd=tmp_path, capture_output=True, text=True
        )
        assert done.returncode == 0, f"{shlex.join(argv)}\n{done.stderr}"
        outputs.append(done.stdout)
    listing = outputs[0]
    for name in ("fedavg_lr", "tiny_mlp", "tones", "drop_farthest", "free_rider"):
        assert re.search(rf"^  {name} +\[plug-in\] \S", listing, flags=re.M), name
    runs = [
        Path(tmp_path, argv[argv.index("--out") + 1]) for argv in commands() if argv[1] == "run"
    ]
    assert len(runs) == 4
    *runs, sign = runs  # (the fourth: the plug-in codec)
    saved = yaml.safe_load((sign / "config.yaml").read_text())
    assert saved["compression"]["method"] == "scaled_sign"
    rows = list(csv.DictReader((sign / "metrics.csv").open()))
    assert rows and all(0 < float(r["upload_bytes"]) < float(r["download_bytes"]) for r in rows)
    results = [json.loads((run / "results.json").read_text()) for run in runs]
    settings = [yaml.safe_load((run / "config.yaml").read_text()) for run in runs]
    for saved in settings:  # every part the run named is the plug-in's
        assert (saved["algorithm"], saved["dataset"], saved["model"]["name"]) == (
            "fedavg_lr",
            "tones",
            "tiny_mlp",
        )
        assert (saved["aggregation"]["method"], saved["attack"]["kind"]) == (
            "drop_farthest",
            "free_rider",
        )
    # the attack picked its clients
    assert [r["final"]["malicious_clients"] for r in results] == [2, 2, 2]
    assert [saved["fedavg_lr"]["server_lr"] for saved in settings] == [0.5, 1.5, 0.5]
    # the aggregator's own setting
    assert [saved["aggregation"]["drop"] for saved in settings] == [1, 1, 0]
    # Each setting reaches its part (the server's step; the aggregator's mean of 2 or all 3
    # uploads): the same seed, clients and data, another model.
    losses = [
        [row["train_loss"] for row in csv.DictReader((run / "metrics.csv").open())] for run in runs
    ]
    assert all(losses)
    assert losses[0] != losses[1] and losses[0] != losses[2]
    assert results[0]["final"]["accuracy"] != results[1]["final"]["accuracy"]


def test_the_plugin_codec_compresses_as_computed_by_hand(tmp_path):
    """The scaled sign through fedac's Compressor: the rebuilt update is (||v||_1 / n) sign(v) per
    tensor, the bytes 4 + ceil(n / 8) per tensor, the wire form decodes to the same upload, error
    feedback on by default (a biased codec), and `fedac list codecs` marks it a plug-in."""
    env = install(tmp_path)
    out = probe(
        env,
        """
import json, torch
from fedac.config import load_config
from fedac.rules.compression import Compressor
comp = Compressor(load_config(None, ["compression.method=scaled_sign"]))
payload = {"w": torch.zeros(2, 5), "b": torch.ones(3), "n": torch.tensor(4)}
upload = {"w": torch.tensor([[1.0, -2.0, 0.0, 3.0, -1.0], [0.5, 0.5, -0.5, 0.0, 2.0]]),
          "b": torch.tensor([1.5, 0.0, 2.0]), "n": torch.tensor(5)}
residuals = {}
(sent,) = comp(payload, ["a"], [upload], 1, residuals)
wire = comp.encode(payload, upload, "a", 1, {})
again = comp.decode(payload, wire)
print(json.dumps({"w": sent["w"].tolist(), "b": sent["b"].tolist(), "n": int(sent["n"]),
                  "bytes": comp.wire_bytes(payload, upload), "feedback": comp.feedback,
                  "wire": sum(v.numel() * v.element_size() for v in wire.values()),
                  "same": all(torch.equal(again[k], sent[k]) for k in sent),
                  "residual": residuals["a"]["w"].tolist()}))
""",
    )
    w = [[1.0, -2.0, 0.0, 3.0, -1.0], [0.5, 0.5, -0.5, 0.0, 2.0]]
    scale = sum(abs(x) for row in w for x in row) / 10  # 1.05
    expected = [[scale * (-1 if x < 0 else 1) for x in row] for row in w]
    assert sum(out["w"], []) == pytest.approx(sum(expected, []))
    # b's update (0.5, -1, 1): mean magnitude 5/6 around the broadcast's ones
    assert out["b"] == pytest.approx([1 + 5 / 6, 1 - 5 / 6, 1 + 5 / 6])
    assert out["n"] == 5  # integer entries travel dense
    assert out["bytes"] == (4 + 2) + (4 + 1) + 8 == out["wire"]
    assert out["same"] and out["feedback"]
    left = [a - b for row, kept in zip(w, expected) for a, b in zip(row, kept)]
    assert sum(out["residual"], []) == pytest.approx(left)
    done = subprocess.run(
        [sys.executable, "-m", "fedac", "list", "codecs"], env=env, capture_output=True, text=True
    )
    assert re.search(r"^  scaled_sign +\[plug-in\] per tensor", done.stdout, flags=re.M)


def test_without_its_entry_point_the_algorithm_is_unknown_and_the_registered_ones_are_listed(
    tmp_path,
):
    env = install(tmp_path, drop=("fedavg_lr",))
    done = subprocess.run(
        [str(FEDAC), "run", "--algorithm", "fedavg_lr", "--set", "fedavg_lr.server_lr=2"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(
        "fedac: error: unknown algorithm 'fedavg_lr'. Registered algorithms: fedavg, fedprox,"
    )
    assert "fedmlac" in line and "central" in line
    assert not (tmp_path / "runs").exists()


def test_plugin_settings_are_typed_ranged_and_checked_before_torch_loads(tmp_path):
    broken = {"fedac.algorithms": {"broken": "fedac_example.nowhere:Algorithm"}}
    env = install(tmp_path, extra=broken)
    out = probe(
        env,
        """
import json, sys
from fedac.config import load_config, algorithm_sections
from fedac.errors import ConfigError
from test_config_ranges import SETTINGS
def error(*sets):
    try:
        load_config(None, list(sets))
    except ConfigError as exc:
        return str(exc)
cfg = load_config(None, ["algorithm=fedavg_lr", "fedavg_lr.server_lr=2"])
print(json.dumps({"lr": cfg.fedavg_lr.server_lr, "default": load_config().fedavg_lr.server_lr,
                  "saved": cfg.to_dict()["fedavg_lr"], "walk": [key for key, *_ in SETTINGS],
                  "sections": sorted(algorithm_sections()),
                  "range": error("fedavg_lr.server_lr=0"),
                  "type": error("fedavg_lr.server_lr=fast"),
                  "key": error("fedavg_lr.lr=1"), "broken": error("algorithm=broken"),
                  "heavy": sorted(m for m in sys.modules
                                  if m.split(".")[0] in ("torch", "scipy", "sklearn"))}))
""",
    )
    assert (out["lr"], out["default"], out["saved"]) == (2.0, 1.0, {"server_lr": 2.0})
    # tests/test_config_ranges.py checks the plug-in's range too
    assert "fedavg_lr.server_lr" in out["walk"]
    assert "fedavg_lr" in out["sections"] and "fedopt" in out["sections"]
    assert out["range"] == "fedavg_lr.server_lr must be > 0, got 0.0"
    assert out["type"] == "setting 'fedavg_lr.server_lr' expects float, got 'fast'"
    assert out["key"] == "unknown setting 'fedavg_lr.lr'. Known settings here: fedavg_lr.server_lr"
    assert out["broken"].startswith(
        "algorithm 'broken' (entry point fedac_example.nowhere:Algorithm in group "
        "fedac.algorithms) does not load: ModuleNotFoundError"
    )
    assert out["heavy"] == []  # the plug-in's settings loaded, its algorithm (torch) did not


def test_a_config_file_with_the_plugins_section_loads_and_saves(tmp_path):
    env = install(tmp_path)
    path = tmp_path / "exp.yaml"
    path.write_text("algorithm: fedavg_lr\nfedavg_lr:\n  server_lr: 0.25\ntrain:\n  rounds: 2\n")
    out = probe(
        env,
        f"""
import json
from fedac.config import load_config, save_config
cfg = load_config({str(path)!r})
save_config(cfg, {str(tmp_path / "again.yaml")!r})
again = load_config({str(tmp_path / "again.yaml")!r})
print(json.dumps([cfg.fedavg_lr.server_lr, again == cfg]))
""",
    )
    assert out == [0.25, True]


# --- the registry itself -------------------------------------------------------------------------


def test_registry_names_values_and_errors():
    registry = Registry("model", {"a": Entry("json:dumps", "JSON text"), "b": Entry("json:loads")})
    assert list(registry) == ["a", "b"] and "a" in registry and "zzz" not in registry
    assert registry.load("a") is json.dumps
    assert registry.description("a") == "JSON text"
    # no description: the target's docstring
    assert registry.description("b").startswith("Deserialize")
    with pytest.raises(ConfigError, match=r"^unknown model 'c'. Registered models: a, b$"):
        registry["c"]
    registry.register("c", Entry("json:JSONDecoder"))
    assert registry.load("c") is json.JSONDecoder
    with pytest.raises(ConfigError, match="registered already"):
        registry.register("a", Entry("json:dumps"))
    with pytest.raises(ConfigError, match="cannot load 'json:nothing'"):
        Registry("attack", {"x": Entry("json:nothing")}).load("x")
    named = Registry("aggregator", {}, setting="aggregation.method")
    with pytest.raises(
        ConfigError, match=r"^unknown aggregation.method 'x'. Registered aggregators: $"
    ):
        named["x"]


# --- the virtual clock's parts --------------------------------------------------------------------


@pytest.mark.slow
def test_an_availability_model_plugin_is_listed_and_times_the_rounds(tmp_path):
    """docs/extending.md's office hours: listed as a plug-in beside the built-in models and clock
    modes; a run that names it starts at 9:00 of the first virtual day (no client is online
    before) and samples only the 9:00 shift (the run's clients 0, 3, 6, ...)."""
    env = install(tmp_path)
    # (this checkout's fedac first, where the environment's is another)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env["PYTHONPATH"]])

    def fedac(*argv: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "fedac", *argv],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    listing = fedac("list", "clock_modes", "availability")
    for name in ("sync", "fedbuff", "fedasync", "always", "synthetic"):
        assert re.search(rf"^  {name} +[^[]", listing, flags=re.M), name
    assert re.search(r"^  office_hours +\[plug-in\] online 8 h", listing, flags=re.M)
    fedac(
        "run", "--dataset", "tones", "--set", "model.name=tiny_mlp", "--rounds", "2", "--quiet",
        "--set", "system.availability=office_hours", "--set", "train.fraction=0.5",
        "--out", "office",
    )  # fmt: skip
    rows = list(csv.DictReader((tmp_path / "office" / "system.csv").open()))
    assert [float(r["virtual_time_s"]) for r in rows] == [9 * 3600.0, 9 * 3600.0]
    clients = json.loads((tmp_path / "office" / "results.json").read_text())["clients"]
    shift = len(range(0, clients, 3))
    assert all(float(r["sampled"]) == min(shift, round(0.5 * clients)) for r in rows)


def test_an_availability_model_must_give_every_client_a_schedule():
    from fedac.data.traces import ALWAYS, model_schedules

    assert model_schedules("m", {"a": ALWAYS, "b": ALWAYS}, ["b"]) == {"b": ALWAYS}
    with pytest.raises(ConfigError, match="availability model 'm' gave client 'b' NoneType"):
        model_schedules("m", {"a": ALWAYS}, ["a", "b"])
    with pytest.raises(ConfigError, match="must return"):
        model_schedules("m", [ALWAYS], ["a"])
    with pytest.raises(ConfigError, match=r"registered availability model \(always, synthetic"):
        from fedac.data.traces import load_availability

        load_availability("nosuch", ["a"], 0)
