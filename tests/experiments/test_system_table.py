"""`fedac reproduce system` (experiments/system.py): the spec's rows resolve to the configurations
they name and cover the same virtual time; the writer's table, summary and deadline note against
values worked out by hand; and the command end to end on the small test dataset."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from fedac.cli import main
from fedac.config import load_config
from fedac.experiments import system
from fedac.experiments.catalog import experiment_named
from fedac.experiments.compare import method_config, parse_method
from fedac.experiments.spec import Cell, Request


def resolved(tmp_path):
    spec = experiment_named("system")
    base = load_config(None, spec.protocol)
    return {
        m.label: method_config(base, m, 0, tmp_path / m.label, None, spec.protocol, [])
        for m in map(parse_method, spec.methods)
    }


def test_the_rows_are_the_five_modes_on_the_synthetic_traces(tmp_path):
    cfgs = resolved(tmp_path)
    assert list(cfgs) == [
        "Sync",
        "Sync + deadline",
        "Sync + deadline + over-commit 1.3",
        "FedBuff",
        "FedAsync",
    ]
    for cfg in cfgs.values():
        assert cfg.algorithm == "fedavg" and cfg.dataset == "speech_commands"
        assert (cfg.system.devices, cfg.system.availability) == ("synthetic", "synthetic")
        assert cfg.system.target_accuracy == system.TARGET
    sync, deadline, overcommit, fedbuff, fedasync = cfgs.values()
    assert (sync.system.mode, sync.system.deadline, sync.system.overcommit) == ("sync", 0.0, 1.0)
    assert (deadline.system.deadline, deadline.system.overcommit) == (system.DEADLINE_S, 1.0)
    assert (overcommit.system.deadline, overcommit.system.overcommit) == (system.DEADLINE_S, 1.3)
    cohort = round(sync.train.fraction * 240)  # the stand-in's 240 speakers
    assert (fedbuff.system.mode, fedbuff.system.concurrency) == ("fedbuff", cohort)
    assert fedbuff.system.buffer == cohort // 2
    # FedAsync at its defaults
    defaults = load_config().system
    assert fedasync.system.mode == "fedasync"
    for key in ("alpha", "staleness_exponent", "max_staleness", "concurrency"):
        assert getattr(fedasync.system, key) == getattr(defaults, key)


def test_every_mode_covers_the_horizon_in_virtual_time(tmp_path):
    cfgs = resolved(tmp_path)
    for mode, cfg in zip(system.STEP_S, cfgs.values()):
        covered = cfg.train.rounds * system.STEP_S[mode]
        assert system.HORIZON_S <= covered < system.HORIZON_S + system.STEP_S[mode]
        spacing = cfg.train.eval_every * system.STEP_S[mode]
        # the time to target to within one evaluation: every round, or about EVAL_EVERY_S
        assert cfg.train.eval_every == 1 or spacing <= 1.5 * system.EVAL_EVERY_S


#: When each fake client is online (seconds): c2 comes online at 121.5 s, c3 at 300 s.
AVAILABILITY = """client,start_s,end_s
c0,0,50
c1,100,200
c2,121.5,140
c3,300,400
late,10,20
"""


def fake_run(run_dir, seed, reached, accuracy, silent, times):
    """A finished run's results.json `system` block, config.yaml, metrics.csv and clients.csv;
    it lasted 120 + seed virtual seconds."""
    run_dir.mkdir(parents=True)
    block = {
        "virtual_time_s": 120.0 + seed,
        "time_to_target_s": reached,
        "clients_never_contributed": silent,
        "never_contributed_fraction": silent / 240,
    }
    (run_dir / "results.json").write_text(json.dumps({"rounds": 17, "system": block}))
    trace = run_dir.parent / "availability.csv"
    trace.write_text(AVAILABILITY)
    config = {"seed": seed, "system": {"availability": str(trace)}}
    (run_dir / "config.yaml").write_text(json.dumps(config))
    (run_dir / "metrics.csv").write_text(
        "round,val_accuracy,virtual_time_s\n1,0.1,7.0\n2,0.25,15.0\n"
    )
    # clients.csv's clock columns are totals so far: round 1, each c_k's update takes times[k];
    # round 2, c0's second takes 5 s, and "late" (late in round 1) is dropped after 3 s
    rows = ["round,client,compute_s,comm_s,arrived,late,dropped"]
    rows += [f"1,c{k},{t - 0.5},0.5,1,0,0" for k, t in enumerate(times)]
    rows.append("1,late,9.0,1.0,0,1,0")
    rows.append(f"2,c0,{times[0] - 0.5 + 4.5},1.0,2,0,0")
    rows += [f"2,c{k},{t - 0.5},0.5,1,0,0" for k, t in enumerate(times) if k > 0]
    rows.append("2,late,11.0,2.0,0,1,1")
    (run_dir / "clients.csv").write_text("\n".join(rows) + "\n")
    return {"seed": seed, "run_dir": str(run_dir), "accuracy": accuracy, "wall_seconds": 10.0}


def test_the_writer_reports_each_figure_over_seeds(tmp_path):
    spec = experiment_named("system")
    times = [1.0, 2.0, 3.0, 4.0]
    sync = [
        fake_run(tmp_path / "Sync-s0", 0, 10.0, 0.3, 60, times),
        fake_run(tmp_path / "Sync-s1", 1, None, 0.2, 72, times),
        fake_run(tmp_path / "Sync-s2", 2, 14.0, 0.4, 84, times),
    ]
    methods = [parse_method(m) for m in spec.methods[:1]]
    cell = Cell("speech_commands", "speech_commands", tmp_path, load_config(), [], methods)
    request = Request(out=tmp_path, seeds=[0, 1, 2], command="fedac reproduce system")
    system.write_system(spec, request, [cell], {"speech_commands": {"Sync": sync}})

    summary = json.loads((tmp_path / "summary.json").read_text())["speech_commands"]["Sync"]
    assert summary["time_to_target_s"] == {"mean": 12.0, "std": 2.0, "runs": 2}
    assert summary["never_contributed_fraction"]["mean"] == pytest.approx(72 / 240)
    # offline until the run's end (120, 121, 122 s): c2 and c3, then c3 alone, of 5 clients
    assert summary["offline_fraction"]["mean"] == pytest.approx(np.mean([0.4, 0.4, 0.2]))
    table = (tmp_path / "table.md").read_text()
    accuracy, silent = 100 * np.std([0.3, 0.2, 0.4]), 100 * np.std([0.25, 0.3, 0.35])
    offline = 100 * np.std([0.4, 0.4, 0.2])
    # time to target over the two seeds that reached it; shares and accuracies in %
    assert (
        f"| Sync | 12.0 ± 2.0 (2 of 3) | 30.00 ± {accuracy:.2f} | 30.00 ± {silent:.2f} | "
        f"33.33 ± {offline:.2f} | 121.0 ± 0.8 | 17 ± 0 | 10.0 ± 0.0 |"
    ) in table
    # the deadline against the no-deadline runs' update times: 1, 2, 3, 4 and 5 s in each run
    quantile = np.quantile([1.0, 2.0, 3.0, 4.0, 5.0] * 3, system.DEADLINE_QUANTILE)
    assert f"percentile of a client's time is {quantile:.2f} s" in table
    assert "(15 client updates)" in table and "40.0 % of the updates" in table  # 1 s and 2 s
    assert (tmp_path / "figure.png").is_file()
    csv_header = (tmp_path / "results.csv").read_text().splitlines()[0]
    assert csv_header.startswith("cell,method,seed,time_to_target_s,accuracy")


def test_a_mode_that_never_reaches_the_target_says_so():
    assert system.cell_text([None, None], "s", 2) == "not reached"
    assert system.cell_text([], "s", 3) == "pending"
    assert system.cell_text([0.5], "%", 3) == "50.00 (1 of 3)"


def test_the_command_runs_on_the_small_dataset(gsc_root, tmp_path):
    """Two modes, one round each, on the 8 speakers of the test dataset (FedBuff's buffer cut to
    what they can deliver): the table's figures are the runs' own."""
    out = tmp_path / "system"
    argv = ["reproduce", "system", "--quiet", "--seeds", "0", "--rounds", "1", "--out", str(out)]
    argv += ["--methods", "Sync", "FedBuff"]
    settings = [f"data.root={gsc_root}", "model.name=crnn_tiny", "train.local_epochs=1"]
    settings += ["system.buffer=2", "system.concurrency=4"]
    assert main([*argv, *[f"--set={s}" for s in settings]]) == 0
    with open(out / "results.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["method"] for r in rows] == ["Sync", "FedBuff"]
    for row in rows:
        block = json.loads(open(f"{row['run_dir']}/results.json").read())["system"]
        assert block["virtual_time_s"] > 0
        assert float(row["virtual_time_s"]) == pytest.approx(block["virtual_time_s"])
        assert float(row["never_contributed_fraction"]) == block["never_contributed_fraction"]
    table = (out / "table.md").read_text()
    assert "| FedBuff |" in table and "percentile of a client's time" in table
    assert (out / "figure.png").is_file()
