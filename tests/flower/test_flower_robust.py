"""Attacks, robust aggregators and DP through the Flower app (issue 13): the ServerApp and
ClientApps in one process (flower_helpers.LocalGrid) end with the simulator's global model; Flower's
own DP math (clipping, noise scale) equals fedac's on identical inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip(
    "flwr", reason="flwr is not installed (pip install 'flwr>=1.41,<1.42'); Flower tests skipped"
)

from flwr.supercore.differential_privacy import compute_clip_model_update, compute_stdv  # noqa: E402
from test_flower import dataset, nodes_for, run_local  # noqa: F401,E402  (dataset is a fixture)

from fedac.engine.simulator import Simulator  # noqa: E402
from fedac.flower.settings import fedac_config  # noqa: E402
from fedac.rules.robust import clip_update  # noqa: E402
from flower_helpers import use_task_identity  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def task_identity(monkeypatch):
    use_task_identity(monkeypatch)


@pytest.mark.parametrize(
    "algorithm, nodes, sets",
    [
        # data poisoning on the node
        ("fedavg", 3, "attack.kind=label_flip;attack.fraction=0.4;aggregation.method=median"),
        (
            "fedavg",
            3,
            "attack.kind=label_permute;attack.fraction=0.4;aggregation.method=krum;aggregation.num_malicious=1",
        ),
        (
            "fedavg",
            3,
            "attack.kind=scale;attack.fraction=0.4;aggregation.method=trimmed_mean;aggregation.trim_fraction=0.34",
        ),
        # the trigger's success rate, server side
        ("fedavg", 3, "attack.kind=backdoor;attack.fraction=0.4;attack.target=1"),
        (
            "fedavg",
            3,
            "attack.kind=sign_flip;attack.fraction=0.4;aggregation.method=multikrum;aggregation.num_malicious=1",
        ),
        (
            "fedavg",
            7,
            "attack.kind=gaussian;attack.fraction=0.15;aggregation.method=bulyan;aggregation.num_malicious=1",
        ),
        (
            "fedavg",
            3,
            "attack.kind=little;attack.fraction=0.4;aggregation.method=norm_bound;aggregation.clip_norm=0.5",
        ),
        ("fedavg", 3, "attack.kind=gaussian;attack.fraction=0.4;aggregation.method=lpa"),
        ("fedavg", 3, "dp.mode=central;dp.noise_multiplier=0.5;dp.clip=0.5"),
        ("fedavg", 3, "dp.mode=client;dp.clip=0.5"),
        (
            "fedmlac",
            3,
            "attack.kind=sign_flip;attack.fraction=0.4;aggregation.method=multikrum;aggregation.num_malicious=1",
        ),
        # LPA over the Plug-ins
        ("fedmlac", 3, "attack.kind=backdoor;attack.fraction=0.4;attack.target=1"),
    ],
)
@pytest.mark.slow
def test_flower_app_with_attack_or_dp_equals_the_simulator(
    dataset, tmp_path, algorithm, nodes, sets
):
    """Every attack kind, every aggregator beside the mean and both DP modes run through the Flower
    app and end where the simulator does: same global model (FedMLAC: the shared Plug-in), accuracy,
    attackers, backdoor success rate and epsilon."""
    from test_flower import run_config

    settings = {
        "algorithm": algorithm,
        "rounds": 1,
        "poll-interval": 0.01,
        "num_clients": nodes,
        "min-nodes": nodes,
    }
    settings["fedac-set"] = run_config(dataset, "x", num_clients=nodes)["fedac-set"] + ";" + sets
    results, _, config = run_local(dataset, tmp_path, nodes_for(nodes), **settings)
    expected = Simulator(fedac_config(config), tmp_path / "sim", progress=False).run()
    flower_params = torch.load(tmp_path / "run" / "server_state.pt")["params"]
    sim = torch.load(tmp_path / "sim" / "checkpoint.pt", weights_only=False)["server"]["params"]
    assert sim.keys() == flower_params.keys()
    for name, value in sim.items():
        torch.testing.assert_close(flower_params[name], value, rtol=0, atol=1e-5, msg=name)
    for key in ("accuracy", "malicious_clients", "attack_success_rate", "dp_epsilon"):
        assert results["final"].get(key) == pytest.approx(expected["final"].get(key)), key
    if "attack.kind" in sets:
        assert results["final"]["malicious_clients"] >= 1
    # the Flower server reports the trigger's success rate, as the simulator does
    if "backdoor" in sets:
        assert 0.0 <= results["final"]["attack_success_rate"] <= 1.0


def test_flower_builtin_strategies_refuse_attacks_and_client_clipping(dataset, tmp_path):
    from test_flower import run_config

    from fedac.errors import ConfigError

    settings = {"algorithm": "fedavg", "strategy": "flower", "rounds": 1, "poll-interval": 0.01}
    for sets in ("dp.mode=client", "attack.kind=sign_flip;attack.fraction=0.3"):
        settings["fedac-set"] = run_config(dataset, "x")["fedac-set"] + ";" + sets
        with pytest.raises(ConfigError, match="set strategy=fedac"):
            run_local(dataset, tmp_path, nodes_for(3), **settings)


def test_flowers_dp_wrapper_equals_fedac_dp_fedavg_without_noise(dataset, tmp_path):
    """strategy=flower with dp.mode=central runs Flower's
    DifferentialPrivacyServerSideFixedClipping; with noise 0 (Flower's noise is unseeded) and
    clients of equal size it gives fedac's clipped mean exactly."""
    from test_flower import run_config

    settings = {
        "algorithm": "fedavg",
        "strategy": "flower",
        "rounds": 2,
        "poll-interval": 0.01,
        "fraction": 1.0,
    }
    settings["fedac-set"] = (
        run_config(dataset, "x")["fedac-set"]
        + ";dp.mode=central;dp.noise_multiplier=0;dp.clip=0.05"
    )
    results, _, config = run_local(dataset, tmp_path, nodes_for(3), **settings)
    sim = Simulator(fedac_config(config), tmp_path / "sim", progress=False)
    # equal n_k: Flower's weighted mean is fedac's
    assert len({c.num_samples for c in sim.data.clients}) == 1
    expected = sim.run()
    flower_params = torch.load(tmp_path / "run" / "server_state.pt")["params"]
    for name, value in sim.state.server["params"].items():
        torch.testing.assert_close(flower_params[name], value, rtol=0, atol=1e-5, msg=name)
    # z = 0
    assert results["final"]["dp_epsilon"] == expected["final"]["dp_epsilon"] == float("inf")
    assert results["runtime"]["strategy"] == "DifferentialPrivacyServerSideFixedClipping"


def test_clipping_and_noise_scale_equal_flowers_dp_functions():
    gen = torch.Generator().manual_seed(5)
    reference = {
        "a": torch.randn(4, 3, generator=gen, dtype=torch.float64),
        "b": torch.randn(5, generator=gen, dtype=torch.float64),
    }
    for scale in (0.1, 10.0):  # below and above the clipping norm
        upload = {
            k: v + scale * torch.randn(v.shape, generator=gen, dtype=torch.float64)
            for k, v in reference.items()
        }
        ours = clip_update(upload, reference, 1.5)
        theirs = [upload["a"].numpy().copy(), upload["b"].numpy().copy()]
        compute_clip_model_update(theirs, [reference["a"].numpy(), reference["b"].numpy()], 1.5)
        np.testing.assert_allclose(ours["a"].numpy(), theirs[0], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(ours["b"].numpy(), theirs[1], rtol=1e-12, atol=1e-12)
    # privacy.Privacy.add_noise draws N(0, (z C / m)^2): Flower's server-side wrapper's standard
    # deviation.
    assert compute_stdv(1.1, 0.5, 8) == pytest.approx(1.1 * 0.5 / 8)
