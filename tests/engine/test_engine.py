"""Round engine: exact resume, evaluation schedule, validation-only model selection, NaN clients,
cohort sampling."""

from __future__ import annotations

import csv
import logging

import pytest
import torch

from fedac.algorithms import base as base_mod
from fedac.algorithms.fedavg import FedAvg
from fedac.config import load_config
from fedac.engine import evaluation as evaluation_mod
from fedac.engine.checkpoint import load_checkpoint
from fedac.engine.data import build_federated_data
from fedac.engine.simulator import Simulator, sample_cohort
from fedac.errors import CheckpointError, ConfigError
from helpers import tiny_run

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("engine_cache")


def make_cfg(root, cache, **settings):
    base = {**tiny_run(root, cache), "train.rounds": 6, "train.lr": 0.1, "train.batch_size": 16}
    base.update(settings)
    return load_config(None, [f"{k}={v}" for k, v in base.items()])


@pytest.fixture(scope="module")
def data(gsc_root, cache_dir):
    """Resident tensors of the session GSC tree: 6 training speakers of 70 clips, 70 val, 70 test
    clips."""
    return build_federated_data(make_cfg(gsc_root, cache_dir), progress=False)


@pytest.fixture
def cfg_for(gsc_root, cache_dir):
    return lambda **settings: make_cfg(gsc_root, cache_dir, **settings)


def without_time(history):
    return [{k: v for k, v in row.items() if k != "wall_seconds"} for row in history]


def test_federated_data_shapes(data):
    assert len(data.clients) == 6
    assert data.task.num_features == 40 and data.task.num_classes == 35
    # 70 clips per speaker, floor(0.2 * 70) = 14 held out
    assert all(c.num_samples == 56 and len(c.holdout_y) == 14 for c in data.clients)
    assert data.val.num_clips == 70 and data.test.num_clips == 70
    assert data.clients[0].x.shape[1:] == (40, 101)


# --- resume -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "algorithm, checkpoint_every, stop_after, resumed_from",
    [
        ("fedavg", 1, 3, 3),
        ("fedadam", 3, 3, 3),
        ("fedavg", 3, 4, 3),  # killed between checkpoints: round 4 is replayed
    ],
)
@pytest.mark.slow
def test_resume_gives_the_uninterrupted_result(
    data, cfg_for, tmp_path, algorithm, checkpoint_every, stop_after, resumed_from
):
    cfg = cfg_for(
        algorithm=algorithm,
        **{"train.checkpoint_every": checkpoint_every, "fedopt.server_lr": 0.05},
    )
    straight = Simulator(cfg, tmp_path / "straight", data, progress=False)
    expected = straight.run()

    killed = Simulator(cfg, tmp_path / "resumed", data, progress=False)
    assert killed.run(stop_after=stop_after) is None
    checkpoint = load_checkpoint(tmp_path / "resumed")
    assert checkpoint.round == resumed_from
    if algorithm == "fedadam":
        # the server moments are part of the checkpoint and are non-trivial by round 3
        assert checkpoint.server["moments"]["v"]
        assert any(v.abs().sum() > 0 for v in checkpoint.server["moments"]["v"].values())

    resumed = Simulator(cfg, tmp_path / "resumed", data, progress=False)
    got = resumed.run(resume=True)
    # not a restart
    assert (got["resumed_from"], got["rounds_trained"]) == (resumed_from, 6 - resumed_from)

    a, b = straight.state.server, resumed.state.server
    assert a["params"].keys() == b["params"].keys()
    for name in a["params"]:
        assert torch.equal(a["params"][name], b["params"][name]), name
    if algorithm == "fedadam":
        for moment in ("m", "v"):
            for name in a["moments"][moment]:
                assert torch.equal(a["moments"][moment][name], b["moments"][moment][name]), (
                    moment,
                    name,
                )
    assert got["rounds"] == expected["rounds"] == 6
    assert without_time(got["history"]) == without_time(expected["history"])
    assert got["final"] == expected["final"]
    rows = list(csv.DictReader(open(tmp_path / "resumed" / "metrics.csv")))
    assert [int(r["round"]) for r in rows] == [1, 2, 3, 4, 5, 6]


def test_resume_errors(data, cfg_for, tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint"):
        Simulator(cfg_for(), tmp_path / "empty", data, progress=False).run(resume=True)
    Simulator(cfg_for(**{"train.rounds": 2}), tmp_path / "run", data, progress=False).run(
        stop_after=1
    )
    with pytest.raises(CheckpointError, match="fedavg"):
        Simulator(
            cfg_for(algorithm="fedprox", **{"train.rounds": 2}),
            tmp_path / "run",
            data,
            progress=False,
        ).run(resume=True)


# --- evaluation schedule and model selection ----------------------------------------------------


@pytest.mark.slow
def test_eval_rows_at_eval_every_and_last_round(data, cfg_for, tmp_path):
    cfg = cfg_for(**{"train.rounds": 5, "train.eval_every": 2, "train.checkpoint_every": 2})
    results = Simulator(cfg, tmp_path, data, progress=False).run()
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert [int(r["round"]) for r in rows] == [2, 4, 5]
    assert [int(row["round"]) for row in results["history"]] == [2, 4, 5]
    assert {"val_accuracy", "val_macro_f1", "val_uar", "train_loss"} <= set(rows[0])
    assert results["rounds"] == 5
    assert load_checkpoint(tmp_path).round == 5
    # fraction 0.5 of 6 clients -> 3 per round
    assert all(row["clients"] == 3.0 and row["rejected"] == 0.0 for row in results["history"])


def spy_evaluate(monkeypatch, data, val_accuracies=()):
    """Record every evaluated model; the validation accuracies can be scripted (one per
    evaluation)."""
    calls = []
    real = evaluation_mod.evaluate
    scripted = iter(val_accuracies)

    def spy(model, split, *args, **kwargs):
        tag = "val" if split is data.val else "test" if split is data.test else "other"
        calls.append((tag, {k: v.detach().clone() for k, v in model.state_dict().items()}))
        scores = real(model, split, *args, **kwargs)
        return (
            {**scores, "accuracy": next(scripted, scores["accuracy"])} if tag == "val" else scores
        )

    monkeypatch.setattr(base_mod, "evaluate", spy)  # what Algorithm.evaluate_views calls
    monkeypatch.setattr(evaluation_mod, "evaluate", spy)  # the test curve's direct call
    return calls


def same_params(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_best_val_selection_never_reads_test(data, cfg_for, tmp_path, monkeypatch):
    # scripted validation scores peak at round 2, so the selected model is not the last one
    calls = spy_evaluate(monkeypatch, data, val_accuracies=[0.5, 0.9, 0.3, 0.2, 0.1])
    cfg = cfg_for(
        **{"train.rounds": 5, "train.fraction": 1.0, "train.lr": 0.3, "train.select": "best_val"}
    )
    results = Simulator(cfg, tmp_path, data, progress=False).run()
    # the test split is read once, after training, and never during the rounds
    assert [tag for tag, _ in calls] == ["val"] * 5 + ["test"]
    assert [row["val_accuracy"] for row in results["history"]] == [0.5, 0.9, 0.3, 0.2, 0.1]
    assert results["final"]["selected_round"] == 2
    # the model tested is the one validated at round 2, not the last one
    assert same_params(calls[-1][1], calls[1][1])
    assert not same_params(calls[-1][1], calls[4][1])


def test_select_last(data, cfg_for, tmp_path, monkeypatch):
    calls = spy_evaluate(monkeypatch, data)
    cfg = cfg_for(**{"train.rounds": 3, "train.select": "last"})
    results = Simulator(cfg, tmp_path, data, progress=False).run()
    assert [tag for tag, _ in calls] == ["val"] * 3 + ["test"]
    assert results["final"]["selected_round"] == 3
    assert same_params(calls[-1][1], calls[2][1])


def test_final_results_are_the_selected_models_scores(data, cfg_for, tmp_path):
    sim = Simulator(cfg_for(**{"train.rounds": 2, "train.lr": 0.3}), tmp_path, data, progress=False)
    results = sim.run()
    final = results["final"]
    for key in (
        "accuracy",
        "macro_f1",
        "uar",
        "selected_round",
        "client_accuracy_mean",
        "client_accuracy_std",
    ):
        assert key in final
    # recomputed by hand from the selected model: one window per clip in this fixture
    model = sim.algorithm.global_model(sim.evaluator.selected_server(sim.state)).eval()
    with torch.no_grad():
        test_hits = (model(data.test.x).argmax(1) == data.test.labels).double()
        per_client = torch.stack(
            [(model(c.holdout_x).argmax(1) == c.holdout_y).double().mean() for c in data.clients]
        )
    assert final["accuracy"] == pytest.approx(float(test_hits.mean()))
    assert final["client_accuracy_mean"] == pytest.approx(float(per_client.mean()))
    assert final["client_accuracy_std"] == pytest.approx(float(per_client.std(unbiased=False)))
    assert per_client.std() > 0  # the clients' accuracies differ, so the std is not vacuous
    assert results["rounds"] == 2 and results["wall_seconds"] > 0
    assert (tmp_path / "results.json").is_file() and (tmp_path / "curves.png").is_file()


# --- bad clients --------------------------------------------------------------------------------


@pytest.mark.slow
def test_nan_client_update_is_discarded(data, cfg_for, tmp_path, monkeypatch, caplog):
    bad = data.clients[1].name
    kept: dict[str, tuple[dict, int]] = {}
    real = FedAvg.client_update

    def patched(self, payload, state, client, round_idx, generator):
        result = real(self, payload, state, client, round_idx, generator)
        if client.name == bad:
            result.upload = {
                k: torch.full_like(v, float("nan")) if v.is_floating_point() else v
                for k, v in result.upload.items()
            }
        else:
            kept[client.name] = (
                {k: v.clone() for k, v in result.upload.items()},
                client.num_samples,
            )
        return result

    monkeypatch.setattr(FedAvg, "client_update", patched)
    sim = Simulator(
        cfg_for(**{"train.rounds": 1, "train.fraction": 1.0}), tmp_path, data, progress=False
    )
    with caplog.at_level(logging.WARNING):
        results = sim.run()
    assert any(
        bad in r.getMessage() and "discarded" in r.getMessage() and r.levelno == logging.WARNING
        for r in caplog.records
    )
    row = results["history"][0]
    assert row["rejected"] == 1.0 and row["clients"] == 5.0
    params = sim.state.server["params"]
    assert all(torch.isfinite(v).all() for v in params.values() if v.is_floating_point())
    # the new global model is the n_k-weighted mean of the five remaining clients
    assert len(kept) == 5
    total = sum(n for _, n in kept.values())
    for name, value in params.items():
        if not value.is_floating_point():
            continue
        expected = sum(p[name].double() * n for p, n in kept.values()) / total
        assert torch.allclose(value.double(), expected, atol=1e-6), name


@pytest.mark.slow
def test_all_clients_nan_keeps_global_state(data, cfg_for, tmp_path, monkeypatch, caplog):
    real = FedAvg.client_update

    def patched(self, payload, state, client, round_idx, generator):
        result = real(self, payload, state, client, round_idx, generator)
        result.upload = {
            k: torch.full_like(v, float("inf")) if v.is_floating_point() else v
            for k, v in result.upload.items()
        }
        return result

    monkeypatch.setattr(FedAvg, "client_update", patched)
    sim = Simulator(cfg_for(**{"train.rounds": 1}), tmp_path, data, progress=False)
    initial = {k: v.clone() for k, v in sim.algorithm.init_server()["params"].items()}
    with caplog.at_level(logging.WARNING):
        results = sim.run()
    assert results["history"][0]["clients"] == 0.0
    assert any("no usable client update" in r.getMessage() for r in caplog.records)
    assert same_params(sim.state.server["params"], initial)


# --- cohort sampling ----------------------------------------------------------------------------


def test_cohort_size_is_rounded_fraction():
    clients = [f"c{i:02d}" for i in range(20)]
    assert len(sample_cohort(clients, 0.2, 0, 1)) == 4
    assert len(sample_cohort(clients, 0.33, 0, 1)) == 7  # round(6.6)
    assert len(sample_cohort(clients, 0.01, 0, 1)) == 1  # at least one
    assert sorted(sample_cohort(clients, 1.0, 0, 1)) == clients
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ConfigError, match="train.fraction"):
            sample_cohort(clients, bad, 0, 1)


def test_cohort_is_deterministic_per_seed_and_round():
    clients = [f"c{i:02d}" for i in range(20)]
    cohorts = [sample_cohort(clients, 0.25, 7, r) for r in range(1, 11)]
    assert cohorts == [sample_cohort(clients, 0.25, 7, r) for r in range(1, 11)]
    for cohort in cohorts:
        assert len(cohort) == 5 and len(set(cohort)) == 5 and set(cohort) <= set(clients)
    assert len({tuple(c) for c in cohorts}) > 1  # rounds differ
    assert [sample_cohort(clients, 0.25, 8, r) for r in range(1, 11)] != cohorts  # seeds differ
    # independent of how many rounds were drawn before (needed for resume)
    assert sample_cohort(clients, 0.25, 7, 9) == cohorts[8]


def test_configure_process_sets_threads_and_keeps_freed_memory_on_glibc(monkeypatch):
    import platform

    from fedac.training import runtime

    calls = []
    monkeypatch.setattr(runtime, "keep_freed_memory", lambda: calls.append(True) or True)
    monkeypatch.setattr(runtime.torch, "set_num_threads", lambda n: calls.append(n))
    runtime.configure_process(load_config(overrides=["runtime.threads=1"]).runtime)
    runtime.configure_process(
        load_config(overrides=["runtime.threads=0", "runtime.keep_freed_memory=false"]).runtime
    )
    # threads=0 keeps torch's count; the allocator is left alone when asked
    assert calls == [1, True]
    monkeypatch.undo()
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert runtime.keep_freed_memory()  # mallopt accepted both settings
