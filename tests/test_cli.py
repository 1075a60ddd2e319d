"""The `fedac` command line, called in-process through fedac.cli.main (plus one console-script
check)."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedac.cli import main
from fedac.config import load_config
from helpers import tiny_run

RUN_FLAGS = ["--rounds", "2", "--seed", "1", "--quiet"]
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def settings(gsc_root, tmp_path_factory):
    cache = tmp_path_factory.mktemp("cli_cache")
    return [f"--set={key}={value}" for key, value in tiny_run(gsc_root, cache).items()]


@pytest.fixture(scope="module")
def first_run(settings, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli_runs") / "run1"
    assert (
        main(
            [
                "run",
                "--algorithm",
                "fedavg",
                "--dataset",
                "speech_commands",
                *RUN_FLAGS,
                *settings,
                "--out",
                str(out),
            ]
        )
        == 0
    )
    return out


def error_of(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("fedac: error: ") or "\nfedac: error: " in err, err
    return err


@pytest.mark.slow
def test_run_writes_the_run_directory(first_run):
    for name in ("config.yaml", "metrics.csv", "results.json", "curves.png", "checkpoint.pt"):
        assert (first_run / name).is_file(), name
    results = json.loads((first_run / "results.json").read_text())
    assert {"final", "history", "wall_seconds", "rounds"} <= set(results)
    assert {
        "accuracy",
        "macro_f1",
        "uar",
        "selected_round",
        "client_accuracy_mean",
        "client_accuracy_std",
    } <= set(results["final"])
    assert results["rounds"] == 2
    assert results["algorithm"] == "fedavg" and results["seed"] == 1
    assert results["wall_seconds"] > 0
    rows = list(csv.DictReader(open(first_run / "metrics.csv")))
    assert (
        [int(r["round"]) for r in rows] == [1, 2] == [int(h["round"]) for h in results["history"]]
    )
    assert [float(r["val_accuracy"]) for r in rows] == pytest.approx(
        [h["val_accuracy"] for h in results["history"]]
    )
    assert (first_run / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_saved_config_is_resolved_and_reloadable(first_run, gsc_root):
    cfg = load_config(first_run / "config.yaml")
    assert cfg.algorithm == "fedavg" and cfg.seed == 1 and cfg.train.rounds == 2
    assert (
        cfg.data.root == str(gsc_root)
        and cfg.model.name == "crnn_tiny"
        and cfg.train.fraction == 0.5
    )
    assert cfg.out == str(first_run)
    raw = yaml.safe_load((first_run / "config.yaml").read_text())
    # every setting is written
    assert raw["train"]["rounds"] == 2 and raw["fedprox"]["mu"] == cfg.fedprox.mu


def test_rerun_from_saved_config_repeats_the_run(first_run, tmp_path, capsys):
    out = tmp_path / "again"
    assert (
        main(["run", "--config", str(first_run / "config.yaml"), "--out", str(out), "--quiet"]) == 0
    )
    assert "test accuracy" in capsys.readouterr().out
    original, again = load_config(first_run / "config.yaml"), load_config(out / "config.yaml")
    original.out = again.out = None
    assert again == original
    a = json.loads((first_run / "results.json").read_text())
    b = json.loads((out / "results.json").read_text())
    assert a["final"] == b["final"]
    assert [h["val_accuracy"] for h in a["history"]] == [h["val_accuracy"] for h in b["history"]]


def test_resume_a_stopped_run(first_run, settings, tmp_path, capsys):
    out = tmp_path / "stopped"
    argv = ["run", "--algorithm", "fedavg", *RUN_FLAGS, *settings, "--out", str(out)]
    assert main([*argv, "--stop-after", "1"]) == 0
    assert f"fedac run --resume {out}" in capsys.readouterr().out
    assert not (out / "results.json").exists()
    assert main(["run", "--resume", str(out)]) == 0
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith(f"fedac: resumed from round 1 of 2 ({out}); fedavg on ")
    a = json.loads((first_run / "results.json").read_text())
    b = json.loads((out / "results.json").read_text())
    # not a restart from round 0
    assert (b["rounds"], b["resumed_from"], b["rounds_trained"]) == (2, 1, 1)
    assert a["final"] == b["final"]
    strip = lambda h: [{k: v for k, v in row.items() if k != "wall_seconds"} for row in h]  # noqa: E731
    assert strip(a["history"]) == strip(b["history"])


def test_a_finished_run_goes_on_to_more_rounds_in_a_copy(first_run, settings, tmp_path, capsys):
    """`--resume DIR --rounds N --out NEW`: a finished 1-round run, continued in a copy to 2 rounds,
    trains round 2 alone and ends where a straight 2-round run ends; DIR stays as it was. Settings
    that would make it another run, fewer rounds, and a copy onto an existing folder are refused."""
    short = tmp_path / "short"
    argv = ["run", "--algorithm", "fedavg", *RUN_FLAGS, *settings, "--out", str(short)]
    argv[argv.index("--rounds") + 1] = "1"
    assert main(argv) == 0
    before = {p.name: p.read_bytes() for p in short.iterdir() if p.is_file()}
    longer = tmp_path / "longer"
    assert main(["run", "--resume", str(short), "--rounds", "2", "--out", str(longer)]) == 0
    assert (
        capsys.readouterr()
        .err.splitlines()[0]
        .startswith(f"fedac: resumed from round 1 of 2 ({longer}); ")
    )
    assert {p.name: p.read_bytes() for p in short.iterdir() if p.is_file()} == before
    straight = json.loads((first_run / "results.json").read_text())
    went_on = json.loads((longer / "results.json").read_text())
    assert (went_on["rounds"], went_on["resumed_from"], went_on["rounds_trained"]) == (2, 1, 1)
    assert went_on["final"] == straight["final"]
    saved = load_config(longer / "config.yaml")
    assert (saved.train.rounds, saved.out) == (2, str(longer))
    for run, extra, words in (
        (short, ["--set", "train.lr=0.5"], "--set would make it another run"),
        (longer, ["--rounds", "1"], "--rounds 1: the run in"),
        (short, ["--rounds", "3", "--out", str(longer)], f"--out {longer} exists"),
    ):
        assert main(["run", "--resume", str(run), *extra]) == 2
        assert words in error_of(capsys)
    assert {p.name: p.read_bytes() for p in short.iterdir() if p.is_file()} == before


def test_resume_of_a_non_run_directory(tmp_path, capsys):
    assert main(["run", "--resume", str(tmp_path)]) == 2
    err = error_of(capsys)
    assert str(tmp_path) in err and "config.yaml" in err


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--algorithm", "fedmagic"], ["unknown algorithm 'fedmagic'", "fedavg"]),
        (["--dataset", "timit"], ["unknown dataset 'timit'", "speech_commands"]),
        (["--set", "train.nope=1"], ["unknown setting 'train.nope'"]),
        (["--set", "train.rounds=many"], ["train.rounds", "int", "many"]),
        (["--set", "train.fraction"], ["key=value"]),
        (["--set", "data.partition=by_age"], ["data.partition", "by_age"]),
    ],
)
def test_bad_settings_exit_2_naming_them(argv, words, settings, tmp_path, capsys):
    code = main(["run", *RUN_FLAGS, *settings, *argv, "--out", str(tmp_path / "bad")])
    assert code == 2
    err = error_of(capsys)
    for word in words:
        assert word in err


def test_bad_config_file(tmp_path, capsys):
    assert main(["run", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml" in error_of(capsys)


def test_missing_dataset_root(tmp_path, capsys):
    assert main(["run", "--set", f"data.root={tmp_path / 'gone'}", "--quiet"]) == 2
    assert str(tmp_path / "gone") in error_of(capsys)


def test_data_stats(gsc_root, capsys):
    assert main(["data", "stats", "speech_commands", "--root", str(gsc_root), "--quiet"]) == 0
    out = capsys.readouterr().out
    # 8 speakers: 6 train clients, 35 words x 2 clips each
    assert "classes: 35; clips: train 420, val 70, test 70" in out
    assert "clients (natural): 6" in out
    assert "samples per client: min 70, q1 70, median 70, q3 70, max 70, mean 70.0" in out
    assert "class entropy" in out and "label distribution" in out


def test_data_stats_iid_partition(gsc_root, capsys):
    argv = [
        "data",
        "stats",
        "speech_commands",
        "--root",
        str(gsc_root),
        "--quiet",
        "--set",
        "data.partition=iid",
        "--set",
        "data.num_clients=4",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    # 420 training clips over 4 clients: 105 each
    assert "clients (iid): 4" in out
    assert "min 105" in out and "max 105" in out


def test_data_stats_errors(tmp_path, capsys):
    assert (
        main(["data", "stats", "speech_commands", "--root", str(tmp_path / "none"), "--quiet"]) == 2
    )
    assert str(tmp_path / "none") in error_of(capsys)
    assert main(["data", "stats", "nosuchset", "--root", str(tmp_path), "--quiet"]) == 2
    assert "unknown dataset 'nosuchset'" in error_of(capsys)


HAND_COUNTS = {  # 40 features, 35 classes; see test_models.expected_count
    "crnn_tiny": 9_171,
    "crnn_lite": (40 * 32 * 5 + 32)
    + (32 * 32 * 5 + 32)
    + 3 * (32 * 64 + 64 * 64 + 128)
    + 64 * 35
    + 35,
    "crnn_mid": (40 * 32 * 5 + 32)
    + 2 * (32 * 32 * 5 + 32)
    + 3 * (32 * 64 + 64 * 64 + 128)
    + 64 * 35
    + 35,
    "crnn_base": (40 * 64 * 5 + 64)
    + (64 * 64 * 5 + 64)
    + 6 * (64 * 128 + 128 * 128 + 256)
    + 256 * 35
    + 35,
    "crnn_deep": (40 * 64 * 5 + 64)
    + (64 * 128 * 5 + 128)
    + (128 * 128 * 5 + 128)
    + 6 * (128 * 128 + 128 * 128 + 256)
    + 256 * 35
    + 35,
}


@pytest.mark.slow
def test_models_lists_the_zoo(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for name, count in HAND_COUNTS.items():
        line = next(line for line in out.splitlines() if line.startswith(name))
        assert line.split()[1] == f"{count:,}"


@pytest.mark.slow
def test_console_script_models():
    script = Path(sys.executable).with_name("fedac")
    assert script.is_file(), "the fedac console script is not installed in this environment"
    done = subprocess.run(
        [str(script), "models", "--num-classes", "12"], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    assert all(name in done.stdout for name in HAND_COUNTS)
    assert "12 classes" in done.stdout


def test_reproduce_without_a_name_lists_every_experiment_with_its_paper_and_cost(capsys):
    """Issue 44: `fedac reproduce` alone lists each spec (name, paper, table, estimated cost, the
    cost's source), and every listed name resolves to its own spec (aliases to the same one)."""
    from fedac.experiments.catalog import EXPERIMENTS, SPECS, experiment_named

    assert main(["reproduce"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines()[1 : len(SPECS) + 1]}
    assert list(rows) == [spec.name for spec in SPECS]
    for spec in SPECS:
        assert spec.paper in rows[spec.name] and spec.table in rows[spec.name]
        assert f"{spec.cost.cpu_minutes / 60:,.1f}" in rows[spec.name] and spec.cost.cpu_minutes > 0
        assert f"  {spec.name}: {spec.cost.source}" in out
        for name in (spec.name, *spec.aliases):
            assert experiment_named(name) is spec
    assert {
        "table4",
        "hetero",
        "fedkws12-scaled",
        "robustness",
        "earlyexit-table1",
        "zeroshot-table4",
    } <= set(EXPERIMENTS)
    # a cost's source names a committed file that exists
    for source in (spec.cost.source for spec in SPECS):
        for path in re.findall(r"docs/[\w./-]+\.(?:csv|json|md)", source):
            assert Path(path).is_file() or (Path(__file__).parents[1] / path).is_file(), path
    assert main(["reproduce", "nosuch"]) == 2
    assert "unknown experiment 'nosuch'" in capsys.readouterr().err


def test_reproduce_options_are_read_from_the_spec(tmp_path, capsys, monkeypatch):
    """Which options an experiment reads is its spec's `options`, and what runs is its spec's
    layout: flipping either changes the answer (no experiment is known to the command by name)."""
    import dataclasses

    from fedac.experiments import catalog
    from fedac.experiments.spec import Layout

    assert main(["reproduce", "table4", "--central-epochs", "2", "--out", str(tmp_path / "x")]) == 2
    assert "table4 does not use --central-epochs" in capsys.readouterr().err
    seen = []
    layout = Layout(
        cells=lambda spec, request: [],
        write=lambda spec, request, cells, runs: (
            seen.append(request.central_epochs)
            or (request.out / "table.md").write_text("# written by the spec's layout\n")
        ),
    )
    spec = catalog.EXPERIMENTS["table4"]
    monkeypatch.setitem(
        catalog.EXPERIMENTS,
        "table4",
        dataclasses.replace(spec, options=(*spec.options, "--central-epochs"), layout=layout),
    )
    assert (
        main(
            [
                "reproduce",
                "table4",
                "--central-epochs",
                "2",
                "--quiet",
                "--out",
                str(tmp_path / "x"),
            ]
        )
        == 0
    )
    assert seen == [2] and "written by the spec's layout" in capsys.readouterr().out


def test_the_reproduce_command_and_runner_never_name_an_experiment():
    """Issue 44: dispatch is by the spec (its layout and options), never by an experiment's name
    string."""
    import ast

    from fedac.experiments import catalog, reproduce, runner, spec

    for module in (reproduce, runner, catalog, spec):
        tree = ast.parse(Path(module.__file__).read_text())
        named = [
            node.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value in catalog.EXPERIMENTS
        ]
        assert named == [], f"{module.__name__} names {named}"


def test_eval_schedule_of_a_short_run_unless_set():
    from fedac.config import fit_eval_schedule

    def every(*overrides: str) -> tuple[int, str | None]:
        cfg = load_config(overrides=list(overrides))
        changed = fit_eval_schedule(cfg)
        return cfg.train.eval_every, changed

    assert every("train.rounds=50") == (5, None)  # the default run: unchanged
    assert every("train.rounds=12")[0] == 2 and every("train.rounds=5")[0] == 1
    assert "train.eval_every 5 -> 1" in every("train.rounds=5")[1]
    assert every("train.rounds=5", "train.eval_every=5") == (5, None)  # a value set is kept


def test_a_short_run_has_curves_with_a_line(gsc_root, tmp_path, capsys):
    """`fedac run --rounds 5` at the default train.eval_every evaluates every round, not only the
    last, and its config.yaml records the schedule it ran. Its summary and results.json say which
    clients the percentiles rank (here none: each holds 14 held-out clips, fewer than asked)."""
    settings = {k: v for k, v in tiny_run(gsc_root, tmp_path / "cache").items()}
    del settings["train.eval_every"]
    settings["eval.min_client_clips"] = 15
    out = tmp_path / "run"
    argv = ["run", "--rounds", "5", *[f"--set={k}={v}" for k, v in settings.items()]]
    assert main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "train.eval_every 5 -> 1" in printed.err
    assert "no client holds eval.min_client_clips=15 held-out clips" in printed.out
    results = json.loads((out / "results.json").read_text())
    scored = results["per_client"]["evaluated"]
    assert results["per_client"]["unranked"] == scored > 0
    assert f"leaving out the {scored} scored clients" in results["legend"]["per_client"]
    assert results["per_client"]["spreads"]["accuracy"]["worst10_mean"] is None
    # the wall time says what it covers, printed and in the legend
    assert re.search(r"^wall time \(rounds \+ evaluations, all sittings\) +\d", printed.out, re.M)
    assert "summed over every sitting of a resumed run" in results["legend"]["wall_seconds"]
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    assert [int(r["round"]) for r in rows] == [1, 2, 3, 4, 5]
    assert load_config(out / "config.yaml").train.eval_every == 1
    clients = list(csv.DictReader(open(out / "clients.csv")))
    assert {int(r["round"]) for r in clients} == {1, 2, 3, 4, 5}


def test_models_counts_parameters_on_the_meta_device(capsys):
    """`fedac models` says first what it is doing and builds no SSL weights (w2v2_base has 90 M):
    their rows come from the measured table (tests/models/test_ssl_counts.py); shape_only builds
    every network on the meta device with the counts of the real builds."""
    from fedac.cli import shape_only
    from fedac.models import MODELS, build_model, count_parameters

    for name, _ in MODELS.items():
        model = shape_only(name, 40, 35)
        assert all(p.is_meta for p in model.parameters()), name
    for name in ("crnn_base", "dscnn", "w2v2_s"):  # w2v2_s: the shipped encoder, read for real
        real = build_model(name, 40, 35)
        assert count_parameters(shape_only(name, 40, 35)) == count_parameters(real), name
    assert main(["models"]) == 0
    printed = capsys.readouterr()
    assert printed.err.startswith("fedac: sizing the 20 models")
    assert re.search(r"^w2v2_base +90,224,291 +360\.897 +8,834\.1  no \[1\]", printed.out, re.M)
    assert re.search(r"^crnn_lite +32,675 +0\.131 +2\.8  crnn", printed.out, re.M)
    # the reason the SSL encoders do not stack, and what the count leaves out, said once
    assert printed.out.count("measured slower vmapped") == 1
    assert "2,536,611 + 263,680 = docs/ssl.md's 2.79 M" in printed.out


def test_a_second_models_call_reads_its_rows_and_loads_no_torch(tmp_path):
    """The feature networks' rows are kept under $FEDAC_HOME/models/ (keyed by the training code,
    torch's version and the sizes): a second `fedac models` prints the same without torch."""
    probe = (
        "import json, sys, fedac.cli; code = fedac.cli.main(['models', *sys.argv[1:]]); "
        "print(json.dumps([code, sorted(m for m in sys.modules if m.split('.')[0] == 'torch')]))"
    )
    env = {**os.environ, "FEDAC_HOME": str(tmp_path)}
    runs = [
        subprocess.run(
            [sys.executable, "-c", probe, "--num-classes", "7"],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        ).stdout.splitlines()
        for _ in range(2)
    ]
    assert runs[0][:-1] == runs[1][:-1] and "7 classes" in runs[0][0]
    assert json.loads(runs[0][-1])[1] != [] and json.loads(runs[1][-1]) == [0, []]


def test_models_counts_flops_by_formula_as_torchs_counter_does():
    """models/flops.py against torch's FlopCounterMode (the independent reference): equal on every
    zoo network but KWT, on a batched matmul and an einsum; KWT's count is the reference's plus
    the attention products that its CPU flash-attention kernel hides from it (2 x 2 x L x L x E
    per encoder layer, by hand). An LSTM, which the reference does not see on the CPU, against
    its formula by hand."""
    import torch
    from torch import nn
    from torch.utils.flop_counter import FlopCounterMode

    from fedac.models import build_model
    from fedac.models.flops import count_forward_flops
    from fedac.settings.models import MODELS, SSL_NAMES

    def reference(model, x) -> float:
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            model(x)
        return float(counter.get_total_flops())

    x = torch.zeros(1, 40, 101)
    names = [n for n, _ in MODELS.items() if n not in SSL_NAMES and not MODELS.is_plugin(n)]
    assert {"crnn_tiny", "crnn_deep", "mhattrnn", "dscnn", "resnet15", "kwt"} <= set(names)
    for name in names:
        model = build_model(name, 40, 35).train()
        ours, theirs = count_forward_flops(model, x), reference(model, x)
        if name == "kwt":
            layer = model.encoder.layers[0].self_attn
            tokens = 1 + len(range(0, 40 - 8 + 1, 4)) * len(range(0, 101 - 8 + 1, 4))
            hidden = 2 * 2 * tokens * tokens * layer.embed_dim * len(model.encoder.layers)
            assert ours == theirs + hidden > theirs
        else:
            assert ours == theirs > 0, name

    def products(out):  # (2, 7, 32)
        scores = torch.bmm(out, out.transpose(1, 2))
        return torch.einsum("btd,bsd->bts", scores, out.transpose(1, 2)[:, :7])

    y = torch.randn(2, 7, 32)
    assert count_forward_flops(products, y) == reference(products, y) == 2 * 98 * 32 + 2 * 2 * 7**3

    lstm = nn.LSTM(12, 16, num_layers=2, bidirectional=True, batch_first=True)
    # per step and direction 2 x 4 gates x H x (input + H), layer inputs 12 and 2 x 16; x 2 dirs,
    # batch 2, 7 steps
    by_hand = (2 * 4 * 16 * (12 + 16) + 2 * 4 * 16 * (32 + 16)) * 2 * 2 * 7
    assert count_forward_flops(lstm, torch.zeros(2, 7, 12)) == by_hand
    # a PackedSequence (torch.lstm's other signature): only the steps it holds, 7 + 3 of 2 x 7
    packed = nn.utils.rnn.pack_padded_sequence(torch.zeros(2, 7, 12), [7, 3], batch_first=True)
    assert count_forward_flops(lstm, packed) == by_hand * 10 // 14
    # unbatched input (7, 12), a GRU: 3 gates, one layer, one direction
    gru = nn.GRU(12, 16)
    assert count_forward_flops(gru, torch.zeros(7, 12)) == 2 * 3 * 16 * (12 + 16) * 7


def test_a_closed_pipe_ends_quietly_with_the_sigpipe_status():
    """`fedac list | head -1`: the reader has gone before the output is written; no traceback, and
    the status a command killed by SIGPIPE gets (141)."""
    read, write = os.pipe()
    os.close(read)  # nobody will read
    done = subprocess.run(
        [sys.executable, "-m", "fedac", "list"], stdout=write, stderr=subprocess.PIPE, text=True
    )
    os.close(write)
    assert done.returncode == 141 and done.stderr == ""


def test_version_prints_the_package_and_the_code_version(capsys):
    from fedac import __version__
    from fedac.version import code_version

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    printed = capsys.readouterr().out.strip()
    v = code_version()
    assert printed.startswith(f"fedac {__version__} (training code sha256 ")
    assert v["source_sha256"][:16] in printed
    assert (v["git_commit"] or "no git checkout")[:12] in printed


def test_out_in_a_config_file_applies_or_is_refused(gsc_root, tmp_path, capsys, monkeypatch):
    """`out:` of a config file is where the run goes; a second run of that file is refused (the
    folder holds a run: resume it or choose another --out); the run's own config.yaml, run again,
    writes its repeat to a new directory and says where."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "mine"
    settings = {**tiny_run(str(gsc_root), str(tmp_path / "cache")), "train.rounds": 1}
    config: dict = {"out": str(out)}
    for key, value in settings.items():
        section, name = key.split(".")
        config.setdefault(section, {})[name] = value
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(config))
    assert main(["run", "--config", "mine.yaml", "--quiet"]) == 0
    assert (out / "results.json").is_file()
    capsys.readouterr()
    assert main(["run", "--config", "mine.yaml", "--quiet"]) == 2
    assert f"out: {out} (from mine.yaml) holds a run already" in capsys.readouterr().err
    assert main(["run", "--config", str(out / "config.yaml")]) == 0
    said = capsys.readouterr().err
    assert f"fedac: {out} holds the run this config.yaml came from; the repeat writes runs/" in said
    assert len(list((tmp_path / "runs").glob("*/results.json"))) == 1
