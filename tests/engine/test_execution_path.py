"""Issue 56, never silent: a run names the path its clients took (first line, results.json), and
runtime.execution=cohort that cannot stack fails at start naming why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedac.cli import main
from fedac.config import load_config
from fedac.engine.simulator import Simulator
from fedac.errors import ConfigError


def settings(gsc_root, tmp_path, *overrides):
    return load_config(
        overrides=[
            f"data.root={gsc_root}",
            f"data.cache_dir={tmp_path / 'cache'}",
            "train.rounds=1",
            "train.fraction=0.35",
            "train.local_epochs=1",
            "runtime.device=cpu",
            *overrides,
        ]
    )


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    # FedKWS-UI's 8 kHz features, computed once for its three networks
    return tmp_path_factory.mktemp("features")


@pytest.mark.parametrize(
    "overrides, path",
    [
        (["model.name=crnn_tiny"], "stacked"),
        (["model.name=cnn1_softmax", "runtime.execution=cohort"], "stacked"),
        (
            ["model.name=crnn_tiny", "runtime.execution=sequential"],
            "sequential: runtime.execution=sequential",
        ),
        (
            ["algorithm=fedmmd", "model.name=crnn_tiny"],
            "sequential: FedMMD overrides client_update",
        ),
        # FedKWS-UI's networks under its own protocol (clipping; KWT with AdamW), forced stacked
        *[
            (
                [
                    "algorithm=fedkwsui",
                    "data.task=12",
                    f"model.name={net}",
                    "runtime.execution=cohort",
                    "train.fraction=0.15",
                ],
                "stacked",
            )
            for net in ("dscnn", "kwt", "mhattrnn")
        ],
    ],
)
def test_the_run_names_its_path_first_and_in_results_json(
    gsc_root, tmp_path, capsys, overrides, path, shared_cache
):
    overrides = [*overrides, f"data.cache_dir={shared_cache}"]
    sim = Simulator(settings(gsc_root, tmp_path, *overrides), tmp_path / "run", progress=True)
    sim.run()
    err = capsys.readouterr().err
    first = next(line for line in err.splitlines() if line.startswith("fedac: "))
    # before the bar
    assert first.endswith(f"clients train {path}") and err.index(first) < err.index("rounds")
    assert json.loads((tmp_path / "run" / "results.json").read_text())["execution"] == path


@pytest.mark.parametrize(
    "overrides, reason",
    [
        (["algorithm=fedmmd"], "FedMMD overrides client_update"),
        (["algorithm=fedkad"], "FedKAD has no stacked cohort_update"),
        (["train.optimizer=lbfgs"], "train.optimizer=lbfgs"),
    ],
)
def test_cohort_mode_that_cannot_stack_fails_at_start(gsc_root, tmp_path, overrides, reason):
    with pytest.raises(ConfigError, match=f"runtime.execution=cohort.*{reason}"):
        Simulator(
            settings(gsc_root, tmp_path, "runtime.execution=cohort", *overrides),
            tmp_path / "run",
            progress=False,
        )
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def test_fedac_models_shows_each_models_stacked_support(capsys):
    assert main(["models", "--num-classes", "5"]) == 0
    table = capsys.readouterr().out.split("\n\n")[0]  # (the SSL encoders' PEFT table follows)
    rows = table.splitlines()[2:]  # (a sizing notice, the header's line, the columns' names)
    lines = {line.split()[0]: line for line in rows if not line.startswith("[")}
    stacked = {name: line.split()[4] for name, line in lines.items()}  # (the stacked column)
    notes = {line.split()[0]: line for line in rows if line.startswith("[")}
    assert stacked["crnn_lite"] == "crnn"
    assert all(stacked[name] == "kws" for name in ("dscnn", "mhattrnn", "resnet15", "kwt"))
    assert stacked["cnn3_relu"] == "vmap"
    # the SSL encoders stay sequential: measured slower vmapped, the reason said once in a note
    # (benchmarks/results/stacked_models.json, "ssl")
    ssl = json.loads(
        (Path(__file__).parents[2] / "benchmarks" / "results" / "stacked_models.json").read_text()
    )["ssl"]
    assert all(stacked[name] == "no" and "[1]" in lines[name] for name in ("w2v2_tiny", "w2v2_s"))
    assert ssl["ratio_cpu"] > 1
    assert f"{ssl['ratio_cpu']:.2f}x the sequential CPU time" in notes["[1]"]
    assert "measured slower vmapped" in notes["[1]"] and "has its own task_loss" in notes["[1]"]


def test_probe_measures_a_vmapped_network_in_the_first_round_and_a_resume_keeps_the_choice(
    gsc_root, tmp_path, capsys
):
    cfg = settings(
        gsc_root,
        tmp_path,
        "model.name=cnn1_softmax",
        "train.rounds=2",
        "train.checkpoint_every=1",
        "runtime.execution=probe",
    )
    killed = Simulator(cfg, tmp_path / "run", progress=True)
    assert killed.plan.needs_probe
    killed.run(stop_after=1)
    assert "clients train auto: stacked or sequential" in capsys.readouterr().err
    (choice,) = killed.plan.measured.values()
    assert choice["path"] in ("stacked", "sequential") and choice["clients"] >= 1
    resumed = Simulator(cfg, tmp_path / "run", killed.data, progress=True)
    results = resumed.run(resume=True)
    assert resumed.plan.measured == killed.plan.measured  # not measured again
    first = next(
        line for line in capsys.readouterr().err.splitlines() if line.startswith("fedac: ")
    )
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["execution"] == results["execution"] and first.endswith(
        f"clients train {saved['execution']}"
    )
    assert (
        saved["execution"] == "stacked"
        if choice["path"] == "stacked"
        else saved["execution"].startswith(
            "sequential: auto measured model cnn1_softmax's stacked path (vmap) slower on"
        )
    )
    assert saved["execution_probe"] == killed.plan.measured


AUGMENTED = ("data.task=12", "data.gsc12=fedkws", "features.style=fedkws", "features.augment=true")


@pytest.mark.parametrize(
    "algorithm, extra",
    [("fedkwsui", ()), ("fedavg", ()), ("fedkwsui", AUGMENTED)],
    ids=["fedkwsui", "fedavg", "fedkwsui-augmented"],
)
def test_a_resumed_stacked_run_ends_exactly_like_an_uninterrupted_one(
    gsc_root, tmp_path, algorithm, extra
):
    cfg = settings(
        gsc_root,
        tmp_path,
        f"algorithm={algorithm}",
        "model.name=cnn1_softmax",
        "train.rounds=2",
        "train.checkpoint_every=1",
        "runtime.execution=cohort",
        "fedkwsui.local_steps=2",
        *extra,
    )
    straight = Simulator(cfg, tmp_path / "straight", progress=False)
    straight.run()
    if extra:  # each batch's windows drawn afresh, on the stacked path
        from fedac.data.augment import AugmentedWindows

        assert straight.plan.path == "stacked" and any(
            isinstance(c.x, AugmentedWindows) for c in straight.data.clients
        )
    Simulator(cfg, tmp_path / "resumed", straight.data, progress=False).run(stop_after=1)
    resumed = Simulator(cfg, tmp_path / "resumed", straight.data, progress=False)
    resumed.run(resume=True)
    assert resumed.rounds_trained == 1 and resumed.plan.path == "stacked"
    for name, value in straight.state.server["params"].items():
        assert torch.equal(value, resumed.state.server["params"][name]), name
