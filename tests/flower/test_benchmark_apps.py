"""The Flower side of benchmarks/bench_cohort.py (benchmarks/flower_apps.py), run in process on a
LocalGrid so that it cannot rot between benchmark runs, and the arithmetic that turns its marks into
timings. Nothing here times anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

flwr = pytest.importorskip(
    "flwr", reason="flwr is not installed; the benchmark's Flower apps are not tested"
)

from flwr.app import Context, MessageType, RecordDict  # noqa: E402

from flower_helpers import LocalGrid, use_task_identity  # noqa: E402

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def apps(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    use_task_identity(monkeypatch)
    import flower_apps

    # the fedmlac workload points fedac's data builder at the benchmark's data: restore it
    # afterwards
    for module in (flower_apps.fedac_clientapp, flower_apps.fedac_simulator):
        monkeypatch.setattr(module, "build_federated_data", module.build_federated_data)
    return flower_apps


def run_app(apps, run_config: dict, nodes: int) -> LocalGrid:
    grid = LocalGrid(
        apps.clientapp,
        {100 + k: {"partition-id": k, "num-partitions": nodes} for k in range(nodes)},
        run_config,
    )
    apps.main(
        grid,
        Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config),
    )
    return grid


def events(path: Path) -> list[str]:
    return [event for event, _ in json.loads(path.read_text())]


@pytest.mark.slow
def test_w_app_trains_with_flowers_fedavg_and_marks_every_round(apps, tmp_path):
    marks = tmp_path / "marks.json"
    config = {
        "workload": "w",
        "nodes": 20,
        "rounds": 2,
        "lr": 0.01,
        "torch-threads": 1,
        "marks-file": str(marks),
    }
    grid = run_app(apps, config, nodes=20)
    assert events(marks) == ["serverapp_start"] + ["round_start"] * 3 + ["serverapp_end"]
    trained = [m for m in grid.sent if m.metadata.message_type == MessageType.TRAIN]
    assert len(trained) == 2 * apps.W_PER_ROUND  # Flower's FedAvg sampled W's 10 clients per round


@pytest.mark.slow
def test_fedmlac_app_is_the_fedac_flower_app_on_the_benchmark_data(apps, tmp_path):
    marks, run_dir = tmp_path / "marks.json", tmp_path / "run"
    settings = (
        "model.client_model=crnn_tiny;fedmlac.plugin_model=crnn_tiny;runtime.threads=1;"
        "data.num_clients=10"
    )
    config = {
        "workload": "fedmlac",
        "algorithm": "fedmlac",
        "rounds": 2,
        "fraction": 0.2,
        "fedac-set": settings,
        "min-nodes": 10,
        "poll-interval": 0.01,
        "run-dir": str(run_dir),
        "marks-file": str(marks),
    }
    run_app(apps, config, nodes=10)
    assert events(marks) == ["serverapp_start", "round_start", "round_start", "serverapp_end"]
    log = json.loads((run_dir / "flower_clients.json").read_text())
    assert [len(log["rounds"][r]) for r in ("1", "2")] == [2, 2]
    # the benchmark's
    assert {n["client"] for n in log["nodes"].values()} == {f"client{k:04d}" for k in range(10)}
    assert json.loads((run_dir / "results.json").read_text())["rounds"] == 2


def test_flower_timings_from_marks(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from bench_cohort import flower_timings

    marks = [
        ("serverapp_start", 10.0),
        ("round_start", 12.0),
        ("round_start", 20.0),
        ("round_start", 21.0),
        ("round_start", 22.5),
        ("serverapp_end", 23.0),
    ]
    boundaries = flower_timings(marks, launched=5.0, every_boundary=True)  # W: every round boundary
    assert boundaries["round_s_all"] == [8.0, 1.0, 1.5] and boundaries["steady_round_s"] == 1.25
    assert (boundaries["startup_s"], boundaries["launch_to_serverapp_s"], boundaries["wall_s"]) == (
        7.0,
        5.0,
        18.0,
    )
    # fedac app: round starts, then the end
    starts = flower_timings(marks, launched=5.0, every_boundary=False)
    assert starts["round_s_all"] == [8.0, 1.0, 1.5, 0.5] and starts["first_round_s"] == 8.0
