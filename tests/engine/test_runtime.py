"""The runtime object (training/runtime.py): `train.*` resolved once per run into a frozen Runtime
that the drivers pass down to the data builders and the algorithm; the one run skeleton
(engine/run.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fedac.config import load_config
from fedac.errors import ConfigError
from fedac.training import runtime as runtime_mod
from fedac.training.runtime import Runtime
from helpers import tiny_run

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_runtime_holds_the_settings_resolved_and_cannot_change():
    train = load_config(
        None,
        [
            "train.device=cpu",
            "train.devices=cpu,cpu",
            "train.cohort_workers=3",
            "train.cohort_chunk=5",
            "train.client_memory=host",
            "train.precision=bf16",
            "train.deterministic=false",
        ],
    ).train
    rt = Runtime.resolve(train)
    assert rt == Runtime(
        torch.device("cpu"), (torch.device("cpu"),) * 2, "bf16", False, 5, "host", 3
    )
    assert rt.name == "cpu"
    with rt.autocast():  # train.precision's arithmetic
        assert torch.is_autocast_enabled("cpu")
    with pytest.raises(dataclasses.FrozenInstanceError):
        rt.device = torch.device("meta")  # type: ignore[misc]
    # auto (0) workers is a number once resolved; a node's own device replaces train.device
    assert Runtime.resolve(load_config(None, ["train.cohort_workers=0"]).train).workers >= 1
    assert (
        Runtime.resolve(
            load_config(None, ["train.device=cuda:7"]).train, torch.device("cpu")
        ).device.type
        == "cpu"
    )
    with pytest.raises(ConfigError, match="train.precision=tf32 needs a CUDA device"):
        Runtime.resolve(load_config(None, ["train.device=cpu", "train.precision=tf32"]).train)


def test_start_runtime_applies_the_process_settings_before_counting_workers(monkeypatch):
    order = []
    monkeypatch.setattr(runtime_mod, "configure_process", lambda train: order.append("process"))
    monkeypatch.setattr(
        runtime_mod, "cohort_workers", lambda train, device: order.append("workers") or 2
    )
    monkeypatch.setattr(
        runtime_mod, "configure_precision", lambda *a: order.append(("precision", *a))
    )
    rt = runtime_mod.start_runtime(
        load_config(None, ["train.device=cpu", "train.deterministic=false"]).train
    )
    assert (
        order == ["process", "workers", ("precision", "fp32", torch.device("cpu"), False)]
        and rt.workers == 2
    )


def test_a_run_resolves_its_device_once_and_passes_it_down(gsc_root, tmp_path, monkeypatch):
    """The simulator resolves train.device once; the data builder and the algorithm get that runtime
    instead of reading train.device again."""
    from fedac.engine import data as data_mod
    from fedac.engine.simulator import Simulator

    calls = []
    real = runtime_mod.resolve_device
    monkeypatch.setattr(
        runtime_mod, "resolve_device", lambda setting: calls.append(setting) or real(setting)
    )
    monkeypatch.setattr(
        data_mod,
        "resolve_device",
        lambda setting: pytest.fail("the data builder resolved the device"),
    )
    cfg = load_config(
        None,
        [
            f"{k}={v}"
            for k, v in {
                **tiny_run(gsc_root, tmp_path / "cache"),
                "train.rounds": 1,
                "train.cohort_workers": 2,
            }.items()
        ],
    )
    sim = Simulator(cfg, tmp_path / "run", progress=False)
    assert calls == [cfg.train.device]
    assert sim.algorithm.runtime is sim.runtime and sim.runtime.workers == 2
    assert sim.algorithm.device == sim.device == sim.runtime.device


def test_every_driver_runs_the_one_skeleton():
    from fedac.engine.run import RoundDriver
    from fedac.engine.simulator import Simulator
    from fedac.engine.zeroshot import ZeroShotDriver

    for driver in (Simulator, ZeroShotDriver):
        assert issubclass(driver, RoundDriver) and driver.run is RoundDriver.run


def test_the_cohort_path_plans_and_runs_its_chunks_on_the_runtimes_workers(monkeypatch):
    """The stacked path takes the worker count from the algorithm's runtime: train.cohort_workers is
    not read again per round (here the runtime says 2 where the setting says 1)."""
    from fedac.algorithms import build_algorithm
    from fedac.algorithms.base import ClientData, Task
    from fedac.engine.execution import run_clients
    from fedac.training import stacking as cohort_mod

    cfg = load_config(
        overrides=[
            "train.device=cpu",
            "train.cohort_workers=1",
            "train.cohort_chunk=2",
            "train.execution=cohort",
            "model.name=crnn_tiny",
        ]
    )
    rt = dataclasses.replace(Runtime.resolve(cfg.train), workers=2)
    g = torch.Generator().manual_seed(0)
    clients = [
        ClientData(
            f"c{i}",
            torch.randn(8, 8, 21, generator=g),
            torch.randint(0, 3, (8,), generator=g),
            torch.zeros(0, 8, 21),
            torch.zeros(0, dtype=torch.long),
        )
        for i in range(4)
    ]
    algo = build_algorithm(cfg, Task(8, 3, [c.name for c in clients]), rt)
    slots = []
    pooled = cohort_mod._pooled
    monkeypatch.setattr(
        cohort_mod, "cohort_workers", lambda *a: pytest.fail("train.cohort_workers read again")
    )
    monkeypatch.setattr(
        cohort_mod,
        "_pooled",
        lambda work, chunks, s, prefix: slots.append(len(s)) or pooled(work, chunks, s, prefix),
    )
    payload = algo.broadcast(algo.init_server())
    results = run_clients(
        algo, payload, [algo.init_client_state(c.name) for c in clients], clients, 1, 0
    )
    assert len(results) == 4 and slots == [2]


def test_a_plugin_algorithm_with_the_old_constructor_still_builds(monkeypatch):
    """A plug-in written before the runtime object defines `__init__(self, cfg, task)`;
    build_algorithm gives the runtime only to constructors that take it, and the base class resolves
    one from train.*."""
    import fedac.algorithms as algorithms
    from fedac.algorithms.fedavg import FedAvg
    from fedac.training.types import Task

    class OldStyle(FedAvg):
        def __init__(self, cfg, task):
            super().__init__(cfg, task)
            self.built_old_style = True

    monkeypatch.setattr(algorithms, "algorithm_class", lambda name: OldStyle)
    cfg = load_config(None, ["train.device=cpu"])
    algo = algorithms.build_algorithm(cfg, Task(40, 4, ["a", "b"]), Runtime.resolve(cfg.train))
    assert algo.built_old_style and algo.runtime == Runtime.resolve(cfg.train)
