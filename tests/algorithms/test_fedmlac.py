"""FedMLAC (fedmlac.md Eq. 5-9, Alg. 1-2) and the FedKAD baseline."""

import math

import pytest
import torch

from fedac.algorithms.base import ClientData, Task
from fedac.algorithms.fedavg import FedAvg
from fedac.algorithms.fedkad import FedKAD, aggregate_prototypes, alignment_loss, class_prototypes
from fedac.algorithms.fedmlac import FedMLAC, distillation_kl, personalized_loss, plugin_loss
from fedac.config import load_config
from fedac.engine.simulator import Simulator, sample_cohort
from fedac.errors import ConfigError


def softmax(z):
    e = [math.exp(v) for v in z]
    return [v / sum(e) for v in e]


def kl(p, q):
    """Eq. 5 written out: sum_c p(c) log(p(c) / q(c))."""
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))


OMEGA = [[1.0, 0.0, -1.0], [0.5, 2.0, 0.0]]
THETA = [[0.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
LABELS = [0, 1]


def test_eq8_personalized_loss_matches_hand_computation():
    alpha = 0.3
    ce = sum(-math.log(softmax(o)[y]) for o, y in zip(OMEGA, LABELS)) / 2
    kd = sum(kl(softmax(t), softmax(o)) for o, t in zip(OMEGA, THETA)) / 2  # KL(p_theta || p_omega)
    expected = alpha * ce + (1 - alpha) * kd
    got = personalized_loss(torch.tensor(OMEGA), torch.tensor(THETA), torch.tensor(LABELS), alpha)
    assert float(got) == pytest.approx(expected, rel=1e-6)
    # Without mutual learning: CE alone.
    assert float(
        personalized_loss(torch.tensor(OMEGA), None, torch.tensor(LABELS), alpha, ml=False)
    ) == pytest.approx(ce, rel=1e-6)


def test_eq9_plugin_loss_matches_hand_computation():
    # KL(p_omega || p_theta)
    expected = sum(kl(softmax(o), softmax(t)) for o, t in zip(OMEGA, THETA)) / 2
    got = plugin_loss(torch.tensor(THETA), torch.tensor(OMEGA), torch.tensor(LABELS))
    assert float(got) == pytest.approx(expected, rel=1e-6)
    ce_theta = sum(-math.log(softmax(t)[y]) for t, y in zip(THETA, LABELS)) / 2
    with_ce = plugin_loss(
        torch.tensor(THETA), torch.tensor(OMEGA), torch.tensor(LABELS), ce_weight=0.5
    )
    assert float(with_ce) == pytest.approx(expected + 0.5 * ce_theta, rel=1e-6)


def test_temperature_softens_and_rescales():
    t = 2.0
    expected = (
        t
        * t
        * sum(
            kl(softmax([v / t for v in o]), softmax([v / t for v in th]))
            for o, th in zip(OMEGA, THETA)
        )
        / 2
    )
    got = distillation_kl(torch.tensor(THETA), torch.tensor(OMEGA), temperature=t)
    assert float(got) == pytest.approx(expected, rel=1e-6)


def test_gradients_flow_only_into_the_student():
    omega = torch.tensor(OMEGA, requires_grad=True)
    theta = torch.tensor(THETA, requires_grad=True)
    personalized_loss(omega, theta, torch.tensor(LABELS), 0.5).backward()
    assert omega.grad is not None and omega.grad.abs().sum() > 0
    assert theta.grad is None
    omega.grad = None
    plugin_loss(theta, omega, torch.tensor(LABELS)).backward()
    assert theta.grad is not None and theta.grad.abs().sum() > 0
    assert omega.grad is None


def _task(num_classes=3):
    return Task(num_features=8, num_classes=num_classes, clients=["a", "b"])


def _client(name="a", n=10, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return ClientData(
        name,
        torch.randn(n, 8, 12, generator=g),
        torch.randint(0, classes, (n,), generator=g),
        torch.zeros(0, 8, 12),
        torch.zeros(0, dtype=torch.long),
    )


def test_client_update_uploads_only_the_plugin_and_keeps_the_personalized_model():
    cfg = load_config(
        overrides=["model.client_model=crnn_mid", "fedmlac.plugin_model=crnn_tiny", "train.lr=0.1"]
    )
    algo = FedMLAC(cfg, _task())
    server = algo.init_server()
    state = algo.init_client_state("a")
    before = {k: v.clone() for k, v in state.items()}
    result = algo.client_update(
        algo.broadcast(server), state, _client(), 1, torch.Generator().manual_seed(0)
    )
    plugin_keys = set(algo.make_model("crnn_tiny").state_dict())
    client_keys = set(algo.make_model("crnn_mid").state_dict())
    assert set(result.upload) == plugin_keys
    assert set(result.state) == client_keys
    assert any(not torch.equal(before[k], result.state[k]) for k in before), "omega was not trained"
    assert any(not torch.equal(server["params"][k], result.upload[k]) for k in plugin_keys), (
        "theta was not trained"
    )
    # The caller's tensors are not modified in place (the upload and state are fresh copies).
    assert all(torch.equal(before[k], state[k]) for k in before)


def test_without_mutual_learning_both_models_train_on_ce_alone():
    """`fedmlac.ml=false` (w/o ML): the personalized model and the Plug-in each take exactly
    FedAvg's CE update of their own architecture (dropout off, so shared masks cannot couple them);
    with mutual learning the Plug-in's update is a different one."""
    base = [
        "model.client_model=crnn_mid",
        "fedmlac.plugin_model=crnn_tiny",
        "train.lr=0.1",
        "model.dropout=0",
    ]
    algo = FedMLAC(load_config(overrides=base + ["fedmlac.ml=false"]), _task())
    payload, state = algo.broadcast(algo.init_server()), algo.init_client_state("a")
    result = algo.client_update(payload, state, _client(), 1, torch.Generator().manual_seed(0))
    for arch, start, got in (
        ("crnn_mid", state, result.state),
        ("crnn_tiny", payload, result.upload),
    ):
        fedavg = FedAvg(load_config(overrides=base + [f"model.name={arch}"]), _task())
        expected = fedavg.client_update(
            start, None, _client(), 1, torch.Generator().manual_seed(0)
        ).upload
        assert all(torch.allclose(got[k], expected[k], atol=1e-6) for k in expected), arch
    with_ml = FedMLAC(load_config(overrides=base), _task()).client_update(
        payload, state, _client(), 1, torch.Generator().manual_seed(0)
    )
    assert not torch.allclose(
        with_ml.upload["head.weight"], result.upload["head.weight"], atol=1e-4
    )
    with pytest.raises(ConfigError, match="fedmlac.alpha"):
        FedMLAC(load_config(overrides=["fedmlac.alpha=1.5"]), _task())


def _fedmlac_cfg(gsc_root, tmp_path, *extra):
    return load_config(
        overrides=[
            f"data.root={gsc_root}",
            "algorithm=fedmlac",
            "train.rounds=4",
            "train.fraction=0.5",
            "train.eval_every=2",
            "train.checkpoint_every=1",
            "model.client_model=crnn_tiny",
            "fedmlac.plugin_model=crnn_tiny",
            "train.lr=0.1",
            f"out={tmp_path}",
            *extra,
        ]
    )


@pytest.mark.slow
def test_personalized_state_persists_between_sampled_rounds_and_unsampled_are_untouched(
    gsc_root, tmp_path
):
    # (the spy wraps client_update, which the sequential path calls; the plan is fixed at start)
    cfg = _fedmlac_cfg(gsc_root, tmp_path, "runtime.execution=sequential")
    sim = Simulator(cfg, tmp_path / "run", progress=False)
    state = sim._fresh_state()
    seen_after: dict[str, dict] = {}
    for t in range(1, 5):
        cohort = set(sample_cohort(sim.trainable, cfg.train.fraction, cfg.seed, t))
        snapshot = {name: {k: v.clone() for k, v in s.items()} for name, s in state.clients.items()}
        started_with = {}
        original = sim.algorithm.client_update

        def spy(payload, client_state, data, round_idx, generator):
            started_with[data.name] = {k: v.clone() for k, v in client_state.items()}
            return original(payload, client_state, data, round_idx, generator)

        sim.algorithm.client_update = spy
        sim.run_round(state, t)
        sim.algorithm.client_update = original
        for name in cohort:
            if name in seen_after:  # sampled before: starts exactly where its last round ended
                assert all(
                    torch.equal(seen_after[name][k], started_with[name][k])
                    for k in started_with[name]
                )
            seen_after[name] = {k: v.clone() for k, v in state.clients[name].items()}
        for name, params in snapshot.items():
            if name not in cohort:
                assert all(torch.equal(params[k], state.clients[name][k]) for k in params)
    assert any(len(v) for v in seen_after.values())


@pytest.mark.parametrize("algorithm", ["fedmlac", "fedkad"])
@pytest.mark.slow
def test_resume_of_a_killed_run_gives_identical_models(gsc_root, tmp_path, algorithm):
    extra = [
        f"algorithm={algorithm}",
        "model.heterogeneous=true",
        "model.zoo=[crnn_tiny,crnn_lite]",
    ]
    straight = Simulator(
        _fedmlac_cfg(gsc_root, tmp_path, *extra), tmp_path / "straight", progress=False
    )
    full = straight.run()
    killed = Simulator(
        _fedmlac_cfg(gsc_root, tmp_path, *extra), tmp_path / "killed", progress=False
    )
    assert killed.run(stop_after=3) is None
    resumed = Simulator(
        _fedmlac_cfg(gsc_root, tmp_path, *extra), tmp_path / "killed", progress=False
    )
    again = resumed.run(resume=True)
    assert (again["resumed_from"], again["rounds_trained"]) == (3, 1)  # not a restart from round 0
    for key, value in straight.state.server.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, resumed.state.server[key])
        else:
            assert all(torch.equal(value[k], resumed.state.server[key][k]) for k in value)
    assert straight.state.clients.keys() == resumed.state.clients.keys()
    for name, params in straight.state.clients.items():
        assert all(torch.equal(params[k], resumed.state.clients[name][k]) for k in params)
    assert full["final"] == again["final"]


@pytest.mark.slow
def test_fedmlac_reports_global_and_personalized_metrics(gsc_root, tmp_path):
    sim = Simulator(_fedmlac_cfg(gsc_root, tmp_path), tmp_path / "r", progress=False)
    final = sim.run()["final"]
    for key in (
        "accuracy",
        "macro_f1",
        "personalized_accuracy_mean",
        "personalized_accuracy_std",
        "personalized_local_accuracy_mean",
    ):
        assert 0.0 <= final[key] <= 1.0, key
    assert final["has_global_model"] is True
    # the headline accuracy is the selected Plug-in's on the test clips (one window each here)
    plugin = sim.algorithm.global_model(sim.evaluator.selected_server(sim.state)).eval()
    with torch.no_grad():
        hits = plugin(sim.data.test.x).argmax(1) == sim.data.test.labels
    assert final["accuracy"] == pytest.approx(float(hits.double().mean()))


def test_heterogeneous_architectures_are_drawn_once_per_client():
    cfg = load_config(overrides=["model.heterogeneous=true"])
    algo = FedMLAC(cfg, Task(8, 3, [f"c{i}" for i in range(40)]))
    archs = [algo.client_architecture(f"c{i}") for i in range(40)]
    assert archs == [algo.client_architecture(f"c{i}") for i in range(40)]
    assert set(archs) == set(cfg.model.zoo)


def test_fedkad_prototypes_alignment_and_aggregation():
    projected = torch.tensor([[1.0, 0.0], [3.0, 2.0], [0.0, 4.0]])
    y = torch.tensor([0, 0, 2])
    protos, counts = class_prototypes(projected, y, 3)
    assert torch.allclose(protos, torch.tensor([[2.0, 1.0], [0.0, 0.0], [0.0, 4.0]]))
    assert counts.tolist() == [2.0, 0.0, 1.0]
    # Alignment only for classes with a global prototype: class 0 known, class 2 unknown.
    global_protos = torch.tensor([[1.0, 1.0], [0.0, 0.0], [9.0, 9.0]])
    known = torch.tensor([True, False, False])
    expected = ((0.0**2 + 1.0**2) + (2.0**2 + 1.0**2)) / 2
    assert float(alignment_loss(projected, y, global_protos, known)) == pytest.approx(expected)
    # Server: count-weighted per class; class 1 unseen keeps its previous value.
    other = {
        "prototypes": torch.tensor([[5.0, 5.0], [0.0, 0.0], [2.0, 0.0]]),
        "counts": torch.tensor([1.0, 0.0, 3.0]),
    }
    agg, now_known = aggregate_prototypes(
        [({"prototypes": protos, "counts": counts}, 3), (other, 4)],
        torch.tensor([[0.0, 0.0], [7.0, 7.0], [0.0, 0.0]]),
        torch.tensor([False, True, False]),
    )
    assert torch.allclose(agg[0], torch.tensor([(2 * 2 + 5) / 3, (2 * 1 + 5) / 3]))
    assert torch.allclose(agg[1], torch.tensor([7.0, 7.0]))
    assert torch.allclose(agg[2], torch.tensor([(0 + 3 * 2) / 4, (4 + 0) / 4]))
    assert now_known.tolist() == [True, True, True]


def test_fedkad_uploads_prototypes_only():
    cfg = load_config(overrides=["model.client_model=crnn_tiny", "fedkad.proto_dim=5"])
    algo = FedKAD(cfg, _task())
    result = algo.client_update(
        algo.broadcast(algo.init_server()),
        algo.init_client_state("a"),
        _client(),
        1,
        torch.Generator().manual_seed(0),
    )
    assert set(result.upload) == {"prototypes", "counts"}
    assert result.upload["prototypes"].shape == (3, 5)
    assert float(result.upload["counts"].sum()) == 10
