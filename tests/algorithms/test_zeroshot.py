"""Zero-shot FL with new classes: every equation on a hand case, the scenario, the registration, the
driver's run directory and exact resume, the CLI, and the errors."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

from fedac.algorithms.zeroshot import (
    alpha_update,
    beta_aggregate,
    choose_num_new,
    class_similarity,
    dirichlet_targets,
    group_new_classes,
    labelled_accuracy,
    merge_impressions,
    synthesize_impressions,
)
from fedac.config import load_config
from fedac.data.gsc import WORDS_10
from fedac.data.streams import NEW_ID, build_scenario
from fedac.engine.execution import ExecutionPlan
from fedac.engine.state import plain
from fedac.errors import ConfigError, DatasetError
from fedac.models import build_model
from fedac.models.kws_cnn import KWS_CNN_SPECS, ChannelSoftmax
from gsc_fixture import make_gsc_tree

pytestmark = pytest.mark.usefixtures("one_thread")

# --- models --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(KWS_CNN_SPECS))
def test_kws_cnns_take_10x21_mfcc_and_expose_a_head(name):
    model = build_model(name, 10, 6)
    x = torch.randn(3, 10, 21)
    assert model(x).shape == (3, 6)
    assert model.embed(x).shape == (3, model.head.in_features)
    assert model(torch.randn(2, 10, 40)).shape == (2, 6)  # any clip length


def test_softmax_activation_is_over_channels_at_each_position():
    out = ChannelSoftmax()(torch.randn(2, 5, 4, 3))
    torch.testing.assert_close(out.sum(dim=1), torch.ones(2, 4, 3))
    assert (
        sum(isinstance(m, ChannelSoftmax) for m in build_model("cnn4_softmax", 10, 3).modules())
        == 4
    )
    assert not any(isinstance(m, ChannelSoftmax) for m in build_model("cnn3_relu", 10, 3).modules())


# --- Eq. 1, 2, 3 ---------------------------------------------------------------------------------


def test_eq1_class_similarity_on_a_hand_matrix():
    w = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    r = 1 / math.sqrt(2)
    torch.testing.assert_close(
        class_similarity(w), torch.tensor([[1, 0, r], [0, 1, r], [r, r, 1]], dtype=torch.float64)
    )


class Recording:
    """A numpy Generator that records the concentrations it is asked for."""

    def __init__(self, seed=0):
        self.rng, self.calls = np.random.default_rng(seed), []

    def dirichlet(self, alpha, size):
        self.calls.append((np.array(alpha), size))
        return self.rng.dirichlet(alpha, size)


def test_eq2_dirichlet_concentration_is_beta_times_minmax_row_plus_eps_split_in_halves():
    rng = Recording()
    y = dirichlet_targets(np.array([0.2, 1.0, -0.6]), 5, [1.0, 0.1], rng)
    (a1, n1), (a2, n2) = rng.calls
    np.testing.assert_allclose(a1, [0.5001, 1.0001, 0.0001])
    np.testing.assert_allclose(a2, [0.0501, 0.1001, 0.0001])
    assert (n1, n2) == (3, 2) and y.shape == (5, 3)
    np.testing.assert_allclose(y.sum(1), 1.0, rtol=1e-5)


def test_eq2_dirichlet_mean_follows_the_concentration_and_never_nan():
    y = dirichlet_targets(np.array([0.0, 0.5, 1.0]), 20000, [1.0], np.random.default_rng(1))
    a = np.array([0.0001, 0.5001, 1.0001])
    np.testing.assert_allclose(y.mean(0), a / a.sum(), atol=0.01)
    tiny = dirichlet_targets(np.array([0.0, 0.0, 1.0, 0.0]), 2000, [1e-6], np.random.default_rng(2))
    assert np.isfinite(tiny).all()
    np.testing.assert_allclose(tiny.sum(1), 1.0, rtol=1e-5)
    flat = dirichlet_targets(np.ones(4), 10, [1.0, 0.1], np.random.default_rng(3))  # a constant row
    assert np.isfinite(flat).all()


def test_eq3_impression_loss_falls_and_impressions_classify_as_their_target():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(6 * 5, 3))
    with torch.no_grad():
        model[1].weight.mul_(20)
    targets = torch.tensor(
        [[0.9, 0.05, 0.05], [0.05, 0.05, 0.9], [0.1, 0.8, 0.1], [0.9, 0.05, 0.05]]
    )
    x, losses = synthesize_impressions(
        model,
        targets,
        (6, 5),
        tau=20.0,
        lr=0.05,
        steps=200,
        batch=2,
        generator=torch.Generator().manual_seed(0),
    )
    assert x.shape == (4, 6, 5)
    assert losses[1] < losses[0] and losses[3] < losses[2]  # per batch: last step below the first
    assert model(x).argmax(1).tolist() == [0, 2, 1, 0]
    # re-normalised like real inputs
    torch.testing.assert_close(x.mean(2), torch.zeros(4, 6), atol=1e-5, rtol=0)
    assert all(p.requires_grad for p in model.parameters())  # the model is left as it was


# --- Choice 1: alpha and beta --------------------------------------------------------------------


def test_alpha_update_both_rules_on_a_hand_table():
    g = torch.tensor([[0.6, 0.0], [0.2, 0.0]])  # column 0 set in f_G, column 1 not yet
    f = torch.tensor([[0.5, 0.5], [1.0, 0.0]])
    is_set = torch.tensor([True, False])
    literal = alpha_update(g, f, 0.5, is_set, "literal")
    torch.testing.assert_close(literal, torch.tensor([[0.85, 0.25], [0.7, 0.0]]))
    normalized = alpha_update(g, f, 0.5, is_set, "normalized")
    torch.testing.assert_close(normalized, torch.tensor([[0.85 / 1.5, 0.5], [0.7 / 1.5, 0.0]]))
    with pytest.raises(ConfigError, match="zeroshot.score_rule"):
        alpha_update(g, f, 0.5, is_set, "sum")


def test_beta_aggregate_both_rules_with_an_overlapping_label():
    scores, is_set = torch.zeros(2, 4), torch.tensor([False, False, False, True])
    scores[:, 3] = torch.tensor([0.3, 0.3])  # nobody sends label 3: it keeps its value
    a = (torch.tensor([[0.8, 0.2], [0.4, 0.6]]), [0, 1], 0.75)
    b = (torch.tensor([[0.1, 0.9], [0.5, 0.5]]), [1, 2], 0.25)
    literal, set_l = beta_aggregate(scores, is_set, [a, b], "literal")
    # label 0 and 2: one sender, beta = 1; label 1: beta = acc, 0.75 * a + 0.25 * b
    expected = torch.tensor(
        [[0.8, 0.75 * 0.2 + 0.25 * 0.1, 0.9, 0.3], [0.4, 0.75 * 0.6 + 0.25 * 0.5, 0.5, 0.3]]
    )
    torch.testing.assert_close(literal, expected)
    assert set_l.tolist() == [True, True, True, True]
    normalized, _ = beta_aggregate(scores, is_set, [a, b], "normalized")
    torch.testing.assert_close(normalized, expected)  # weights 0.75 + 0.25 sum to 1 here
    c = (torch.tensor([[0.2], [0.2]]), [1], 0.5)
    lit3, _ = beta_aggregate(scores, is_set, [a, b, c], "literal")
    nor3, _ = beta_aggregate(scores, is_set, [a, b, c], "normalized")
    col = (
        0.75 * torch.tensor([0.2, 0.6])
        + 0.25 * torch.tensor([0.1, 0.5])
        + 0.5 * torch.tensor([0.2, 0.2])
    )
    torch.testing.assert_close(lit3[:, 1], col)
    torch.testing.assert_close(nor3[:, 1], col / 1.5)


def test_labelled_accuracy_uses_only_rows_and_columns_of_the_labels():
    scores = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.0, 1.0]])
    truth = torch.tensor([2, 5, 5, 7])  # the row of label 7 is not the user's
    assert labelled_accuracy(scores, truth, [2, 5]) == pytest.approx(2 / 3)


# --- grouping ------------------------------------------------------------------------------------


def blobs(centres, n=15, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(c, 0.2, size=(n, 2)) for c in centres]


def test_grouping_separated_blobs_without_and_with_an_anchor():
    reports = blobs([[0, 0], [0.1, 0], [5, 5]])
    points, owner = np.concatenate(reports), np.repeat([0, 1, 2], 15)
    labels, _ = group_new_classes(points, owner, np.zeros((0, 2)), np.zeros(0, dtype=int), 2, 8)
    assert labels == [8, 8, 9]
    # A repeat report: blob (5, 5) was registered earlier as label 8; a new blob appears at (-5, 5).
    anchor = blobs([[5, 5]], seed=1)[0]
    repeat = np.concatenate(blobs([[5.1, 5], [-5, 5]], seed=2))
    labels, cluster = group_new_classes(repeat, np.repeat([0, 1], 15), anchor, np.full(15, 8), 1, 9)
    assert labels == [8, 9]
    # anchors last
    assert len(cluster) == 45 and set(cluster[:15]) == set(cluster[30:]) != set(cluster[15:30])
    assert choose_num_new(points, np.zeros((0, 2)), np.zeros(0, dtype=int), 3) == 2


# --- scenario ------------------------------------------------------------------------------------


def test_presets_follow_tables_1_and_2():
    hom = build_scenario("speech_commands", "homogeneous", 1.0, 0)
    assert (hom.users, hom.rounds, hom.public_per_class, hom.draw) == (
        ["u1", "u2", "u3"],
        10,
        300,
        (200, 300),
    )
    assert [(i.user, i.round, i.cls, i.size) for i in hom.injections] == [
        ("u1", 4, 8, 400),
        ("u2", 4, 8, 400),
        ("u1", 8, 8, 500),
        ("u2", 8, 9, 500),
    ]
    assert hom.labels["u2"] == [2, 3, 4, 5] and hom.architecture("u3", 10) == "dscnn3_relu"
    het = build_scenario("urbansound8k", "heterogeneous", 1.0, 0)
    assert len(het.users) == 10 and het.rounds == 30 and het.public_per_class == 50
    assert np.bincount([c for ls in het.labels.values() for c in ls], minlength=8).min() >= 2
    assert [het.architecture("u1", r) for r in (5, 6, 7, 8, 30)] == [
        "cnn2_softmax",
        "ann3_relu",
        "ann3_relu",
        "cnn1_softmax",
        "cnn1_softmax",
    ]
    assert (
        het.architecture("u2", 4) == "cnn3_softmax" and het.architecture("u3", 5) == "cnn4_softmax"
    )
    assert {(i.user, i.round) for i in het.injections} == {
        ("u2", 4),
        ("u2", 6),
        ("u4", 3),
        ("u4", 7),
        ("u6", 3),
        ("u6", 5),
        ("u9", 4),
    }
    assert build_scenario("speech_commands", "homogeneous", 0.25, 0).injections[2].size == 125
    with pytest.raises(ConfigError, match="zeroshot.scenario must be homogeneous or heterogeneous"):
        build_scenario("speech_commands", "mixed", 1.0, 0)
    with pytest.raises(ConfigError, match="not 'iemocap'"):
        build_scenario("iemocap", "homogeneous", 1.0, 0)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """Speech Commands tones: every word with one clip per speaker, the 10 task words with six."""
    root = tmp_path_factory.mktemp("zs_gsc")
    make_gsc_tree(root, speakers=8, clips=1)
    return make_gsc_tree(root, speakers=8, words=WORDS_10, clips=6)


def tiny(tree, tmp, *extra):
    """The homogeneous scenario shrunk to seconds: 5% of the counts, short impression synthesis."""
    return load_config(
        overrides=[
            "algorithm=zeroshot",
            f"data.root={tree}",
            f"data.cache_dir={tmp}",
            "zeroshot.scale=0.05",
            "zeroshot.rounds=5",
            "zeroshot.di_steps=20",
            "zeroshot.di_per_class=10",
            "train.local_epochs=2",
            *extra,
        ]
    )


@pytest.fixture(scope="module")
def runner_factory(tree, tmp_path_factory):
    from fedac.engine.zeroshot import ZeroShotDriver

    cache = tmp_path_factory.mktemp("zs_cache")
    return lambda out, *extra: ZeroShotDriver(tiny(tree, cache, *extra), out, progress=False)


def test_stream_counts_and_hidden_truth(runner_factory, tmp_path):
    runner = runner_factory(tmp_path)
    stream, scenario = runner.stream, runner.scenario
    assert scenario.public_per_class == 15 and scenario.draw == (10, 15)
    assert np.bincount(stream.public_labels).tolist() == [15] * 8
    assert not set(stream.public) & {c for pool in stream.pools.values() for c in pool}
    for user in scenario.users:
        for r in (1, 4, 8):
            clips, ids = stream.draw(user, r)
            counts = {i: ids.count(i) for i in set(ids)}
            injected = {
                stream.local_id(i): i.size
                for i in scenario.injections
                if i.user == user and i.round == r
            }
            for i, n in counts.items():
                # an injection, or a regular draw
                assert n == injected[i] if i in injected else 10 <= n <= 15
                assert i >= NEW_ID or i in scenario.labels[user]
            assert set(injected) <= set(counts)
            assert not {8, 9} & set(ids)  # new classes never arrive under their true ids
    # u1's stop of round 4 streams on in later rounds under its local id; round 8 brings a fresh
    # local id
    assert (
        1000 in stream.draw("u1", 5)[1]
        and 1001 in stream.draw("u1", 8)[1]
        and 1000 not in stream.draw("u1", 8)[1]
    )
    assert stream.truth == {("u1", 1000): 8, ("u2", 1000): 8, ("u1", 1001): 8, ("u2", 1001): 9}
    data = runner.client_data("u2", 4)
    assert data.architecture == "cnn3_relu" and set(data.y.tolist()) == {2, 3, 4, 5, 1000}


def test_too_few_clips_names_the_class_and_the_fix(tree, tmp_path):
    from fedac.data.registry import load_manifest
    from fedac.data.streams import build_stream

    cfg = tiny(tree, tmp_path, "zeroshot.scale=1.0")
    with pytest.raises(DatasetError, match=r"too few training clips.*yes.*Lower zeroshot.scale"):
        build_stream(cfg, load_manifest(cfg, progress=False))


# --- the driver ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def full_run(runner_factory, tmp_path_factory):
    out = tmp_path_factory.mktemp("zs_full")
    runner = runner_factory(out)
    return runner, runner.run(), out


def test_run_directory_per_user_columns_and_registration(full_run):
    runner, results, out = full_run
    assert {p.name for p in out.iterdir()} >= {
        "config.yaml",
        "metrics.csv",
        "results.json",
        "checkpoint.pt",
    }
    header = (out / "metrics.csv").read_text().splitlines()[0].split(",")
    for user in ("u1", "u2", "u3"):
        assert {f"local_acc/{user}", f"global_acc/{user}", f"increase/{user}"} <= set(header)
    assert {
        "test_accuracy_old",
        "test_accuracy_new",
        "ari",
        "registration_correct",
        "di_seconds",
    } <= set(header)
    history = results["history"]
    assert [r["reports"] for r in history] == [0, 0, 0, 2, 0]  # u1 and u2 report stop in round 4
    assert results["final"]["labels"] == 9  # both reports are one new label (oracle l_new = 1)
    assert history[3]["registration_correct"] == 1.0
    assert json.loads((out / "results.json").read_text())["final"]["labels"] == 9
    # the path its users trained on is named, as every run's results.json does
    assert results["execution"] == ExecutionPlan(runner.algorithm).path and results[
        "execution"
    ].startswith("sequential: ")
    # the checkpoint holds the server as a plain dict (engine/state.py), the run the typed state
    server = torch.load(out / "checkpoint.pt", weights_only=False)["server"]
    kept = plain(runner.state.server)
    assert type(server) is dict and server.keys() == kept.keys()
    assert all(torch.equal(v, kept[k]) for k, v in server.items() if isinstance(v, torch.Tensor))
    assert type(runner.state.server).__name__ == "ZeroShotServer"
    assert server["registry"] == {("u1", 1000): 8, ("u2", 1000): 8}
    assert server["scores"].shape == (len(runner.algorithm.eval_x) + len(server["public_y"]), 9)
    assert int(server["public_di"].sum()) == 10 and set(
        server["public_y"][server["public_di"]].tolist()
    ) == {8}


def test_resume_after_a_kill_gives_the_uninterrupted_numbers(full_run, runner_factory, tmp_path):
    from fedac.algorithms.zeroshot import ZeroShotServer

    _, results, _ = full_run
    assert runner_factory(tmp_path).run(stop_after=3) is None
    # resumed from the checkpoint's dict form, the run's state typed again
    assert type(torch.load(tmp_path / "checkpoint.pt", weights_only=False)["server"]) is dict
    runner = runner_factory(tmp_path)
    resumed = runner.run(resume=True)
    assert isinstance(runner.state.server, ZeroShotServer)
    assert resumed["resumed_from"] == 3 and resumed["rounds_trained"] == 2
    drop = {"wall_seconds", "di_seconds", "di_seconds_per_class"}
    strip = lambda rows: [{k: v for k, v in r.items() if k not in drop} for r in rows]  # noqa: E731
    assert strip(resumed["history"]) == strip(results["history"])


def test_choice2_off_drops_new_classes(runner_factory, tmp_path):
    results = runner_factory(tmp_path, "zeroshot.choice2=false", "zeroshot.rounds=4").run()
    assert [r["reports"] for r in results["history"]] == [0, 0, 0, 0] and results["final"][
        "labels"
    ] == 8


def test_cli_runs_zeroshot_and_refuses_unknown_scenario(tree, tmp_path, capsys):
    from fedac.cli import main

    args = [
        "run",
        "--algorithm",
        "zeroshot",
        "--quiet",
        "--out",
        str(tmp_path / "run"),
        "--set",
        f"data.root={tree}",
        "--set",
        f"data.cache_dir={tmp_path}",
        "--set",
        "zeroshot.scale=0.05",
        "--set",
        "zeroshot.rounds=1",
        "--set",
        "train.local_epochs=1",
    ]
    assert main(args) == 0
    assert "D0: local / global / increase" in capsys.readouterr().out
    assert (tmp_path / "run" / "results.json").is_file()
    assert (
        main([*args[:-10], "--set", f"data.root={tree}", "--set", "zeroshot.scenario=mixed"]) == 2
    )
    assert "zeroshot.scenario must be homogeneous or heterogeneous" in capsys.readouterr().err
    # Settings of the weight-averaging runtimes are refused, not silently ignored.
    assert main([*args[:-10], "--set", f"data.root={tree}", "--set", "attack.kind=sign_flip"]) == 2
    assert "attack.kind=sign_flip does not apply to --algorithm zeroshot" in capsys.readouterr().err


def test_reproduce_writes_tables_and_completes_a_killed_grid(tree, tmp_path, capsys):
    from fedac.cli import main

    args = [
        "reproduce",
        "zeroshot-table3",
        "--datasets",
        "speech_commands",
        "--seeds",
        "0",
        "--rounds",
        "2",
        "--quiet",
        "--out",
        str(tmp_path),
        "--set",
        f"data.root={tree}",
        "--set",
        f"data.cache_dir={tmp_path}",
        "--set",
        "zeroshot.scale=0.05",
        "--set",
        "train.local_epochs=1",
    ]
    assert main(args) == 0
    table = (tmp_path / "table.md").read_text()
    assert (
        "| u1 |" in table
        and "test acc. old" in table
        and "Command: `fedac reproduce zeroshot-table3" in table
    )
    assert (tmp_path / "figure.png").is_file() and (
        tmp_path / "speech_commands-s0" / "results.json"
    ).is_file()
    rows = (tmp_path / "results.csv").read_text().splitlines()
    assert len(rows) == 2 and rows[1].startswith("speech_commands,0,")
    summary = json.loads((tmp_path / "summary.json").read_text())["speech_commands"]
    assert summary["n"] == 1 and summary["accuracy"]["std"] == 0.0
    capsys.readouterr()
    assert main(args) == 0  # a second call reads the finished run back
    assert "1 runs in" in capsys.readouterr().out
    assert main([*args[:2], "--datasets", "iemocap", "--quiet"]) == 2


def test_merge_impressions_mean_pairs_by_index_and_concat_keeps_all():
    # two impressions of one coefficient x two frames
    a = torch.tensor([[[1.0, 3.0]], [[0.0, 2.0]]])
    b = torch.tensor([[[3.0, 1.0]], [[2.0, 8.0]]])
    merged = merge_impressions([a, b], "mean")  # means [2, 2] and [1, 5], then z-scored over time
    torch.testing.assert_close(
        merged, torch.tensor([[[0.0, 0.0]], [[-1.0, 1.0]]]), atol=1e-4, rtol=0
    )
    assert merge_impressions([a], "mean") is a
    assert merge_impressions([a, b], "concat").shape == (4, 1, 2)
    with pytest.raises(ConfigError, match="zeroshot.di_merge"):
        merge_impressions([a], "sum")


def test_eq3_temperature_and_steps_change_the_impressions():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 2))
    y = torch.tensor([[0.9, 0.1]])
    run = lambda tau, steps: synthesize_impressions(
        model,
        y,
        (3, 4),
        tau,
        0.05,
        steps,
        1,  # noqa: E731
        torch.Generator().manual_seed(0),
    )
    (x20, l20), (x1, l1), (x5, _) = run(20.0, 10), run(1.0, 10), run(20.0, 5)
    assert l20[0] != l1[0] and not torch.equal(x20, x1) and not torch.equal(x20, x5)
    slow, _ = synthesize_impressions(
        model, y, (3, 4), 20.0, 0.001, 10, 1, torch.Generator().manual_seed(0)
    )
    assert not torch.equal(x20, slow)  # the Adam step (di_lr)


def test_optimizer_setting_picks_adam_or_local_sgd(tree, tmp_path):
    from fedac.algorithms import build_algorithm
    from fedac.algorithms.base import Task

    model = nn.Linear(2, 2)
    adam = build_algorithm(tiny(tree, tmp_path), Task(10, 8, ["u1"]))
    sgd = build_algorithm(tiny(tree, tmp_path, "zeroshot.optimizer=sgd"), Task(10, 8, ["u1"]))
    assert isinstance(adam._optimizer(model), torch.optim.Adam) and sgd._optimizer(model) is None
    for bad, message in (
        ("zeroshot.optimizer=lbfgs", "zeroshot.optimizer must be adam or sgd, got 'lbfgs'"),
        ("zeroshot.num_new=guess", "zeroshot.num_new must be oracle or auto"),
        ("zeroshot.di_merge=sum", "zeroshot.di_merge must be mean or concat"),
        ("zeroshot.di_betas=1.0,0", r"zeroshot.di_betas must hold numbers > 0, got \[1.0, 0.0\]"),
    ):
        with pytest.raises(ConfigError, match=message):
            build_algorithm(tiny(tree, tmp_path, bad), Task(10, 8, ["u1"]))


def test_scale_zero_picks_the_largest_scale_the_pools_allow(tree, tmp_path):
    from fedac.data.registry import load_manifest
    from fedac.data.streams import auto_scale, build_stream

    cfg = tiny(tree, tmp_path, "zeroshot.scale=0")
    manifest = load_manifest(cfg, progress=False)
    # 36 training clips per word: old words need D0 300 + a draw of 300, new ones an injection of
    # 500
    assert auto_scale("speech_commands", manifest) == pytest.approx(36 / 600)
    stream = build_stream(cfg, manifest)
    assert stream.scenario.scale == pytest.approx(0.06) and stream.scenario.public_per_class == 18


@pytest.mark.slow
def test_heterogeneous_round_3_registers_two_different_classes(runner_factory, tmp_path):
    """u4 reports go and u6 stop in round 3: two clusters, two new labels, each report right; the
    round's impressions are saved and Fig. 3 / Fig. 4 drawn from them."""
    from fedac.experiments.zeroshot import impression_rounds, plot_impressions

    runner = runner_factory(
        tmp_path, "zeroshot.scenario=heterogeneous", "zeroshot.rounds=3", "zeroshot.di_steps=100"
    )
    assert len(runner.scenario.users) == 10
    results = runner.run()
    (saved,) = impression_rounds(tmp_path)
    assert (
        saved["round"] == 3
        and sorted(saved["truth"]) == [8, 9]
        and saved["points"].shape == (20, 10 * 21)
    )
    assert {k[0] for k in saved["similarity"]} == {"u4", "u6"} and saved["similarity"][
        ("u4", 1000)
    ].shape == (9, 9)
    assert plot_impressions(tmp_path, {"speech_commands": [{"run_dir": str(tmp_path)}]}) == [
        "fig3.png",
        "fig4.png",
    ]
    last = results["history"][-1]
    assert (
        last["reports"] == 2
        and last["labels"] == 10
        and last["ari"] == 1.0
        and last["registration_correct"] == 1.0
    )
    # the reporters send no scores
    assert {f"local_acc/u{i}" for i in (1, 2, 3, 5, 7, 8, 9, 10)} <= set(last)
    assert "local_acc/u4" not in last and "local_acc/u6" not in last


# --- batched impression synthesis and zeroshot.identity ------------------------------------------


def one_batch_at_a_time(model, targets, shape, tau, lr, steps, batch, generator):
    """Eq. 3 written out as the paper runs it: each batch optimised alone on its mean loss (the
    reference the batched path must equal)."""
    model.eval()
    out, losses = [], []
    for y in targets.split(batch):
        x = torch.randn((len(y), *shape), generator=generator)
        x = (
            (x - x.mean(2, keepdim=True)) / (x.std(2, keepdim=True, unbiased=False) + 1e-5)
        ).requires_grad_()
        optimizer = torch.optim.Adam([x], lr=lr)
        for step in range(steps):
            loss = -(y * torch.log_softmax(model(x) / tau, dim=1)).sum(1).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                x.copy_(
                    (x - x.mean(2, keepdim=True)) / (x.std(2, keepdim=True, unbiased=False) + 1e-5)
                )
            if step in (0, steps - 1):
                losses.append(float(loss.detach()))
        out.append(x.detach())
    return torch.cat(out), losses


def test_batched_impressions_equal_the_one_batch_at_a_time_reference():
    torch.manual_seed(0)
    model = build_model("cnn2_softmax", 6, 4)
    targets = torch.from_numpy(
        dirichlet_targets(np.array([0.2, 0.9, 0.1, 1.0]), 7, [1.0, 0.1], np.random.default_rng(0))
    )
    args = (targets, (6, 9), 20.0, 0.05, 30, 3)  # batches of 3, 3 and 1
    x, losses = synthesize_impressions(model, *args, torch.Generator().manual_seed(4))
    ref, ref_losses = one_batch_at_a_time(model, *args, torch.Generator().manual_seed(4))
    torch.testing.assert_close(x, ref, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    assert len(losses) == 6 and losses[1] < losses[0]
    assert not torch.equal(
        x, synthesize_impressions(model, *args[:-1], 7, torch.Generator().manual_seed(4))[0]
    )


def zeroshot_algorithm(*overrides, K=8):
    from fedac.algorithms.base import Task
    from fedac.algorithms.zeroshot import SharedRows, ZeroShotFL

    cfg = load_config(
        overrides=[
            "algorithm=zeroshot",
            "zeroshot.di_steps=6",
            "zeroshot.di_per_class=5",
            "zeroshot.di_batch=3",
            *overrides,
        ]
    )
    g = torch.Generator().manual_seed(0)
    public_y = torch.arange(K).repeat(2)
    rows = SharedRows(
        torch.randn(len(public_y), 6, 9, generator=g), public_y, torch.randn(4, 6, 9, generator=g)
    )
    return ZeroShotFL(cfg, Task(6, K, ["u1", "u2", "u3"]), rows=rows)


def report(user, arch, new, names=None, K=8, seed=0):
    from fedac.algorithms.base import model_params
    from fedac.algorithms.zeroshot import ClassReport

    torch.manual_seed(seed)
    model = build_model(arch, 6, K + len(new))
    return ClassReport(user, arch, model_params(model), K, new, names or [None] * len(new))


def test_a_report_optimises_all_its_classes_at_once_each_from_its_own_seed():
    from fedac.seeding import numpy_rng, torch_generator

    alg = zeroshot_algorithm()
    up = report("u1", "cnn1_softmax", [1000, 1001])
    xs, consistency, similarity = alg._impressions(up, 4)
    model = build_model("cnn1_softmax", 6, 10)
    model.load_state_dict(up.state)
    for j, local_id in enumerate((1000, 1001)):  # the old path: one synthesis per class
        rng = numpy_rng(0, "zeroshot-dirichlet", 4, "u1", local_id)
        targets = torch.from_numpy(dirichlet_targets(similarity[8 + j].numpy(), 5, [1.0, 0.1], rng))
        gen = torch_generator(0, "zeroshot-impressions", 4, "u1", local_id)
        ref, _ = one_batch_at_a_time(model, targets, (6, 9), 20.0, 0.01, 6, 3, gen)
        torch.testing.assert_close(xs[j], ref, atol=1e-5, rtol=1e-5)
    hits = sum(int((model(x).argmax(1) == 8 + j).sum()) for j, x in enumerate(xs))
    assert consistency == hits / 10


def test_reports_on_worker_threads_give_the_same_impressions(monkeypatch):
    import threading

    ups = [report("u1", "cnn1_softmax", [1000], seed=1), report("u2", "cnn3_relu", [1000], seed=2)]
    alg = zeroshot_algorithm()
    one = alg.synthesize_reports(ups, 4, workers=1)
    threads = set()
    original = alg._impressions
    # passes only if the two reports run at the same time
    both_inside = threading.Barrier(2, timeout=60)

    def on_a_worker(report, round_idx):
        threads.add(threading.current_thread().name)
        both_inside.wait()  # (on a busy host one thread could otherwise take both reports in turn)
        return original(report, round_idx)

    monkeypatch.setattr(alg, "_impressions", on_a_worker)
    two = alg.synthesize_reports(ups, 4, workers=2)
    assert len(threads) == 2 and all(t.startswith("fedac-impressions") for t in threads)
    for (xa, ca, sa), (xb, cb, sb) in zip(one, two):
        assert all(torch.equal(a, b) for a, b in zip(xa, xb)) and ca == cb and torch.equal(sa, sb)


def test_labels_by_name_on_a_hand_case():
    from fedac.algorithms.zeroshot import labels_by_name

    assert labels_by_name(["go", "stop", "go", "siren"], {"stop": 8}, 9) == (
        [9, 8, 9, 10],
        {"stop": 8, "go": 9, "siren": 10},
    )
    assert labels_by_name([], {}, 8) == ([], {})


def test_identity_reported_gives_one_label_per_name_where_anonymous_clusters():
    ups = [
        report("u1", "cnn1_softmax", [1000], ["stop"], seed=1),
        report("u2", "cnn1_softmax", [1000], ["go"], seed=1),
    ]
    anonymous = zeroshot_algorithm()
    # one truly new class said the oracle: one cluster, one label for both
    server = anonymous.update(anonymous.init_server(), [(u, 1) for u in ups], 4, num_new=1).server
    assert server.registry == {("u1", 1000): 8, ("u2", 1000): 8} and server.names == {}
    reported = zeroshot_algorithm("zeroshot.identity=reported")
    # (ignored: the names decide)
    step = reported.update(reported.init_server(), [(u, 1) for u in ups], 4, num_new=1)
    server, metrics = step.server, step.metrics
    assert server.registry == {("u1", 1000): 8, ("u2", 1000): 9} and server.names == {
        "stop": 8,
        "go": 9,
    }
    assert metrics["new_labels"] == 2 and server.scores.shape[1] == 10
    assert len(step.grouping.cluster) == 10  # the clustering is kept as a diagnostic
    # A later report of a registered name takes its label; its impressions join D0 under it.
    later = report("u3", "cnn3_relu", [1000], ["stop"], K=10, seed=3)
    server, _ = reported.server_update(server, [(later, 1)], 8)
    assert server.registry[("u3", 1000)] == 8 and server.scores.shape[1] == 10
    assert server.public_y[server.public_di].tolist().count(8) == 10


def test_the_oracle_count_is_an_argument_and_the_grouping_a_return_value():
    ups = [
        report("u1", "cnn1_softmax", [1000], seed=1),
        report("u2", "cnn1_softmax", [1000], seed=1),
    ]
    alg = zeroshot_algorithm()
    with pytest.raises(
        ConfigError, match=r"num_new=oracle: a round with reports needs the driver's count"
    ):
        # the contract's form has no count
        alg.server_update(alg.init_server(), [(u, 1) for u in ups], 4)
    one, two = (alg.update(alg.init_server(), [(u, 1) for u in ups], 4, num_new=n) for n in (1, 2))
    assert set(one.server.registry.values()) == {8} and set(two.server.registry.values()) == {
        8,
        9,
    }
    assert one.grouping.keys == [("u1", 1000), ("u2", 1000)] and one.grouping.labels == [8, 8]
    assert alg.update(one.server, [], 5).grouping is None  # a round without reports groups nothing
    with pytest.raises(ConfigError, match="SharedRows"):
        algorithm_without_rows().init_server()


def test_restore_server_rebuilds_a_saved_dict_and_refuses_another_form():
    from fedac.algorithms.zeroshot import ZeroShotServer
    from fedac.errors import CheckpointError

    alg = zeroshot_algorithm()
    step = alg.update(alg.init_server(), [(report("u1", "cnn1_softmax", [1000]), 1)], 4, num_new=1)
    server = step.server
    assert alg.restore_server(server) is server
    saved = plain(server)
    assert type(saved) is dict and saved["registry"] == {("u1", 1000): 8}
    restored = alg.restore_server(saved)
    assert isinstance(restored, ZeroShotServer) and restored.registry == server.registry
    assert all(torch.equal(getattr(restored, k), v) for k, v in saved.items() if k.startswith("p"))
    # a dict from before zeroshot.identity=reported has no names
    assert alg.restore_server({k: v for k, v in saved.items() if k != "names"}).names == {}
    with pytest.raises(
        CheckpointError, match=r"unknown entries \['params'\] and lacks \['scores'\]"
    ):
        alg.restore_server({**{k: v for k, v in saved.items() if k != "scores"}, "params": {}})
    with pytest.raises(CheckpointError, match="server state is a list, not a dict"):
        alg.restore_server([saved])


def test_a_non_finite_value_in_either_upload_is_caught():
    """The driver discards an upload `all_finite` rejects; the uploads are dataclasses."""
    from fedac.algorithms.zeroshot import ScoreUpload
    from fedac.training.types import all_finite

    good = ScoreUpload("u1", [0, 2], torch.rand(5, 2), 0.5)
    up = report("u1", "cnn1_softmax", [1000])
    assert all_finite(good) and all_finite(up)
    table = good.scores.clone()
    table[3, 1] = float("nan")
    assert not all_finite(ScoreUpload("u1", [0, 2], table, 0.5))
    assert not all_finite(ScoreUpload("u1", [0, 2], good.scores, float("inf")))
    weights = dict(up.state)
    name = next(iter(weights))
    weights[name] = weights[name].clone().fill_(float("nan"))
    assert not all_finite(replace(up, state=weights))


def algorithm_without_rows():
    from fedac.algorithms.base import Task
    from fedac.algorithms.zeroshot import ZeroShotFL

    return ZeroShotFL(load_config(overrides=["algorithm=zeroshot"]), Task(6, 8, ["u1"]))


def test_identity_reported_needs_names_and_a_known_mode():
    alg = zeroshot_algorithm("zeroshot.identity=reported")
    with pytest.raises(
        ConfigError, match=r"u1's report of local class 1000 names no class.*identity=anonymous"
    ):
        alg.server_update(alg.init_server(), [(report("u1", "cnn1_softmax", [1000]), 1)], 4)
    with pytest.raises(
        ConfigError, match="zeroshot.identity must be anonymous or reported, got 'named'"
    ):
        zeroshot_algorithm("zeroshot.identity=named")


def test_the_driver_names_new_classes_only_under_identity_reported(runner_factory, tmp_path):
    # anonymous: the truth stays hidden
    assert runner_factory(tmp_path / "a").client_data("u2", 4).names == {}
    reported = runner_factory(tmp_path / "r", "zeroshot.identity=reported")
    assert reported.client_data("u2", 4).names == {1000: "stop"}
    assert reported.client_data("u1", 5).names == {1000: "stop"}  # round 4's stop streams on
    # round 8's stop replaces that draw
    assert reported.client_data("u1", 8).names == {1001: "stop"}
    assert reported.client_data("u2", 8).names == {1000: "stop", 1001: "go"}
    # The engine's train.cohort_workers sets the threads that synthesise several reports at once.
    assert [
        runner_factory(tmp_path / f"w{n}", f"train.cohort_workers={n}").algorithm.runtime.workers
        for n in (1, 2)
    ] == [1, 2]


# --- the CREMA-D variant -------------------------------------------------------------------------


def test_cremad_presets_keep_three_old_emotions_and_bring_ang():
    hom = build_scenario("cremad", "homogeneous", 1.0, 0)
    assert hom.classes == ["NEU", "HAP", "SAD", "ANG"] and hom.num_old == 3
    assert hom.labels == {"u1": [0, 1], "u2": [1, 2], "u3": [2, 0]}
    assert [(i.user, i.round, i.cls, i.size) for i in hom.injections] == [
        # round 8: a repeat of ANG
        ("u1", 4, 3, 50),
        ("u2", 4, 3, 50),
        ("u1", 8, 3, 50),
        ("u2", 8, 3, 50),
    ]
    assert hom.public_per_class == 50 and hom.draw == (40, 50)
    het = build_scenario("cremad", "heterogeneous", 1.0, 0)
    assert {len(het.labels[u]) for u in het.users[3:]} == {2} and {
        i.cls for i in het.injections
    } == {3}
    assert np.bincount([c for ls in het.labels.values() for c in ls], minlength=3).min() >= 2


@pytest.mark.slow
def test_cremad_variant_runs_from_the_cli_and_registers_ang(tmp_path, capsys):
    from fedac.cli import main
    from fedac.data.synth import emotions

    root = tmp_path / "crema"
    emotions.generate(root, actors=5, seed=0, progress=False, workers=1)
    out = tmp_path / "run"
    assert (
        main(
            [
                "run",
                "--algorithm",
                "zeroshot",
                "--dataset",
                "cremad",
                "--quiet",
                "--out",
                str(out),
                "--set",
                f"data.root={root}",
                "--set",
                f"data.cache_dir={tmp_path}",
                "--set",
                "zeroshot.scale=0.2",
                "--set",
                "zeroshot.rounds=4",
                "--set",
                "zeroshot.di_steps=5",
                "--set",
                "zeroshot.di_per_class=6",
                "--set",
                "train.local_epochs=1",
            ]
        )
        == 0
    )
    results = json.loads((out / "results.json").read_text())
    # u1 and u2 report ANG in round 4
    assert [r["reports"] for r in results["history"]] == [0, 0, 0, 2]
    assert results["final"]["labels"] == 4 and results["history"][3]["registration_correct"] == 1.0
    assert results["num_classes"] == 4 and "test_accuracy_new" in results["history"][3]
    assert "D0: local / global / increase" in capsys.readouterr().out
