"""FedKWS-UI (algorithms/fedkwsui.py): ALT's numbers and ALO's losses by hand, each setting by its
effect, one client update against a hand-written reference, persistence, aggregation, errors, resume
and the CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from fedac.algorithms import build_algorithm
from fedac.algorithms.base import ClientData, Task
from fedac.algorithms.fedkwsui import (
    TwoHeadModel,
    adaptive_mu,
    alo_loss,
    alt_ratio,
    alt_statistics,
    alt_steps,
    distillation_cross_entropy,
    smoothed_cross_entropy,
)
from fedac.cli import main
from fedac.config import load_config
from fedac.engine.simulator import Simulator
from fedac.errors import ConfigError
from fedac.models import build_model
from fedac.seeding import torch_generator
from helpers import tiny_run

pytestmark = pytest.mark.usefixtures("one_thread")
SKEWED, BALANCED = [2] * 10 + [0, 0], [10] * 12  # the spec's check cases, C = 12


def algorithm(counts=(SKEWED, BALANCED), dataset="speech_commands", features=8, **settings):
    # E = 50 (the paper's; fedkwsui's own default is 10) for the hand-computed step counts below
    settings = {
        "algorithm": "fedkwsui",
        "model.name": "crnn_tiny",
        "model.dropout": 0,
        "fedkwsui.local_steps": 50,
        **settings,
    }
    cfg = load_config(overrides=[f"{k}={v}" for k, v in settings.items()], dataset=dataset)
    task = Task(
        features, len(counts[0]), [f"c{i}" for i in range(len(counts))], [list(c) for c in counts]
    )
    return build_algorithm(cfg, task)


# --- ALT ------------------------------------------------------------------------------------------
def test_alt_numbers_by_hand():
    # w1 = 20/100 = 0.2; w2 = ln(10)/ln(12) = 0.926628; rbar = 2 * 0.2 * 0.926628 / 1.126628 =
    # 0.328992
    ratio = alt_ratio(SKEWED, 100)
    assert ratio == pytest.approx(0.328992, abs=1e-5)
    assert alt_steps(ratio, 3.5, 50) == 57  # floor(57.57)
    assert adaptive_mu(0.2, ratio) == pytest.approx(0.134202, abs=1e-5)
    # 12 equal counts of 10: w1 = 1, w2 = 1 - 2.4e-8 (the 1e-8 in the log), so floor(174.99...) =
    # 174
    assert alt_steps(alt_ratio(BALANCED, 100), 3.5, 50) == 174
    # no data / one class
    assert alt_ratio([0] * 12, 100) == 0.0 and alt_ratio([5] + [0] * 11, 100) == 0.0


def test_code_constants_on_speech_commands_and_paper_rules_elsewhere():
    code = algorithm()  # 12-class Speech Commands: cap 100, r0 3.5
    assert (code.size_cap, code.r0) == (100.0, 3.5)
    assert code.client_plan("c0")["steps"] == 57 and code.client_plan("c1")["steps"] == 174
    # Paper (Sec. 4): cap = max_j n_j = 120 -> rbar_0 = 2 (1/6) 0.926628 / 1.093295 = 0.282519,
    # rbar_1 = 1; r0 = K / sum rbar = 2 / 1.282519 = 1.559432 -> s = floor(22.03) = 22 and
    # floor(77.97) = 77.
    paper = algorithm(**{"fedkwsui.size_cap": "max", "fedkwsui.r0": "sum"})
    assert paper.size_cap == 120.0 and paper.r0 == pytest.approx(1.559432, abs=1e-5)
    assert paper.ratios["c0"] == pytest.approx(0.282519, abs=1e-5)
    assert [paper.client_plan(c)["steps"] for c in ("c0", "c1")] == [22, 77]
    assert (algorithm(dataset="cremad").size_cap, algorithm(dataset="cremad").r0) == (
        120.0,
        paper.r0,
    )
    assert algorithm(**{"fedkwsui.size_cap": 40, "fedkwsui.r0": 2}).client_plan("c0")[
        "steps"
    ] == math.floor(2 * alt_ratio(SKEWED, 40) * 50)


def test_alt_statistics_report_the_mean_steps_per_client():
    cfg = load_config(overrides=["fedkwsui.local_steps=50"], dataset="speech_commands")
    stats = alt_statistics(cfg, 12, ["c0", "c1", "empty"], [SKEWED, BALANCED, [0] * 12])
    # the empty client left out
    assert (stats["mean_steps"], stats["local_steps"]) == ((57 + 174) / 2, 50)
    # Sec. 4's rule: r0 = K / sum rbar makes the mean r0 rbar_k 1, so the mean steps are E less the
    # flooring
    cfg = load_config(
        overrides=["fedkwsui.local_steps=50", "fedkwsui.r0=sum"], dataset="speech_commands"
    )
    stats = alt_statistics(cfg, 12, ["c0", "c1"], [SKEWED, BALANCED])
    assert stats["mean"] == pytest.approx(1.0) and 49 <= stats["mean_steps"] <= 50


def test_alt_and_adaptive_mu_switches():
    # E for every client
    assert algorithm(**{"fedkwsui.alt": False}).client_plan("c0")["steps"] == 50
    assert algorithm(**{"fedkwsui.local_steps": 20}).client_plan("c0")["steps"] == math.floor(
        3.5 * 0.328992 * 20
    )
    # Eq. 1's constant
    assert algorithm(**{"fedkwsui.adaptive_mu": False}).client_plan("c0")["mu"] == 0.2
    assert algorithm(**{"fedkwsui.ls_mu": 0.5}).client_plan("c0")["mu"] == pytest.approx(
        0.5 * (1 - 0.328992), abs=1e-5
    )


# --- ALO ------------------------------------------------------------------------------------------
def test_alo_losses_by_hand():
    g = torch.log(torch.tensor([[1.0, 2.0, 3.0]]))  # softmax (1/6, 1/3, 1/2)
    p = torch.log(torch.tensor([[1.0, 1.0, 2.0]]))  # pi = (1/4, 1/4, 1/2)
    y = torch.tensor([2])
    ln2, ln3, ln6 = math.log(2), math.log(3), math.log(6)
    assert float(smoothed_cross_entropy(g, y, 0.0)) == pytest.approx(ln2)
    # mu = 0.3, C = 3: target (0.1, 0.1, 0.8)
    assert float(smoothed_cross_entropy(g, y, 0.3)) == pytest.approx(
        0.1 * ln6 + 0.1 * ln3 + 0.8 * ln2
    )
    ce_pi = 0.25 * ln6 + 0.25 * ln3 + 0.5 * ln2
    assert float(distillation_cross_entropy(g, p)) == pytest.approx(ce_pi)
    # Eq. 3 subtracts lambda times the distillation CE (negative distillation)
    assert float(alo_loss(g, p, y, 0.3, 0.001)) == pytest.approx(
        0.1 * ln6 + 0.1 * ln3 + 0.8 * ln2 - 0.001 * ce_pi
    )


def test_alo_gradient_pushes_away_from_the_private_prediction_and_not_into_it():
    g = torch.tensor([[0.3, -0.2, 1.0], [0.0, 0.5, -1.0]], requires_grad=True)
    p = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 1.0]], requires_grad=True)
    y = torch.tensor([2, 1])
    lam, mu = 0.5, 0.2
    alo_loss(g, p, y, mu, lam).backward()
    target = F.one_hot(y, 3) * (1 - mu) + mu / 3
    pi, q = p.detach().softmax(-1), g.detach().softmax(-1)
    # d/dg [CE(t, g) - lam CE(pi, g)] / B = ((q - t) - lam (q - pi)) / B
    assert torch.allclose(g.grad, ((q - target) - lam * (q - pi)) / 2, atol=1e-6)
    assert p.grad is None  # the private prediction is a detached target


def test_two_head_model_counts_and_forward():
    model = TwoHeadModel(build_model("dscnn", 40, 12), 12)
    shared = sum(
        p.numel() for name, p in model.named_parameters() if not name.startswith("private_")
    )
    assert shared == 204_412  # encoder + global head (spec, C = 12)
    # int(1.2 h), int(0.8 h)
    assert model.global_proj.out_features == 206 and model.private_proj.out_features == 137
    x = torch.randn(2, 8, 12)
    tiny = TwoHeadModel(build_model("crnn_tiny", 8, 4, 0.0), 4)
    assert torch.equal(tiny(x), tiny.global_logits(tiny.embed(x)))


# --- one client update against a hand-written reference ------------------------------------------
def client(n=12, features=8, frames=10, classes=12, name="c0", seed=0):
    gen = torch.Generator().manual_seed(seed)
    x, y = (
        torch.randn(n, features, frames, generator=gen),
        torch.randint(0, classes, (n,), generator=gen),
    )
    return ClientData(name, x, y, x[:0], y[:0])


def reference_update(algo, payload, data, seed, private_steps, global_steps, mu, lam):
    """Plain SGD (lr, no momentum / decay / clipping) written out: private phase on the private head
    alone, then Eq. 3 on everything; batches from the same cycling generator."""
    model = TwoHeadModel(build_model("crnn_tiny", 8, 12, 0.0), 12)
    model.load_state_dict(payload)
    model.train()
    lr, batch = algo.cfg.train.lr, algo.cfg.train.batch_size
    gen = torch_generator(seed, "test")

    def batches(steps):
        out = []
        while len(out) < steps:
            out += list(torch.randperm(data.num_samples, generator=gen).split(batch))
        return out[:steps]

    private = [p for n, p in model.named_parameters() if n.startswith("private_")]
    for idx in batches(private_steps):
        loss = F.cross_entropy(model.private_logits(model.embed(data.x[idx])), data.y[idx])
        grads = torch.autograd.grad(loss, private)
        with torch.no_grad():
            for p, gr in zip(private, grads):
                p -= lr * gr
    params = list(model.parameters())
    for idx in batches(global_steps):
        h = model.embed(data.x[idx])
        g, pr = model.global_logits(h), model.private_logits(h).detach()
        target = F.one_hot(data.y[idx], 12) * (1 - mu) + mu / 12
        ls = -(target * g.log_softmax(-1)).sum(-1).mean()
        adv = -(pr.softmax(-1) * g.log_softmax(-1)).sum(-1).mean()
        grads = torch.autograd.grad(ls - lam * adv, params, allow_unused=True)
        with torch.no_grad():
            for p, gr in zip(params, grads):
                if gr is not None:
                    p -= lr * gr
    return model.state_dict()


def test_client_update_matches_a_hand_written_reference():
    algo = algorithm(
        **{
            "train.momentum": 0,
            "train.batch_size": 5,
            "train.lr": 0.05,
            "train.max_grad_norm": 0,
            "fedkwsui.local_steps": 4,
            "fedkwsui.adv_lambda": 0.3,
            "fedkwsui.private_ratio": 0.5,
        }
    )
    payload = algo.init_server()["params"]
    data = client()
    plan = algo.client_plan("c0")  # s = floor(3.5 * 0.328992 * 4) = 4
    assert plan["steps"] == 4
    result = algo.client_update(payload, None, data, 1, torch_generator(0, "test"))
    # int(0.5 * 4) + 1 = 3
    expected = reference_update(algo, payload, data, 0, 3, 4, plan["mu"], 0.3)
    assert result.metrics["steps"] == 4.0
    for name, value in expected.items():
        assert torch.allclose(result.upload[name], value, atol=1e-5), name
    # The reference reproduces only this pairing: a flipped lambda sign gives other numbers.
    flipped = reference_update(algo, payload, data, 0, 3, 4, plan["mu"], -0.3)
    assert not torch.allclose(
        result.upload["global_head.weight"], flipped["global_head.weight"], atol=1e-5
    )


def test_private_phase_trains_the_private_head_alone_and_lambda_zero_skips_it():
    settings = {"fedkwsui.r0": 0.001}  # s_k = 0: only the private phase runs
    algo = algorithm(**settings)
    payload = algo.init_server()["params"]
    result = algo.client_update(payload, None, client(), 1, torch_generator(0, "t"))
    assert result.metrics["steps"] == 0.0
    changed = {k for k in payload if not torch.equal(payload[k], result.upload[k])}
    assert changed and all(k.startswith("private_") for k in changed)
    off = algorithm(**settings, **{"fedkwsui.adv_lambda": 0})
    same = off.client_update(payload, None, client(), 1, torch_generator(0, "t")).upload
    assert all(torch.equal(payload[k], same[k]) for k in payload)


def test_private_ratio_and_g_ratio_settings():
    payload = algorithm().init_server()["params"]
    for ratio, steps in ((0.2, 11), (0.5, 26)):  # floor(ratio * 50) + 1
        algo = algorithm(**{"fedkwsui.private_ratio": ratio, "fedkwsui.r0": 0.001})
        assert (
            algo.client_update(payload, None, client(), 1, torch_generator(0, "t")).metrics[
                "private_steps"
            ]
            == steps
        )
    model = algorithm(**{"fedkwsui.g_ratio": 0.5}).make_model("crnn_tiny")  # h = 32
    assert model.global_proj.out_features == model.private_proj.out_features == 32
    with pytest.raises(ConfigError, match="fedkwsui.g_ratio"):
        algorithm(**{"fedkwsui.g_ratio": 1.0}).make_model("crnn_tiny")


def test_gradient_clipping_setting_changes_the_update():
    kw = {"train.lr": 0.5, "fedkwsui.local_steps": 3}
    a, b = algorithm(**kw), algorithm(**kw, **{"train.max_grad_norm": 1e-3})
    assert a.cfg.train.max_grad_norm == 50.0  # fedkwsui's default: the code's clipping
    payload = a.init_server()["params"]
    ua = a.client_update(payload, None, client(), 1, torch_generator(0, "t")).upload
    ub = b.client_update(payload, None, client(), 1, torch_generator(0, "t")).upload
    step_a = (ua["global_head.weight"] - payload["global_head.weight"]).norm()
    step_b = (ub["global_head.weight"] - payload["global_head.weight"]).norm()
    assert step_b < 0.1 * step_a


# --- persistence and aggregation ------------------------------------------------------------------
def test_persistent_private_head_stays_on_the_client():
    algo = algorithm(**{"fedkwsui.private": "persistent"})
    server = algo.init_server()
    s0, s1 = algo.init_client_state("c0"), algo.init_client_state("c1")
    assert s0.keys() == {k for k in server["params"] if k.startswith("private_")}
    assert not torch.equal(s0["private_head.weight"], s1["private_head.weight"])  # one per client
    result = algo.client_update(server["params"], s0, client(), 1, torch_generator(0, "t"))
    assert not torch.equal(result.state["private_head.weight"], s0["private_head.weight"])
    new, _ = algo.server_update(server, [(result.upload, 12)], 1)
    assert torch.equal(
        new["params"]["private_head.weight"], server["params"]["private_head.weight"]
    )
    assert not torch.equal(
        new["params"]["global_head.weight"], server["params"]["global_head.weight"]
    )
    assert algorithm().init_client_state("c0") is None  # shared (code): no client state


def test_uniform_and_weighted_aggregation():
    server = algorithm().init_server()
    a = {
        k: torch.zeros_like(v) if v.is_floating_point() else v for k, v in server["params"].items()
    }
    b = {k: torch.ones_like(v) if v.is_floating_point() else v for k, v in server["params"].items()}
    uniform, _ = algorithm().server_update(server, [(a, 1), (b, 3)], 1)
    weighted, _ = algorithm(**{"fedkwsui.aggregation": "weighted"}).server_update(
        server, [(a, 1), (b, 3)], 1
    )
    assert torch.allclose(uniform["params"]["global_head.bias"], torch.full((12,), 0.5))
    assert torch.allclose(weighted["params"]["global_head.bias"], torch.full((12,), 0.75))
    # own setting wins over the general one; general follows aggregation.weighting (the fedkws
    # protocol)
    own, _ = algorithm(**{"aggregation.weighting": "n_k"}).server_update(
        server, [(a, 1), (b, 3)], 1
    )
    assert torch.allclose(own["params"]["global_head.bias"], torch.full((12,), 0.5))
    for weighting, expected in (("n_k", 0.75), ("uniform", 0.5)):
        general = algorithm(
            **{"fedkwsui.aggregation": "general", "aggregation.weighting": weighting}
        )
        new, _ = general.server_update(server, [(a, 1), (b, 3)], 1)
        assert torch.allclose(new["params"]["global_head.bias"], torch.full((12,), expected)), (
            weighting
        )
    # every other algorithm's server mean honours aggregation.weighting (FedAvg here)
    fedavg = algorithm(**{"algorithm": "fedavg", "aggregation.weighting": "uniform"})
    new, _ = fedavg.server_update({"params": a}, [(a, 1), (b, 3)], 1)
    assert torch.allclose(new["params"]["global_head.bias"], torch.full((12,), 0.5))


@pytest.mark.parametrize(
    "setting,value,message",
    [
        ("fedkwsui.private", "local", "fedkwsui.private must be shared or persistent"),
        ("fedkwsui.r0", "often", "fedkwsui.r0 must be a positive number or one of auto, sum"),
        ("fedkwsui.size_cap", -3, "fedkwsui.size_cap must be a positive number"),
        ("fedkwsui.adv_lambda", -0.1, "fedkwsui.adv_lambda must be >= 0"),
        (
            "fedkwsui.aggregation",
            "median",
            "fedkwsui.aggregation must be uniform, weighted or general",
        ),
        ("fedkwsui.head_init", "xavier", "fedkwsui.head_init must be one of default, kaiming"),
    ],
)
def test_bad_settings_are_named(setting, value, message):
    with pytest.raises(ConfigError, match=message):
        algorithm(**{setting: value})


def test_missing_class_counts_is_a_typed_error():
    cfg = load_config(overrides=["algorithm=fedkwsui"])
    with pytest.raises(ConfigError, match="class counts"):
        build_algorithm(cfg, Task(8, 12, ["c0"]))


# --- simulator: resume exactness and the CLI ------------------------------------------------------
@pytest.fixture(scope="module")
def settings(gsc_root):
    return {
        **tiny_run(gsc_root, None),
        "algorithm": "fedkwsui",
        "train.rounds": 2,
        "fedkwsui.local_steps": 3,
        "train.eval_every": 1,
        "fedkwsui.private": "persistent",
        "train.test_curve": True,
    }


@pytest.mark.slow
def test_resumed_fedkwsui_run_ends_with_the_uninterrupted_parameters(settings, tmp_path):
    cfg = load_config(overrides=[f"{k}={v}" for k, v in settings.items()])
    full = Simulator(cfg, tmp_path / "full", progress=False)
    results = full.run()
    # train.test_curve: one per evaluation
    curve = [row["test_accuracy"] for row in results["history"]]
    assert len(curve) == 2 and results["final"]["test_last5_mean"] == pytest.approx(sum(curve) / 2)
    part = Simulator(cfg, tmp_path / "part", full.data, progress=False)
    assert part.run(stop_after=1) is None
    resumed = Simulator(cfg, tmp_path / "part", full.data, progress=False)
    resumed.run(resume=True)
    assert resumed.rounds_trained == 1
    for key, value in full.state.server["params"].items():
        assert torch.equal(value, resumed.state.server["params"][key]), key
    assert full.state.clients.keys() == resumed.state.clients.keys()
    for name, state in full.state.clients.items():  # the persistent private heads too
        assert all(torch.equal(v, resumed.state.clients[name][k]) for k, v in state.items())


def test_fedac_run_fedkwsui_writes_a_run_directory(settings, tmp_path, capsys):
    args = [
        "run",
        "--algorithm",
        "fedkwsui",
        "--rounds",
        "1",
        "--out",
        str(tmp_path / "run"),
        "--quiet",
    ]
    for key, value in settings.items():
        if key not in ("algorithm", "train.rounds"):
            args += ["--set", f"{key}={value}"]
    assert (
        main(
            args
            + [
                "--set",
                "data.task=12",
                "--set",
                "data.gsc12=fedkws",
                "--set",
                "train.test_curve=false",
            ]
        )
        == 0
    )
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert (
        "test_last5_mean" not in results["final"] and "test_accuracy" not in results["history"][0]
    )
    assert results["algorithm"] == "fedkwsui" and 0 <= results["final"]["accuracy"] <= 1
    # 12-class task: FA / FR
    assert 0 <= results["final"]["fa"] <= 1 and 0 <= results["final"]["fr"] <= 1
    assert "fa" in results["legend"]
    assert (tmp_path / "run" / "config.yaml").is_file() and (
        tmp_path / "run" / "metrics.csv"
    ).is_file()


@pytest.mark.slow
def test_fedkwsui_on_flower_equals_the_simulator(tmp_path_factory, tmp_path, monkeypatch):
    """In-process Flower deployment (LocalGrid): persistent private heads travel as explicit client
    state and the global model equals the simulator's."""
    pytest.importorskip("flwr")
    from test_flower import fedac_config, make_gsc_tree, nodes_for, run_config, run_local

    from flower_helpers import use_task_identity

    use_task_identity(monkeypatch)

    root = make_gsc_tree(tmp_path_factory.mktemp("kws_flower_gsc"), speakers=5, clips=1)
    dataset = (root, None)
    settings = {
        "algorithm": "fedkwsui",
        "strategy": "fedac",
        "rounds": 2,
        "fraction": 0.5,
        "num_clients": 4,
        "min-nodes": 4,
        "poll-interval": 0.01,
    }
    settings["fedac-set"] = (
        run_config(dataset, "x", num_clients=4)["fedac-set"]
        + ";fedkwsui.private=persistent;fedkwsui.local_steps=3"
    )
    results, _, config = run_local(dataset, tmp_path, nodes_for(4), **settings)
    sim = Simulator(fedac_config(config), tmp_path / "sim", progress=False)
    expected = sim.run()
    flower_params = torch.load(tmp_path / "run" / "server_state.pt")["params"]
    for name, value in sim.state.server["params"].items():
        torch.testing.assert_close(flower_params[name], value, rtol=0, atol=1e-5, msg=name)
    assert results["final"]["accuracy"] == pytest.approx(expected["final"]["accuracy"], abs=1e-6)


def test_data_stats_prints_alt_statistics(gsc_root, capsys):
    import re

    def stats(*settings):
        argv = [
            "data",
            "stats",
            "speech_commands",
            "--root",
            str(gsc_root),
            "--quiet",
            "--set",
            "data.task=12",
        ]
        for s in settings:
            argv += ["--set", s]
        assert main(argv) == 0
        line = next(x for x in capsys.readouterr().out.splitlines() if "FedKWS-UI ALT" in x)
        return line, [
            float(v)
            for v in re.findall(r"(?:min|median|mean|max) ([0-9.]+)", line.split("r0 * rbar_k")[1])
        ]

    line, code = stats()
    assert "cap 100, r0 3.500" in line  # the code's constants on 12-class Speech Commands
    _, doubled = stats("fedkwsui.r0=7")
    assert doubled == pytest.approx([2 * v for v in code], abs=2e-3)
    line, rule = stats("fedkwsui.r0=sum", "fedkwsui.local_steps=10")  # Sec. 4: mean r0 rbar_k = 1
    average, steps = re.search(r"on average ([0-9.]+) of E = (\d+)", line).groups()
    assert rule[2] == pytest.approx(1.0, abs=1e-3) and steps == "10" and 9 <= float(average) <= 10
