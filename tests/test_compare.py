"""`fedac compare`: methods x seeds -> per-run directories, summary.json and table.md (mean ± std over seeds)."""

import json

import numpy as np
import pytest

from fedac.cli import main
from fedac.compare import parse_method
from fedac.errors import ConfigError


def test_parse_method():
    m = parse_method("FedAvg+LPA=fedavg:aggregation.method=lpa, aggregation.v_h=0.3")
    assert (m.label, m.algorithm, m.overrides) == ("FedAvg+LPA", "fedavg", ["aggregation.method=lpa", "aggregation.v_h=0.3"])
    with pytest.raises(ConfigError, match="LABEL=ALGORITHM"):
        parse_method("fedavg")


def test_compare_runs_every_method_and_seed_and_summarises(gsc_root, tmp_path, capsys):
    out = tmp_path / "cmp"
    code = main(["compare", "--quiet", "--seeds", "0", "1", "--rounds", "1", "--out", str(out),
                 "--method", "A=fedavg", "--method", "B=fedmlac:fedmlac.plugin_model=crnn_tiny,model.client_model=crnn_tiny",
                 "--set", f"data.root={gsc_root}", "--set", "model.name=crnn_tiny", "--set", "train.local_epochs=1"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["runs"]) == {"A", "B"}
    for label, runs in summary["runs"].items():
        assert [r["seed"] for r in runs] == [0, 1]
        for r in runs:
            results = json.loads((tmp_path / "cmp" / f"{label}-s{r['seed']}" / "results.json").read_text())
            assert results["algorithm"] == ("fedavg" if label == "A" else "fedmlac")
            assert r["accuracy"] == pytest.approx(results["final"]["accuracy"])
        accs = [r["accuracy"] for r in runs]
        assert summary["mean_std"][label]["accuracy"] == pytest.approx([np.mean(accs), np.std(accs)])
    table = (out / "table.md").read_text()
    assert "| A |" in table and "| B |" in table
    assert "n/a" in table.splitlines()[2]  # FedAvg has no personalized models
    assert "| B |" in capsys.readouterr().out


def test_compare_rejects_unknown_preset(capsys):
    assert main(["compare", "--preset", "nope"]) == 2
    assert "unknown preset 'nope'" in capsys.readouterr().err
