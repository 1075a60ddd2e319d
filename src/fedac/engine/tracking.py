"""Experiment trackers: a finished run's numbers and pictures in TensorBoard (`log.tensorboard`) and
MLflow (`log.mlflow`), written with the libraries themselves, offline.

Both are optional extras (`pip install 'fedac[tensorboard]'`, `'fedac[mlflow]'`); a run that asks
for a missing one fails at its start with that command (`check_trackers`), not after training. The
trackers are written once, when the run ends (report.write_results), from what the run directory
holds: the history (every evaluated round), clients.csv and the pictures; a resumed run rewrites
them whole."""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import shutil
from pathlib import Path
from typing import Any

from fedac.config import Config, LogConfig
from fedac.errors import ConfigError

#: setting -> (the module it imports, the pip install that provides it)
EXTRAS = {
    "tensorboard": ("tensorboard", "pip install 'fedac[tensorboard]'"),
    "mlflow": ("mlflow", "pip install 'fedac[mlflow]'"),
}
#: The run directory's files logged as MLflow artifacts (those that exist).
ARTIFACTS = (
    "config.yaml",
    "metrics.csv",
    "clients.csv",
    "results.json",
    "curves.png",
    "clients.png",
    "confusion.png",
)
TENSORBOARD_DIR = "tensorboard"


def check_trackers(log: LogConfig) -> None:
    """A ConfigError of one line naming the pip install for each tracker asked for whose package is
    missing."""
    for setting, wanted in (("tensorboard", log.tensorboard), ("mlflow", bool(log.mlflow))):
        module, install = EXTRAS[setting]
        if wanted and importlib.util.find_spec(module) is None:
            raise ConfigError(
                f"log.{setting} needs the {module} package, which is not installed: {install}"
            )


def _numbers(row: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a row (a tracker has no place for NaN: results.json says why one is
    missing)."""
    return {
        k: float(v)
        for k, v in row.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


def track(
    run_dir: Path, cfg: Config, results: dict[str, Any], client_rows: list[dict[str, Any]]
) -> None:
    """Write the finished run to every tracker `cfg.log` asks for."""
    check_trackers(cfg.log)
    if cfg.log.tensorboard:
        write_tensorboard(Path(run_dir), results, client_rows)
    if cfg.log.mlflow:
        write_mlflow(cfg.log.mlflow, Path(run_dir), cfg, results)


def write_tensorboard(
    run_dir: Path, results: dict[str, Any], client_rows: list[dict[str, Any]]
) -> Path:
    """Event files in <run_dir>/tensorboard: each history column as a scalar at its round, final
    metrics as final/<key> at the last round, each evaluation's per-client scores as histograms
    clients/<metric>, and the run's pictures as images."""
    import matplotlib.image  # lazy: start-up time
    import numpy as np

    # lazy: optional extra (needs the tensorboard package)
    from torch.utils.tensorboard import SummaryWriter

    out = run_dir / TENSORBOARD_DIR
    # a resumed run's events are written again from the whole history
    shutil.rmtree(out, ignore_errors=True)
    writer = SummaryWriter(log_dir=str(out))
    try:
        for row in results["history"]:
            step = int(row["round"])
            for key, value in _numbers(row).items():
                if key != "round":
                    writer.add_scalar(key, value, step)
        for key, value in _numbers(results["final"]).items():
            writer.add_scalar(f"final/{key}", value, results["rounds"])
        metrics = [
            k
            for k in ("accuracy", "macro_f1", "uar", "own_accuracy", "own_macro_f1", "own_uar")
            if any(k in r for r in client_rows)
        ]
        for step in sorted({int(r["round"]) for r in client_rows}):
            for key in metrics:
                values = [r[key] for r in client_rows if int(r["round"]) == step and key in r]
                if values:
                    writer.add_histogram(f"clients/{key}", np.asarray(values), step)
        for picture in ("confusion.png", "clients.png", "curves.png"):
            if (run_dir / picture).is_file():
                # RGBA -> RGB, floats in [0, 1]
                image = matplotlib.image.imread(run_dir / picture)[..., :3]
                writer.add_image(
                    picture.removesuffix(".png"), image, results["rounds"], dataformats="HWC"
                )
    finally:
        writer.close()
    return out


#: The SQLite file and artifact folder of a `log.mlflow` directory.
MLFLOW_DB, MLFLOW_ARTIFACTS = "mlflow.db", "artifacts"


def is_directory(setting: str) -> bool:
    """Whether log.mlflow names a directory (not a tracking URI)."""
    return "://" not in setting and not setting.startswith("file:")


def store_uri(setting: str) -> str:
    """log.mlflow as MLflow's tracking URI: a URI as given; a directory as a SQLite store inside it
    (sqlite:///DIR/mlflow.db, MLflow's own recommendation for a local store: MLflow 3 reads it
    without opt-ins, where its file store is in maintenance mode behind MLFLOW_ALLOW_FILE_STORE)."""
    if not is_directory(setting):
        return setting
    return f"sqlite:///{Path(setting).expanduser().resolve() / MLFLOW_DB}"


def tracking_uri(setting: str) -> str:
    """`store_uri`, made ready to write: a directory created; a file: URI (the file store) with
    MLflow 3's opt-in for it, in this process only."""
    if setting.startswith("file:"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    elif is_directory(setting):
        Path(setting).expanduser().resolve().mkdir(parents=True, exist_ok=True)
    return store_uri(setting)


def artifact_location(setting: str) -> str | None:
    """Where a new 'fedac' experiment keeps its artifacts: DIR/artifacts for a directory (not the
    working folder's ./mlruns, MLflow's default for a database store); a URI's server decides."""
    if not is_directory(setting):
        return None
    return (Path(setting).expanduser().resolve() / MLFLOW_ARTIFACTS).as_uri()


def read_back(cfg: Config, run_dir: Path) -> dict[str, str]:
    """Where each tracker `cfg.log` asks for writes, as the command that reads it back (printed
    with the run's closing table, kept in results.json's `trackers`)."""
    out = {}
    if cfg.log.tensorboard:
        out["tensorboard"] = f"tensorboard --logdir {(Path(run_dir) / TENSORBOARD_DIR).resolve()}"
    if cfg.log.mlflow:
        out["mlflow"] = f"mlflow ui --backend-store-uri {store_uri(cfg.log.mlflow)}"
    return out


def _flat(settings: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(value)
    return out


def write_mlflow(setting: str, run_dir: Path, cfg: Config, results: dict[str, Any]) -> str:
    """One MLflow run in experiment 'fedac', named after the run directory: every setting as a
    param, each history column as a metric at its round, final metrics as final_<key>, the run
    directory's files as artifacts. Returns the MLflow run id. A directory's store reads back in
    any process: `MlflowClient("sqlite:///DIR/mlflow.db")`, or `mlflow ui --backend-store-uri
    sqlite:///DIR/mlflow.db` (`read_back`)."""
    import time

    from mlflow.entities import Metric, Param  # lazy: optional extra
    from mlflow.tracking import MlflowClient

    # (its INFO lines on creating a store would land between the rounds' bars and the table)
    logging.getLogger("mlflow").setLevel(logging.WARNING)

    client = MlflowClient(tracking_uri=tracking_uri(setting))
    experiment = client.get_experiment_by_name("fedac")
    experiment_id = (
        experiment.experiment_id
        if experiment
        else client.create_experiment("fedac", artifact_location=artifact_location(setting))
    )
    run = client.create_run(
        experiment_id, run_name=run_dir.name, tags={"fedac.run_dir": str(run_dir.resolve())}
    )
    run_id = run.info.run_id
    params = [Param(k, v[:6000]) for k, v in _flat(cfg.to_dict()).items()]
    now = int(time.time() * 1000)
    metrics = [
        Metric(key, value, now, int(row["round"]))
        for row in results["history"]
        for key, value in _numbers(row).items()
        if key != "round"
    ]
    metrics += [
        Metric(f"final_{key}", value, now, results["rounds"])
        for key, value in _numbers(results["final"]).items()
    ]
    # (MLflow's batch limits: 100 params, 1000 metrics a call)
    for start in range(0, len(params), 100):
        client.log_batch(run_id, params=params[start : start + 100])
    for start in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[start : start + 1000])
    for name in ARTIFACTS:
        if (run_dir / name).is_file():
            client.log_artifact(run_id, str(run_dir / name))
    client.set_terminated(run_id)
    return run_id
