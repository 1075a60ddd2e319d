"""Issue-10 plumbing of FedMLAC: honest personalized means, the few-visits warning, the CE warm-up,
the LPA log, and `fedac reproduce` (every experiment at toy size, resuming)."""

from __future__ import annotations

import csv
import json
import logging

import pytest
import torch
from test_fedmlac import _client, _fedmlac_cfg, _task

from fedac.algorithms.fedmlac import FedMLAC, expected_visits
from fedac.cli import main
from fedac.config import load_config
from fedac.engine.simulator import Simulator, sample_cohort
from fedac.experiments.fedmlac import DATASETS, EXPERIMENTS
from fedac.rules.aggregation import layer_groups
from fedac.training.evaluate import window_accuracy

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = [
    "model.name=crnn_tiny",
    "model.client_model=crnn_tiny",
    "fedmlac.plugin_model=crnn_tiny",
    "model.zoo=[crnn_tiny]",
    "train.local_epochs=1",
]


def test_personalized_means_cover_only_clients_that_trained(gsc_root, tmp_path):
    cfg = _fedmlac_cfg(gsc_root, tmp_path, "train.rounds=1", "train.eval_every=1")
    sim = Simulator(cfg, tmp_path / "run", progress=False)
    final = sim.run()["final"]
    trained = sample_cohort(sim.trainable, cfg.train.fraction, cfg.seed, 1)
    assert 0 < len(trained) < len(sim.data.clients)
    assert (final["personalized_clients"], final["clients_trained"]) == (len(trained), len(trained))
    assert final["visits_per_trained_client"] == 1.0
    by_hand = []
    for client in sim.data.clients:
        if client.name in trained:
            own = sim.algorithm.personalized_model(client.name, sim.state.clients[client.name])
            by_hand.append(window_accuracy(own, client.holdout_x, client.holdout_y))
    assert final["personalized_local_accuracy_mean"] == pytest.approx(sum(by_hand) / len(by_hand))
    legend = json.loads((tmp_path / "run" / "results.json").read_text())["legend"]
    assert "trained at least once" in legend["personalized_clients"]


@pytest.mark.slow
def test_fedkad_has_no_shared_model_column(gsc_root, tmp_path):
    cfg = _fedmlac_cfg(gsc_root, tmp_path, "algorithm=fedkad", "train.rounds=1")
    final = Simulator(cfg, tmp_path / "kad", progress=False).run()["final"]
    assert final["has_global_model"] is False
    assert "accuracy" not in final and "personalized_accuracy_mean" in final


def test_few_visits_warn_and_name_the_settings(caplog):
    task = _task()
    few = load_config(overrides=["train.rounds=3", "train.fraction=0.1"])
    many = load_config(overrides=["train.rounds=40", "train.fraction=0.5"])
    assert expected_visits(few, 240) == pytest.approx(3 * 24 / 240)
    assert expected_visits(many, 240) == pytest.approx(20.0)
    with caplog.at_level(logging.WARNING, logger="fedac.algorithms.fedmlac"):
        FedMLAC(many, task)
        assert not caplog.records
        FedMLAC(few, task)
    message = caplog.records[-1].getMessage()
    assert (
        "train.rounds" in message and "train.fraction" in message and "data.max_clients" in message
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fedac.algorithms.fedmlac"):
        # no mutual learning
        FedMLAC(load_config(overrides=["train.rounds=3", "fedmlac.ml=false"]), task)
    assert not caplog.records


def _update(extra: list[str], round_idx: int):
    base = ["model.client_model=crnn_tiny", "fedmlac.plugin_model=crnn_tiny", "train.lr=0.1"]
    algo = FedMLAC(load_config(overrides=base + extra), _task())
    torch.manual_seed(0)
    return algo.client_update(
        algo.broadcast(algo.init_server()),
        algo.init_client_state("a"),
        _client(),
        round_idx,
        torch.Generator().manual_seed(0),
    ).upload


def test_warmup_rounds_train_on_ce_then_mutual_learning():
    same = lambda a, b: all(torch.equal(a[k], b[k]) for k in a)  # noqa: E731
    assert same(_update(["fedmlac.warmup_rounds=2"], 2), _update(["fedmlac.ml=false"], 2))
    assert same(_update(["fedmlac.warmup_rounds=2"], 3), _update([], 3))
    assert not same(_update([], 3), _update(["fedmlac.ml=false"], 3))


@pytest.mark.slow
def test_lpa_log_names_pruned_clients_with_their_sizes(gsc_root, tmp_path):
    cfg = _fedmlac_cfg(
        gsc_root, tmp_path, "train.rounds=2", "aggregation.v_l=0.25", "aggregation.v_h=0.25"
    )
    sim = Simulator(cfg, tmp_path / "lpa", progress=False)
    sim.run()
    rows = [json.loads(line) for line in (tmp_path / "lpa" / "lpa.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2]
    for row in rows:
        cohort = sample_cohort(sim.trainable, cfg.train.fraction, cfg.seed, row["round"])
        assert sorted(row["n_k"]) == sorted(cohort)
        assert all(row["n_k"][c] == sim.data.client(c).num_samples for c in cohort)
        assert set(row["pruned"]) == set(layer_groups(list(sim.state.server["params"]), "module"))
        assert "rnn.l0" in row["pruned"]  # a recurrent layer's tensors are one LPA layer
        assert all(len(p) == 2 * int(0.25 * len(cohort)) for p in row["pruned"].values())
    # the round's summary of LPA's bias is in metrics.csv
    assert "lpa_kept_data_share" in (tmp_path / "lpa" / "metrics.csv").read_text().splitlines()[0]


def test_alpha_sweep_partitions_the_embedded_urban_stand_in():
    """Every cell of `reproduce alpha` must find a Dirichlet split of the real stand-in (not a toy
    tree): with the paper's 50 clients, alpha = 0.1 left some client empty in every draw and the
    sweep died at its first cell."""
    import numpy as np

    from fedac.data.partition import dirichlet_assign
    from fedac.data.synth.urban import DEFAULT_RECORDINGS, _plan
    from fedac.seeding import numpy_rng

    # the embedded stand-in's training units: one per recording (group_by_source), folds 9 and 10
    # held out
    train = [r for r in _plan(DEFAULT_RECORDINGS, 0) if r.fold not in (9, 10)]
    labels, sizes = (
        np.array([r.class_id for r in train]),
        np.array([len(r.slices()) for r in train]),
    )
    assert (len(train), sizes.sum()) == (640, 1202)
    cfg = load_config(None, DATASETS["urbansound8k"])
    for _, settings in EXPERIMENTS["alpha"].variants:
        alpha = load_config(None, DATASETS["urbansound8k"] + settings).data.alpha
        for seed in (0, 1, 2):
            owners = dirichlet_assign(
                labels,
                sizes,
                cfg.data.num_clients,
                alpha,
                cfg.data.min_client_size,
                numpy_rng(seed, "partition", "dirichlet"),
            )
            assert (
                len(owners) == 24
                and min(sizes[o].sum() for o in owners) >= cfg.data.min_client_size
            )


@pytest.fixture(scope="module")
def us8k_tree(tmp_path_factory):
    from test_urbansound8k import write_tree

    return write_tree(tmp_path_factory.mktemp("us8k"))


def test_paper_grids_match_the_papers_tables(tmp_path):
    """Tables 6 and 7 carry the paper's FedMLAC w/o LPA column on the homogeneous models; Table 5
    covers the paper's three datasets (IEMOCAP always has all its clients active)."""
    from fedac.experiments.compare import parse_method
    from fedac.experiments.runner import grid_cells
    from fedac.experiments.spec import Request

    def cells(spec, datasets):
        return grid_cells(spec, Request(tmp_path, datasets=datasets))

    for name in ("table6", "table7"):
        methods = {m.label: m for m in map(parse_method, EXPERIMENTS[name].methods)}
        assert list(methods) == [
            "FedAvg",
            "FedProx",
            "FedOPT",
            "FedKAD",
            "FedMLAC w/o LPA",
            "FedMLAC",
        ]
        assert set(methods["FedMLAC w/o LPA"].overrides) == {
            "model.client_model=crnn_base",
            "fedmlac.lpa=false",
        }
    assert {c.dataset for c in cells(EXPERIMENTS["table5"], None)} == {
        "speech_commands",
        "cremad",
        "urbansound8k",
    }
    assert {c.dataset for c in cells(EXPERIMENTS["table4"], None)} == set(DATASETS)


@pytest.mark.parametrize("name", sorted(set(EXPERIMENTS) - {"hetero"}))
@pytest.mark.slow
def test_every_reproduce_command_runs_at_toy_size(name, gsc_root, us8k_tree, tmp_path):
    dataset, root = (
        ("urbansound8k", us8k_tree) if name == "alpha" else ("speech_commands", gsc_root)
    )
    out = tmp_path / name
    args = [
        "reproduce",
        name,
        "--quiet",
        "--seeds",
        "0",
        "--rounds",
        "1",
        "--datasets",
        dataset,
        "--out",
        str(out),
        "--set",
        f"data.root={root}",
        "--set",
        "data.num_clients=4",
        "--set",
        "data.min_client_size=1",
    ]
    for setting in TINY:
        args += ["--set", setting]
    experiment = EXPERIMENTS[name]
    methods = [m.split("=")[0] for m in experiment.methods]
    # every method is run by table4/fig2/fig3; here one is enough per variant
    if experiment.variants:
        methods = ["FedMLAC"]
        args += ["--methods", "FedMLAC"]
    assert main(args) == 0
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert len(rows) == len(methods) * max(1, len(experiment.variants))
    # --rounds 1 is honoured
    assert {int(float(r["visits_per_trained_client"])) for r in rows} == {1}
    table = (out / "table.md").read_text()
    assert (
        "Shared model on the test split" in table
        and "own models on their own held-out data" in table
    )
    assert all(f"| {m} |" in table for m in methods)
    assert "±" not in table.split("## ", 1)[1]  # one seed: the mean alone, no spread of zero
    assert (out / "figure.png").stat().st_size > 0
    assert (out / "curves.png").exists() == experiment.curves  # paper-regime: accuracy per round
    assert "## Wall time per run" in table
    for variant, settings in experiment.variants:
        run = next(r for r in rows if r["cell"].endswith(variant))
        saved = (out.joinpath(run["run_dir"].split(str(out) + "/")[1]) / "config.yaml").read_text()
        key, value = settings[0].split("=")
        assert (
            f"{key.split('.')[1]}: {float(value) if '.' in value else value}" in saved
            or f"{key.split('.')[1]}: {value}" in saved
        )


@pytest.mark.slow
def test_reproduce_resumes_instead_of_rerunning(gsc_root, tmp_path, monkeypatch):
    out = tmp_path / "fig3"
    args = [
        "reproduce",
        "fig3",
        "--quiet",
        "--seeds",
        "0",
        "--rounds",
        "2",
        "--datasets",
        "speech_commands",
        "--out",
        str(out),
        "--set",
        f"data.root={gsc_root}",
    ] + [a for s in TINY for a in ("--set", s)]
    assert main(args) == 0
    first = (out / "results.csv").read_text()
    run_dir = out / "speech_commands" / "FedMLAC-s0"
    (run_dir / "results.json").unlink()  # as if killed after its last checkpoint
    trained = []
    original = Simulator.run_round

    def counting(self, state, round_idx):
        trained.append(round_idx)
        return original(self, state, round_idx)

    monkeypatch.setattr(Simulator, "run_round", counting)
    assert main(args) == 0
    assert trained == []  # the checkpoint was at the last round: nothing is trained again
    assert json.loads((run_dir / "results.json").read_text())["resumed_from"] == 2
    assert (out / "results.csv").read_text().replace("\r", "") == first.replace("\r", "") or [
        r["accuracy"] for r in csv.DictReader(open(out / "results.csv"))
    ] == [r["accuracy"] for r in csv.DictReader(first.splitlines())]
    # another experiment's settings in the same folder are refused, not mixed in
    assert main(args[:-2] + ["--set", "train.lr=0.5"] + args[-2:]) == 2


@pytest.mark.slow
def test_finished_only_writes_the_table_from_ended_runs_and_trains_nothing(
    gsc_root, tmp_path, monkeypatch
):
    out = tmp_path / "fig3"
    common = [
        "--quiet",
        "--rounds",
        "1",
        "--datasets",
        "speech_commands",
        "--out",
        str(out),
        "--set",
        f"data.root={gsc_root}",
    ] + [a for s in TINY for a in ("--set", s)]
    assert main(["reproduce", "fig3", "--seeds", "0", "--methods", "FedMLAC", *common]) == 0
    ended = (out / "speech_commands" / "FedMLAC-s0" / "results.json").read_text()
    trained = []
    monkeypatch.setattr(Simulator, "run_round", lambda self, state, r: trained.append(r))
    assert main(["reproduce", "fig3", "--seeds", "0", "1", "--finished-only", *common]) == 0
    assert trained == []
    assert sorted(p.name for p in (out / "speech_commands").iterdir() if p.is_dir()) == [
        "FedMLAC-s0"
    ]
    assert (out / "speech_commands" / "FedMLAC-s0" / "results.json").read_text() == ended
    table = (out / "table.md").read_text()
    accuracy = table.split("## Shared model on the test split")[1].split("##")[0]
    assert (
        "| FedMLAC | " in accuracy and "(n=1)" in accuracy.split("| FedMLAC | ")[1].split("\n")[0]
    )
    assert "pending" in accuracy.split("| FedMLAC w/o ML | ")[1].split("\n")[0]
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert [(r["method"], r["seed"]) for r in rows] == [("FedMLAC", "0")]
    summary = json.loads((out / "speech_commands" / "summary.json").read_text())
    # the run's own time, not the reading's
    assert summary["wall_seconds"] == json.loads(ended)["wall_seconds"]


@pytest.mark.parametrize(
    "experiment, option",
    [
        ("zeroshot-table3", ["--finished-only"]),
        ("zeroshot-table4", ["--methods", "FedAvg"]),
        ("table4", ["--attacks", "backdoor"]),
        ("fig3", ["--fractions", "0.1"]),
        ("paper-regime", ["--aggregators", "median"]),
    ],
)
def test_reproduce_refuses_an_option_the_experiment_does_not_read(
    experiment, option, tmp_path, capsys
):
    assert main(["reproduce", experiment, *option, "--out", str(tmp_path / "x")]) == 2
    assert f"does not use {option[0]}" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_runs_started_together_generate_the_stand_in_once(tmp_path, monkeypatch):
    """Two runs on a fresh cache: the second waits for the first's generation instead of clearing
    it."""
    import threading
    import time as _time

    from fedac.data import registry

    calls, inside = [], []

    def generate(root, seed, progress, **kwargs):
        inside.append(1)
        assert len(inside) == 1, "two generations of one stand-in ran at the same time"
        if not (root / "done").exists():
            calls.append(root)
            _time.sleep(0.3)
            root.mkdir(parents=True, exist_ok=True)
            (root / "done").write_text("")
        inside.pop()

    monkeypatch.setattr(registry, "synthesizer", lambda spec: generate)
    cfg = load_config(overrides=[f"data.cache_dir={tmp_path}"])
    threads = [threading.Thread(target=registry.resolve_root, args=(cfg, False)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1


def test_a_killed_reproduction_leaves_a_table_of_what_finished(gsc_root, tmp_path, monkeypatch):
    out = tmp_path / "fig3"
    args = [
        "reproduce",
        "fig3",
        "--quiet",
        "--seeds",
        "0",
        "1",
        "--rounds",
        "1",
        "--datasets",
        "speech_commands",
        "--out",
        str(out),
        "--set",
        f"data.root={gsc_root}",
    ] + [a for s in TINY for a in ("--set", s)]
    original, started = Simulator.run, []

    def killed_at_the_second_run(self, *a, **k):
        started.append(1)
        if len(started) == 2:
            raise KeyboardInterrupt
        return original(self, *a, **k)

    monkeypatch.setattr(Simulator, "run", killed_at_the_second_run)
    # Ctrl-C: one line, no traceback (cli.main), and the table of what finished
    assert main(args) == 130
    table = (out / "table.md").read_text()
    first = next(line for line in table.splitlines() if line.startswith("| FedMLAC |"))
    assert "(n=1)" in first  # seed 0 of 2 finished
    assert "pending" in next(
        line for line in table.splitlines() if line.startswith("| FedMLAC w/o ML |")
    )
    assert len(list(csv.DictReader(open(out / "results.csv")))) == 1


@pytest.mark.slow
def test_a_copy_trains_the_later_cells_before_waiting_for_a_run_another_copy_holds(
    gsc_root, tmp_path, monkeypatch
):
    """Two copies of one reproduction keep both cores busy across cells: a run another process holds
    in the first cell is passed over, every later cell's runs are trained meanwhile, and only then
    does this copy wait (here the other copy dies without a result, so this one trains that run
    last)."""
    import fcntl
    import os
    import threading
    import time

    from fedac.experiments.compare import cell_folder
    from fedac.experiments.runner import grid_cells
    from fedac.experiments.spec import Request

    def cells(spec, datasets):
        return grid_cells(
            spec, Request(tmp_path, datasets=datasets, overrides=[f"data.root={gsc_root}"])
        )

    out = tmp_path / "table6"
    args = [
        "reproduce",
        "table6",
        "--quiet",
        "--seeds",
        "0",
        "--rounds",
        "1",
        "--datasets",
        "speech_commands",
        "--methods",
        "FedAvg",
        "--out",
        str(out),
        "--set",
        f"data.root={gsc_root}",
        "--set",
        "data.num_clients=4",
        "--set",
        "data.min_client_size=1",
    ] + [a for s in TINY for a in ("--set", s)]
    folders = [cell_folder(c.label) for c in cells(EXPERIMENTS["table6"], ["speech_commands"])]
    trained = []
    real_run = Simulator.run
    monkeypatch.setattr(
        Simulator,
        "run",
        lambda self, **kw: trained.append(self.run_dir.parent.name) or real_run(self, **kw),
    )
    held_dir = out / folders[0] / "FedAvg-s0"
    held_dir.mkdir(parents=True)
    held = os.open(held_dir, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)  # "another copy" is training the first cell's run
    codes = []
    worker = threading.Thread(target=lambda: codes.append(main(args)), daemon=True)
    worker.start()
    last = out / folders[-1] / "FedAvg-s0" / "results.json"
    deadline = time.monotonic() + 300
    try:
        while not last.is_file() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)
        assert trained == folders[1:], (
            "the later cells are trained while the first cell's run is held"
        )
        assert worker.is_alive() and not (held_dir / "results.json").exists()  # now waiting for it
    finally:
        # the other copy dies without a result (also when an assertion failed: no hang)
        os.close(held)
    worker.join(timeout=300)
    assert codes == [0] and trained == folders[1:] + folders[:1]
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert sorted(r["cell"] for r in rows) == sorted(
        c.label for c in cells(EXPERIMENTS["table6"], ["speech_commands"])
    )


@pytest.mark.parametrize("name", ["robustness", "earlyexit-table2"])
def test_finished_only_reaches_the_other_grids(name, tmp_path, monkeypatch):
    """The flag is passed on, not ignored: on an empty folder nothing is trained or created, and the
    table still gets written."""
    trained = []
    monkeypatch.setattr(Simulator, "run_round", lambda self, state, r: trained.append(r))
    out = tmp_path / name
    assert (
        main(["reproduce", name, "--finished-only", "--quiet", "--seeds", "0", "--out", str(out)])
        == 0
    )
    assert trained == [] and not list(out.rglob("*-s0"))
    assert (out / "table.md").is_file()
