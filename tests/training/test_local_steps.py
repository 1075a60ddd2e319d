"""The training settings FedKWS-UI's protocol added for every algorithm: `train.local_steps` (a
cycling loader; batches by hand, step counts, stacked path equal to the sequential one),
`train.optimizer`, `train.max_grad_norm` and `fedprox.form=smooth_l1` (by hand)."""

from __future__ import annotations

import pytest
import torch
from test_cohort import assert_same_run, federate, make_algorithm

from fedac.config import load_config
from fedac.engine.execution import stacking_obstacle
from fedac.training.local import cycling_batches, local_steps

pytestmark = pytest.mark.usefixtures("one_thread")


def test_cycling_batches_by_hand():
    gen = torch.Generator().manual_seed(0)
    batches = list(cycling_batches(5, 2, 4, gen))
    # a pass keeps its partial batch, then a reshuffle
    assert [len(b) for b in batches] == [2, 2, 1, 2]
    assert sorted(torch.cat(batches[:3]).tolist()) == [0, 1, 2, 3, 4]
    assert list(cycling_batches(0, 2, 4, gen)) == []  # no data, no steps (never an endless loop)


def test_local_steps_fixes_every_clients_step_count():
    assert local_steps(37, load_config(overrides=["train.local_steps=7"]).train) == 7
    assert (
        local_steps(
            37, load_config(overrides=["train.batch_size=16", "train.local_epochs=2"]).train
        )
        == 6
    )
    algo, clients = make_algorithm(
        "train.local_steps=3", "runtime.execution=sequential", "model.name=crnn_tiny"
    )
    _, _, results = federate(algo, clients, rounds=1)
    # clients of 37 and of 5 samples alike
    assert [r.metrics["steps"] for r in results] == [3.0] * len(clients)


def test_cohort_path_equals_sequential_with_local_steps():
    runs = []
    for mode in ("cohort", "sequential"):
        algo, clients = make_algorithm(
            "train.local_steps=4", f"runtime.execution={mode}", "model.name=crnn_tiny"
        )
        runs.append(federate(algo, clients, rounds=2))
    assert_same_run(*runs)


def test_optimizer_and_clipping_settings():
    from fedac.errors import ConfigError
    from fedac.training.local import make_optimizer

    params = [torch.nn.Parameter(torch.ones(2))]
    assert isinstance(
        make_optimizer(params, load_config(overrides=["train.optimizer=adamw"]).train),
        torch.optim.AdamW,
    )
    assert isinstance(make_optimizer(params, load_config().train), torch.optim.SGD)
    with pytest.raises(ConfigError, match="train.optimizer must be sgd, adam or adamw"):
        make_optimizer(params, load_config(overrides=["train.optimizer=lion"]).train)
    # the stacked path has AdamW and clips per client (training/functional.py,
    # tests/models/test_stacked_models.py)
    assert stacking_obstacle(make_algorithm()[0]) is None
    assert stacking_obstacle(make_algorithm("train.optimizer=adamw")[0]) is None
    assert stacking_obstacle(make_algorithm("train.max_grad_norm=5")[0]) is None
    steps = {}
    for setting in ("train.max_grad_norm=0", "train.max_grad_norm=0.001", "train.optimizer=adamw"):
        algo, clients = make_algorithm(setting, "model.name=crnn_tiny", "train.local_steps=1")
        start = algo.init_server()["params"]
        server, _, _ = federate(algo, clients[:1], rounds=1)
        steps[setting] = max(float((server["params"][k] - start[k]).abs().max()) for k in start)
    # lr 0.05 x norm 1e-3
    assert steps["train.max_grad_norm=0.001"] < 0.01 * steps["train.max_grad_norm=0"]
    # Adam's first step: lr x sign
    assert steps["train.optimizer=adamw"] == pytest.approx(0.05, rel=0.05)


def test_fedprox_smooth_l1_form_by_hand():
    from fedac.algorithms.base import Task
    from fedac.algorithms.fedprox import FedProx
    from fedac.errors import ConfigError

    model = torch.nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.5, 3.0]]))
        model.bias.copy_(torch.tensor([0.0]))
    anchor = {"weight": torch.zeros(1, 2), "bias": torch.tensor([1.0])}
    # weight: mean(0.5 * 0.5^2, 3 - 0.5) = (0.125 + 2.5) / 2 = 1.3125; bias: |d| = 1 -> 1 - 0.5 =
    # 0.5; mean over the two tensors: (1.3125 + 0.5) / 2 = 0.90625; times mu = 0.2
    algo = FedProx(
        load_config(overrides=["algorithm=fedprox", "fedprox.mu=0.2", "fedprox.form=smooth_l1"]),
        Task(2, 1, ["a"]),
    )
    assert float(algo.regularizer(anchor)(model).detach()) == pytest.approx(0.2 * 0.90625)
    l2 = FedProx(load_config(overrides=["algorithm=fedprox", "fedprox.mu=0.2"]), Task(2, 1, ["a"]))
    # mu/2 ||d||^2
    assert float(l2.regularizer(anchor)(model).detach()) == pytest.approx(0.1 * (0.25 + 9 + 1))
    with pytest.raises(ConfigError, match="fedprox.form must be one of l2, smooth_l1"):
        FedProx(
            load_config(overrides=["algorithm=fedprox", "fedprox.form=l1"]), Task(2, 1, ["a"])
        ).regularizer(anchor)


@pytest.mark.parametrize(
    "name,make_torch",
    [
        ("fedadam", lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.9, 0.99), eps=1e-3)),
        ("fedavgm", lambda p: torch.optim.SGD(p, lr=1.0, momentum=0.9)),
    ],
)
def test_fedopt_torch_form_equals_torch_optimizers(name, make_torch):
    """fedopt.form=torch: three server steps equal torch's optimizer on grad = x - aggregate, on the
    parameters; BatchNorm buffers (kws networks) take the aggregate."""
    from fedac.algorithms import build_algorithm
    from fedac.algorithms.base import Task

    cfg = load_config(
        overrides=[
            f"algorithm={name}",
            "model.name=dscnn",
            "fedopt.form=torch",
            "fedopt.server_lr=0.01",
        ]
    )
    algo = build_algorithm(cfg, Task(40, 12, ["a"]))
    server = algo.init_server()
    reference = algo.make_model("dscnn")
    reference.load_state_dict(server["params"])
    optimizer = make_torch(list(reference.parameters()))
    gen = torch.Generator().manual_seed(0)
    for round_idx in (1, 2, 3):
        upload = {
            k: v + 0.01 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v
            for k, v in server["params"].items()
        }
        server, _ = algo.server_update(server, [(upload, 5)], round_idx)
        optimizer.zero_grad()
        for pname, p in reference.named_parameters():
            p.grad = p.detach() - upload[pname]
        optimizer.step()
        buffers = dict(reference.named_buffers())
        for k, v in server["params"].items():
            expected = (
                buffers[k]
                if k in buffers and not v.is_floating_point()
                else (upload[k] if k in buffers else reference.state_dict()[k])
            )
            torch.testing.assert_close(v, expected, rtol=0, atol=1e-6, msg=k)
