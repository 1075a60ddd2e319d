"""Experiment trackers (fedac/engine/tracking.py, issue 57): a run written with TensorBoard and
MLflow themselves, read back with each library's own reader; a missing extra stops the run at its
start with the pip install."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

from fedac.config import load_config
from fedac.engine import tracking
from fedac.engine.report import final_table, read_client_rows
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
    # where it wrote: printed with the closing table, kept in results.json
    line = f"tensorboard --logdir {tmp_path.resolve() / 'tensorboard'}"
    assert results["trackers"] == {"tensorboard": line} and line in final_table(results)
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


#: Read back in a fresh process with nothing from fedac's: the store named by the printed line.
READ_BACK = """
import json, sys
from mlflow.tracking import MlflowClient
client = MlflowClient(sys.argv[1])
[run] = client.search_runs([client.get_experiment_by_name("fedac").experiment_id])
history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "val_accuracy")}
print(json.dumps({
    "name": run.info.run_name, "status": run.info.status, "params": run.data.params,
    "metrics": run.data.metrics, "history": history,
    "artifacts": [a.path for a in client.list_artifacts(run.info.run_id)],
    "results": json.load(
        open(client.download_artifacts(run.info.run_id, "results.json", sys.argv[2]))
    ),
}))
"""


def test_mlflow_run_reads_back_in_a_fresh_process_from_the_printed_line(
    cfg_for, tmp_path, monkeypatch
):
    """log.mlflow=DIR writes a SQLite store that MLflow 3 reads without MLFLOW_ALLOW_FILE_STORE:
    a subprocess with a clean environment (no fedac variable, another working folder) reads the
    params, the metrics per round and the artifacts back from the URI of the line the run
    prints."""
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    store = tmp_path / "mlflow"
    results = Simulator(
        cfg_for(**{"log.mlflow": str(store)}), tmp_path / "run", progress=False
    ).run()
    line = results["trackers"]["mlflow"]
    assert line == f"mlflow ui --backend-store-uri sqlite:///{store / 'mlflow.db'}"
    [printed] = [row for row in final_table(results).splitlines() if row.startswith("MLflow")]
    assert printed.split() == ["MLflow", "(read", "back)", *line.split()]
    assert "MLFLOW_ALLOW_FILE_STORE" not in os.environ
    uri = line.split("--backend-store-uri ")[1]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    clean = {"PATH": os.environ["PATH"], "HOME": str(elsewhere)}
    done = subprocess.run(
        [sys.executable, "-c", READ_BACK, uri, str(elsewhere)],
        capture_output=True,
        text=True,
        env=clean,
        cwd=elsewhere,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout.splitlines()[-1])
    assert run["name"] == "run" and run["status"] == "FINISHED"
    assert run["params"]["train.lr"] == "0.1" and run["params"]["log.mlflow"] == str(store)
    assert {int(k): v for k, v in run["history"].items()} == pytest.approx(
        {int(r["round"]): r["val_accuracy"] for r in results["history"]}
    )
    assert run["metrics"]["final_accuracy"] == pytest.approx(results["final"]["accuracy"])
    assert not any(math.isnan(v) for v in run["metrics"].values())
    assert {
        "config.yaml",
        "metrics.csv",
        "clients.csv",
        "results.json",
        "confusion.png",
        "clients.png",
    } <= set(run["artifacts"])
    assert run["results"]["final"]["accuracy"] == results["final"]["accuracy"]
    assert (store / "artifacts").is_dir() and not (elsewhere / "mlruns").exists()
