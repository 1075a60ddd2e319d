"""`fedac reproduce communication` (experiments/communication.py): every row of both panels resolves
to the config it names, and the writer's figures (accuracy over seeds, uploaded bytes from
metrics.csv, the ratio to the first row, the parameters a client trains) against hand counts."""

from __future__ import annotations

import json

import pytest

from fedac.errors import ConfigError
from fedac.experiments import communication
from fedac.experiments.catalog import experiment_named
from fedac.experiments.compare import method_config
from fedac.experiments.spec import Request
from fedac.settings.codecs import error_feedback


def _configs(tmp_path) -> dict[str, dict]:
    spec = experiment_named("communication")
    cells = spec.layout.cells(spec, Request(out=tmp_path))
    return {
        cell.label: {
            m.label: method_config(cell.base, m, 0, tmp_path / "r", None, cell.settings, cell.last)
            for m in cell.methods
        }
        for cell in cells
    }


def test_every_row_resolves_to_the_setting_it_names(tmp_path):
    configs = _configs(tmp_path)
    fedavg, early = configs["fedavg"], configs["earlyexit"]
    assert len(fedavg) == 9 and len(early) == 10
    compression = {
        label: (
            c.compression.method,
            c.compression.ratio,
            error_feedback(c.compression.method, c.compression.error_feedback),  # in effect
        )
        for label, c in fedavg.items()
    }
    assert compression["none"][0] == "none"
    assert compression["topk 1% EF"] == ("topk", 0.01, True)
    assert compression["topk 1% no EF"] == ("topk", 0.01, False)
    assert compression["topk 10% no EF"] == ("topk", 0.1, False)
    assert fedavg["qsgd 4 levels"].compression.levels == 4
    assert compression["qsgd 16 levels"][2] is False  # QSGD refuses it
    assert {c.compression.method for c in fedavg.values()} == {
        "none",
        "topk",
        "qsgd",
        "int8",
        "bf16",
    }
    for cfg in fedavg.values():  # the default run's task and model, at the reduced rounds
        assert (cfg.algorithm, cfg.dataset, cfg.model.name) == (
            "fedavg",
            "speech_commands",
            "crnn_lite",
        )
        assert cfg.train.rounds == 20
    assert early["head only (hetero)"].model.peft == "head"
    assert early["LoRA r16 (homo)"].model.peft_rank == 16
    assert early["LoRA r4 (homo)"].model.peft_alpha == 8
    assert early["IA3 (hetero)"].earlyexit.aggregation == "depth_weighted"
    for label, cfg in early.items():
        assert (cfg.algorithm, cfg.model.name, cfg.data.task) == ("earlyexit", "w2v2_s", "12")
        assert cfg.earlyexit.mode == ("hetero" if "hetero" in label else "homo")
        assert cfg.earlyexit.depth == cfg.earlyexit.high_depth == 6
        assert (cfg.train.rounds, cfg.data.max_clients, cfg.train.fraction) == (4, 8, 1.0)


def test_methods_pick_rows_of_either_panel_and_unknown_ones_are_refused(tmp_path):
    spec = experiment_named("communication")
    cells = spec.layout.cells(spec, Request(out=tmp_path, methods=["int8", "IA3 (homo)"]))
    assert [(c.label, [m.label for m in c.methods]) for c in cells] == [
        ("fedavg", ["int8"]),
        ("earlyexit", ["IA3 (homo)"]),
    ]
    with pytest.raises(ConfigError, match="no method"):
        spec.layout.cells(spec, Request(out=tmp_path, methods=["topk 50%"]))
    with pytest.raises(ConfigError, match="runs on speech_commands"):
        spec.layout.cells(spec, Request(out=tmp_path, datasets=["cremad"]))


def test_the_parameters_a_client_at_exit_6_trains():
    """w2v2_s: width 128, 12 classes; a head is Linear(256, 12) and the pooled norm's 2 x 256."""
    methods = {m.label: m for m in communication.FINE_TUNINGS}
    head = 256 * 12 + 12 + 2 * 256
    count = communication.trained_by_deep_client
    assert count(methods["head only (homo)"], 12) == head
    # q_proj and v_proj of layers 0-5: A (r x 128) and B (128 x r)
    assert count(methods["LoRA r4 (homo)"], 12) == head + 6 * 2 * (2 * 4 * 128)
    assert count(methods["LoRA r16 (hetero)"], 12) == head + 6 * 2 * (2 * 16 * 128)
    # k_proj, v_proj (128 each) and output_dense's input (512) per layer
    assert count(methods["IA3 (homo)"], 12) == head + 6 * (128 + 128 + 512)
    assert count(methods["full (homo)"], 12) > 1_000_000


def _run(tmp_path, name: str, seed: int, accuracy: float, sent: list[int], **scores) -> dict:
    run_dir = tmp_path / f"{name}-s{seed}"
    run_dir.mkdir()
    rows = ["round,upload_bytes,upload_bytes_total"]
    total = 0
    for r, b in enumerate(sent, 1):
        total += b
        rows.append(f"{r},{b},{total}")
    (run_dir / "metrics.csv").write_text("\n".join(rows) + "\n")
    confusion = {"counts": [[3, 1], [0, 0], [1, 0]]}  # rows: true classes; the first is 4 of 5
    (run_dir / "results.json").write_text(json.dumps({"num_classes": 12, "confusion": confusion}))
    run = {"seed": seed, "run_dir": str(run_dir), "accuracy": accuracy, "wall_seconds": 1.0}
    return {**run, **scores}


def test_the_writer_reports_accuracy_bytes_and_their_ratio(tmp_path):
    spec = experiment_named("communication")
    runs = {
        "fedavg": {
            "none": [
                _run(tmp_path, "none", 0, 0.4, [100, 100], uar=0.3),
                _run(tmp_path, "none", 1, 0.6, [100, 100], uar=0.3),
            ],
            "int8": [
                _run(tmp_path, "int8", 0, 0.5, [30, 20], uar=0.1),
                _run(tmp_path, "int8", 1, 0.3, [30, 20], uar=0.3),
            ],
        },
        "earlyexit": {"head only (homo)": [_run(tmp_path, "head", 0, 0.25, [7, 7, 7])]},
    }
    request = Request(out=tmp_path, seeds=[0, 1], command="fedac reproduce communication")
    spec.layout.write(spec, request, [], runs)
    summary = json.loads((tmp_path / "summary.json").read_text())
    none, int8 = summary["fedavg"]["none"], summary["fedavg"]["int8"]
    assert none["accuracy"]["mean"] == pytest.approx(0.5)
    assert none["accuracy"]["std"] == pytest.approx(0.1)  # population std of 0.4 and 0.6
    assert none["upload_bytes"] == 200 and none["bytes_ratio"] == 1
    assert int8["upload_bytes"] == 50 and int8["bytes_ratio"] == pytest.approx(0.25)
    head = summary["earlyexit"]["head only (homo)"]
    assert head["upload_bytes"] == 21 and head["trainable_parameters"] == 3596
    table = (tmp_path / "table.md").read_text()
    assert "| int8 | 40.00 ± 10.00 | 20.00 ± 10.00 | 50 | 0.2500 |" in table
    assert "| head only (homo) | 25.00 ± 0.00 (n=1) | pending | 21 | 1.0000 | 3,596 |" in table
    assert "most frequent class is 80.00 % of it" in table
    assert (tmp_path / "figure.png").stat().st_size > 0
    lines = (tmp_path / "results.csv").read_text().splitlines()
    assert lines[0] == "cell,method,seed,accuracy,uar,upload_bytes_total,wall_seconds,run_dir"
    assert lines[1].startswith("fedavg,none,0,0.4,0.3,200.0,1.0,")
