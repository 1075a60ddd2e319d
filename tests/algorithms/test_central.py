"""`--algorithm central` (FedKWS-UI Table 2's centralised trainer): the warm-up + quadratic-decay
schedule by hand, one pooled client, a persistent optimiser, resume exactness and the CLI's run
directory."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from fedac.algorithms import build_algorithm
from fedac.algorithms.base import Task
from fedac.algorithms.central import scheduled_lr
from fedac.cli import main
from fedac.config import load_config
from fedac.engine.simulator import Simulator
from fedac.errors import ConfigError
from helpers import tiny_run

pytestmark = pytest.mark.usefixtures("one_thread")


def test_schedule_by_hand():
    # T = 10 rounds, W = 5: lr/5 ... lr over the warm-up, then lr (1 - (t - 5) / 5)^p for t = 5..9
    assert [scheduled_lr(0.1, r, 10, 5, 2.0) for r in range(1, 11)] == pytest.approx(
        [0.02, 0.04, 0.06, 0.08, 0.1, 0.1, 0.064, 0.036, 0.016, 0.004]
    )
    assert scheduled_lr(0.1, 8, 10, 5, 1.0) == pytest.approx(0.06)  # decay_power 1: linear
    assert scheduled_lr(0.1, 10, 10, 5, 0.0) == pytest.approx(0.1)  # decay_power 0: constant
    assert scheduled_lr(0.1, 1, 10, 0, 2.0) == pytest.approx(0.1)  # no warm-up: decay from round 1
    assert scheduled_lr(0.1, 3, 10, 0, 2.0) == pytest.approx(0.1 * 0.8**2)


@pytest.mark.parametrize(
    "override, message",
    [
        ("data.partition=natural", "unset data.partition or set it to pooled"),
        (
            "central.warmup_epochs=6",
            r"central.warmup_epochs must lie in \[0, train.rounds=6\), got 6",
        ),
        ("central.decay_power=-1", "central.decay_power must be >= 0"),
    ],
)
def test_bad_settings_are_named(override, message):
    clients = ["a", "b"] if "partition" in override else ["pooled"]
    with pytest.raises(ConfigError, match=message):  # load_config refuses a value outside its range
        cfg = load_config(
            overrides=["algorithm=central", "train.rounds=6", "central.warmup_epochs=2", override]
        )
        build_algorithm(cfg, Task(40, 12, clients))


@pytest.fixture(scope="module")
def settings(gsc_root):
    return {
        **tiny_run(gsc_root, None),
        "algorithm": "central",
        "train.rounds": 4,
        "train.local_epochs": 1,
        "train.batch_size": 8,
        "central.warmup_epochs": 1,
        "train.select": "last",
        "data.task": 12,
        "data.gsc12": "fedkws",
    }


@pytest.fixture(scope="module")
def full_run(settings, tmp_path_factory):
    cfg = load_config(overrides=[f"{k}={v}" for k, v in settings.items()])
    sim = Simulator(cfg, tmp_path_factory.mktemp("central") / "full", progress=False)
    return sim, sim.run()


@pytest.mark.slow
def test_one_pooled_client_trains_with_the_scheduled_lr(full_run):
    sim, results = full_run
    assert [c.name for c in sim.data.clients] == ["pooled"] and results["clients"] == 1
    train_clips = sum(1 for c in sim.data.manifest.clips if c.split == "train")
    assert sim.data.clients[0].num_samples + sim.data.clients[0].holdout_y.numel() == train_clips
    assert [row["lr"] for row in results["history"]] == pytest.approx(
        [scheduled_lr(0.1, r, 4, 1, 2.0) for r in (1, 2, 3, 4)]
    )
    losses = [row["train_loss"] for row in results["history"]]
    # it learns the tone chords
    assert losses == sorted(losses, reverse=True) and losses[-1] < losses[0] - 0.2
    assert results["final"]["accuracy"] > 1.5 / 12
    # the optimiser's momentum is the client's persistent state
    state = sim.state.clients["pooled"]
    assert state["state"] and all("momentum_buffer" in s for s in state["state"].values())


def test_persistent_optimizer_changes_the_update(full_run):
    sim, _ = full_run
    algo, data = sim.algorithm, sim.data.clients[0]
    payload = sim.state.server["params"]
    gen = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    with_state = algo.client_update(payload, sim.state.clients["pooled"], data, 2, gen()).upload
    fresh = algo.client_update(payload, None, data, 2, gen()).upload
    assert any(
        not torch.equal(with_state[k], fresh[k]) for k in fresh if fresh[k].is_floating_point()
    )


def test_resumed_central_run_ends_with_the_uninterrupted_parameters(full_run, settings, tmp_path):
    full, _ = full_run
    cfg = load_config(overrides=[f"{k}={v}" for k, v in settings.items()])
    part = Simulator(cfg, tmp_path / "part", full.data, progress=False)
    assert part.run(stop_after=2) is None  # mid-decay, with momentum buffers in the checkpoint
    resumed = Simulator(cfg, tmp_path / "part", full.data, progress=False)
    resumed.run(resume=True)
    for key, value in full.state.server["params"].items():
        assert torch.equal(value, resumed.state.server["params"][key]), key


def test_fedac_run_central_writes_a_run_directory(settings, tmp_path, capsys):
    args = [
        "run",
        "--algorithm",
        "central",
        "--rounds",
        "2",
        "--out",
        str(tmp_path / "run"),
        "--quiet",
    ]
    for key, value in settings.items():
        if key not in ("algorithm", "train.rounds"):
            args += ["--set", f"{key}={value}"]
    assert main(args) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["algorithm"] == "central" and results["clients"] == 1
    # the 12-class task's FA / FR, as for the federated methods
    assert 0 <= results["final"]["fa"] <= 1
    rows = list(csv.DictReader(open(tmp_path / "run" / "metrics.csv")))
    assert [float(r["lr"]) for r in rows] == pytest.approx([0.1, 0.1])  # W = 1, then (1 - 0 / 1)^2
    assert (tmp_path / "run" / "config.yaml").is_file()


def test_table2_reproduction_resolves_to_the_central_protocol():
    from fedac.experiments.compare import parse_method
    from fedac.experiments.fedkws import EXPERIMENTS as KWS_EXPERIMENTS

    experiment = KWS_EXPERIMENTS["fedkws-central"]
    method = parse_method(experiment.methods[0])
    cfg = load_config(overrides=experiment.protocol + method.overrides, algorithm=method.algorithm)
    assert (cfg.algorithm, cfg.train.rounds, cfg.train.batch_size, cfg.train.local_steps) == (
        "central",
        50,
        128,
        0,
    )
    assert (cfg.central.warmup_epochs, cfg.central.decay_power, cfg.train.max_grad_norm) == (
        5,
        2.0,
        50,
    )
    assert cfg.features.style == "fedkws" and cfg.data.task == "12" and cfg.data.partition is None
