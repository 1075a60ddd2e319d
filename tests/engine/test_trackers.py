"""Experiment trackers (fedac/engine/tracking.py, issue 57): a run written with TensorBoard and
MLflow themselves, read back with each library's own reader; a missing extra stops the run at its
start with the pip install."""

from __future__ import annotations

import importlib.util
import math

import pytest

from fedac.config import load_config
from fedac.engine import tracking
from fedac.engine.report import read_client_rows
from fedac.engine.simulator import Simulator
from fedac.errors import ConfigError
from helpers import tiny_run

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def cfg_for(gsc_root, tmp_path):
    def make(**settings):
        base = {
            **tiny_run(gsc_root, tmp_path / "cache"),
            "train.rounds": 2,
            "train.lr": 0.1,
            "train.batch_size": 16,
        }
        return load_config(None, [f"{k}={v}" for k, v in {**base, **settings}.items()])

    return make


@pytest.mark.parametrize(
    "setting, value, module",
    [("log.tensorboard", "true", "tensorboard"), ("log.mlflow", "runs/mlflow", "mlflow")],
)
def test_a_missing_extra_stops_the_run_at_its_start_naming_the_pip_install(
    cfg_for, tmp_path, monkeypatch, setting, value, module
):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a)
    )
    with pytest.raises(ConfigError) as caught:
        Simulator(cfg_for(**{setting: value}), tmp_path / "run", progress=False)
    message = str(caught.value)
    assert "\n" not in message and f"{setting} needs the {module} package" in message
    assert f"pip install 'fedac[{module}]'" in message
    assert not (tmp_path / "run" / "metrics.csv").exists()  # nothing trained
    tracking.check_trackers(cfg_for().log)  # trackers off: nothing is needed


def test_tensorboard_events_read_back_with_the_rounds_numbers(cfg_for, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    results = Simulator(cfg_for(**{"log.tensorboard": "true"}), tmp_path, progress=False).run()
    events = EventAccumulator(
        str(tmp_path / "tensorboard"), size_guidance={"images": 0, "histograms": 0}
    )
    events.Reload()
    scalars = {e.step: e.value for e in events.Scalars("val_accuracy")}
    assert scalars == pytest.approx(
        {int(r["round"]): r["val_accuracy"] for r in results["history"]}, rel=1e-6
    )
    uploads = {e.step: e.value for e in events.Scalars("upload_bytes_total")}
    assert uploads == {int(r["round"]): r["upload_bytes_total"] for r in results["history"]}
    assert events.Scalars("final/accuracy")[0].value == pytest.approx(
        results["final"]["accuracy"], rel=1e-6
    )
    rows = read_client_rows(tmp_path)
    histograms = events.Histograms("clients/accuracy")
    assert [h.step for h in histograms] == [1, 2]
    assert histograms[-1].histogram_value.num == len([r for r in rows if r["round"] == 2])
    assert histograms[-1].histogram_value.sum == pytest.approx(
        sum(r["accuracy"] for r in rows if r["round"] == 2)
    )
    assert {"confusion", "clients", "curves"} <= set(events.Tags()["images"])
    # a second write (a resumed run's end) replaces the events instead of adding a second copy
    tracking.write_tensorboard(tmp_path, results, rows)
    again = EventAccumulator(str(tmp_path / "tensorboard"))
    again.Reload()
    assert len(again.Scalars("val_accuracy")) == len(results["history"])


def test_mlflow_run_reads_back_with_params_metrics_and_artifacts(cfg_for, tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    # (the run sets it; restored after the test)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    from mlflow.tracking import MlflowClient

    store = tmp_path / "mlruns"
    results = Simulator(
        cfg_for(**{"log.mlflow": str(store)}), tmp_path / "run", progress=False
    ).run()
    client = MlflowClient(tracking_uri=store.as_uri())
    [run] = client.search_runs([client.get_experiment_by_name("fedac").experiment_id])
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    assert run.data.params["train.lr"] == "0.1" and run.data.params["log.mlflow"] == str(store)
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "val_accuracy")}
    assert history == pytest.approx(
        {int(r["round"]): r["val_accuracy"] for r in results["history"]}
    )
    assert run.data.metrics["final_accuracy"] == pytest.approx(results["final"]["accuracy"])
    assert not any(math.isnan(v) for v in run.data.metrics.values())
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {
        "config.yaml",
        "metrics.csv",
        "clients.csv",
        "results.json",
        "confusion.png",
        "clients.png",
    } <= artifacts
