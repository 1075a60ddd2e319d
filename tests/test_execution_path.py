"""Issue 56, never silent: a run names the path its clients took (first line, results.json), and
train.execution=cohort that cannot stack fails at start naming why."""

from __future__ import annotations

import json

import pytest

from fedac.cli import main
from fedac.config import load_config
from fedac.engine.simulator import Simulator
from fedac.errors import ConfigError


def settings(gsc_root, tmp_path, *overrides):
    return load_config(overrides=[f"data.root={gsc_root}", f"data.cache_dir={tmp_path / 'cache'}", "train.rounds=1",
                                  "train.fraction=0.35", "train.local_epochs=1", "train.device=cpu", *overrides])


@pytest.mark.parametrize("overrides, path", [
    (["model.name=crnn_tiny"], "stacked"),
    (["model.name=cnn1_softmax", "train.execution=cohort"], "stacked"),
    (["model.name=cnn1_softmax"], "sequential: model cnn1_softmax's stacked path (vmap) is slower than one client "
                                  "at a time on the CPU (train.execution=cohort forces it)"),
    (["model.name=crnn_tiny", "train.execution=sequential"], "sequential: train.execution=sequential"),
    (["algorithm=fedmmd", "model.name=crnn_tiny"], "sequential: FedMMD overrides client_update"),
])
def test_the_run_names_its_path_first_and_in_results_json(gsc_root, tmp_path, capsys, overrides, path):
    sim = Simulator(settings(gsc_root, tmp_path, *overrides), tmp_path / "run", progress=True)
    sim.run()
    err = capsys.readouterr().err
    first = next(line for line in err.splitlines() if line.startswith("fedac: "))
    assert first.endswith(f"clients train {path}") and err.index(first) < err.index("rounds")  # before the bar
    assert json.loads((tmp_path / "run" / "results.json").read_text())["execution"] == path


@pytest.mark.parametrize("overrides, reason", [
    (["features.augment=true", "model.name=dscnn"], "features.augment"),
    (["algorithm=fedmmd"], "FedMMD overrides client_update"),
    (["algorithm=fedkad"], "FedKAD has no stacked cohort_update"),
    (["train.optimizer=lbfgs"], "train.optimizer=lbfgs"),
])
def test_cohort_mode_that_cannot_stack_fails_at_start(gsc_root, tmp_path, overrides, reason):
    with pytest.raises(ConfigError, match=f"train.execution=cohort.*{reason}"):
        Simulator(settings(gsc_root, tmp_path, "train.execution=cohort", *overrides), tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def test_fedac_models_shows_each_models_stacked_support(capsys):
    assert main(["models", "--num-classes", "5"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert "stacked: crnn " in lines["crnn_lite"]
    assert all("stacked: vmap " in lines[name] for name in ("dscnn", "mhattrnn", "resnet15", "kwt", "cnn3_relu"))
    assert "stacked: no: has its own task_loss" in lines["w2v2_tiny"]
