"""curves.png (engine/report.py curves_figure): its left panel draws what the run measured, the own
models' held-out accuracy included, read back from the figure's lines (matplotlib artists)."""

from __future__ import annotations

import csv
import math

import pytest

from fedac.config import load_config
from fedac.engine import report
from fedac.engine.data import build_federated_data
from fedac.engine.simulator import Simulator
from helpers import tiny_run

pytestmark = pytest.mark.usefixtures("one_thread")
OWN = "own models: accuracy on their client's held-out clips (mean)"


@pytest.fixture(scope="module")
def settings(gsc_root, tmp_path_factory):
    # (sequential: FedRep's stacked path costs ~30 s more here, for the same curves)
    return {
        **tiny_run(gsc_root, tmp_path_factory.mktemp("curves_cache")),
        "train.rounds": 2,
        "runtime.execution": "sequential",
    }


def drawn_run(algorithm, settings, tmp_path, monkeypatch) -> tuple[dict, list[dict]]:
    """A 2-round run of `algorithm`: {label: (x, y)} of curves.png's left panel, and metrics.csv."""
    figures = []
    real = report.curves_figure

    def spy(history, title):
        figures.append(real(history, title))
        return figures[-1]

    monkeypatch.setattr(report, "curves_figure", spy)
    cfg = load_config(None, [f"{k}={v}" for k, v in {**settings, "algorithm": algorithm}.items()])
    Simulator(cfg, tmp_path, build_federated_data(cfg, progress=False), progress=False).run()
    assert (tmp_path / "curves.png").is_file()
    (fig,) = figures
    left = fig.axes[0]
    lines = {
        line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in left.lines
    }
    assert [text.get_text() for text in left.get_legend().get_texts()] == list(lines)
    with open(tmp_path / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    return lines, rows


def column(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    return [float(r["round"]) for r in rows], [float(r[key]) for r in rows]


def test_fedrep_without_a_shared_model_draws_its_own_models(settings, tmp_path, monkeypatch):
    lines, rows = drawn_run("fedrep", settings, tmp_path, monkeypatch)
    assert list(lines) == [OWN]  # no legend entry for a line that is not drawn
    assert lines[OWN] == column(rows, "local_accuracy") and len(rows) == 2
    assert not any(math.isnan(y) for y in lines[OWN][1])


def test_ditto_draws_its_shared_and_its_own_models(settings, tmp_path, monkeypatch):
    lines, rows = drawn_run("ditto", settings, tmp_path, monkeypatch)
    assert list(lines) == ["shared model: val accuracy", "shared model: val macro-F1", OWN]
    assert lines[OWN] == column(rows, "local_accuracy")
    assert lines["shared model: val accuracy"] == column(rows, "val_accuracy")


def test_a_run_that_scored_nothing_says_so_instead_of_empty_axes():
    fig = report.curves_figure([{"round": 1.0, "train_loss": 2.0}], "t")
    left = fig.axes[0]
    assert not left.lines and not left.axison
    assert [t.get_text() for t in left.texts] == ["no model was scored during the rounds"]
    report.pyplot().close(fig)
