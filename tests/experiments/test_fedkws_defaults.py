"""FedKWS-UI and FedMMD's own default schedule (RUN_DEFAULTS in settings/fedkwsui.py and fedmmd.py,
issue 43): a bound on the local steps a default run takes, the paper protocol untouched behind
`fedac reproduce`, and the private phase's encoder forward that runs without a backward pass."""

from __future__ import annotations

import pytest
import torch

from fedac.algorithms import build_algorithm
from fedac.algorithms.base import ClientData, Task
from fedac.algorithms.fedkwsui import SPEECH_COMMANDS_ALT
from fedac.config import Config, load_config
from fedac.experiments.compare import parse_method
from fedac.experiments.fedkws import EXPERIMENTS as KWS_EXPERIMENTS
from fedac.seeding import torch_generator

pytestmark = pytest.mark.usefixtures("one_thread")
STAND_IN_CLIENTS = 240  # speaker clients of the embedded Speech Commands stand-in


def most_steps(cfg: Config) -> int:
    """An upper bound on a run's local SGD steps on the stand-in: every sampled client at ALT's
    largest s_k = r0 E (rbar_k <= 1, the larger r0 of the two Speech Commands tasks) plus its
    private phase."""
    clients = min(cfg.data.max_clients or STAND_IN_CLIENTS, STAND_IN_CLIENTS)
    cohort = max(1, round(cfg.train.fraction * clients))
    r0 = max(r for _, r in SPEECH_COMMANDS_ALT.values())
    per_client = (
        int(r0 * cfg.fedkwsui.local_steps)
        + int(cfg.fedkwsui.private_ratio * cfg.fedkwsui.local_steps)
        + 1
    )
    return cfg.train.rounds * cohort * per_client


def test_default_fedkwsui_run_is_bounded_and_the_shared_schedule_is_not():
    # The shared schedule's bound is over 300,000 steps (measured on the README's DSCNN command:
    # ~1,400 steps a round, 50 rounds, about 7 hours); the default's bound is a twelfth of it
    # (~6,000 taken).
    default = load_config(algorithm="fedkwsui")
    assert most_steps(default) <= 30000
    assert most_steps(
        load_config(algorithm="fedkwsui", algorithm_defaults=False)
    ) > 10 * most_steps(default)
    assert default.train.max_grad_norm == 50.0  # the code's clipping stays in the default
    cohort = round(default.train.fraction * default.data.max_clients)
    # every client visited several times
    assert default.train.rounds * cohort / default.data.max_clients >= 5


def test_fedmmd_default_shares_fedkwsui_cohort_and_rounds():
    kws, mmd = load_config(algorithm="fedkwsui"), load_config(algorithm="fedmmd")
    assert (mmd.data.max_clients, mmd.train.fraction, mmd.train.rounds) == (
        kws.data.max_clients,
        kws.train.fraction,
        kws.train.rounds,
    )
    assert mmd.train.rounds < Config().train.rounds
    # --set wins
    assert load_config(algorithm="fedmmd", overrides=["train.rounds=50"]).train.rounds == 50


@pytest.mark.parametrize("name", ["fedkws12", "fedkws-lambda"])
def test_reproduction_keeps_the_paper_protocol(name):
    """`fedac reproduce` resolves every method as `fedac compare` does (no algorithm defaults): the
    paper's E = 50, 300 rounds, 10% of every client."""
    experiment = KWS_EXPERIMENTS[name]
    for text in experiment.methods:
        method = parse_method(text)
        cfg = load_config(
            overrides=experiment.protocol + method.overrides,
            algorithm_defaults=False,
            algorithm=method.algorithm,
        )
        assert (cfg.fedkwsui.local_steps, cfg.train.local_steps, cfg.train.rounds) == (50, 50, 300)
        assert (cfg.data.max_clients, cfg.train.fraction) == (None, 0.1)


def test_private_phase_runs_no_encoder_backward():
    cfg = load_config(
        overrides=[
            "algorithm=fedkwsui",
            "model.name=dscnn",
            # s_k = 0: private phase only
            "fedkwsui.r0=0.001",
            "fedkwsui.local_steps=10",
        ]
    )
    algo = build_algorithm(cfg, Task(8, 12, ["c0"], [[2] * 12]))
    payload = algo.init_server()["params"]
    model = algo.scratch_model(cfg.model.name)
    backward_calls = []  # one per encoder gradient formed
    hooks = [
        p.register_hook(lambda g: backward_calls.append(1)) for p in model.encoder.parameters()
    ]
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(24, 8, 10, generator=gen), torch.randint(0, 12, (24,), generator=gen)
    try:
        result = algo.client_update(
            payload, None, ClientData("c0", x, y, x[:0], y[:0]), 1, torch_generator(0, "t")
        )
    finally:
        for hook in hooks:
            hook.remove()
    assert result.metrics["private_steps"] == 3.0 and result.metrics["steps"] == 0.0
    assert backward_calls == []
    changed = {k for k in payload if not torch.equal(payload[k], result.upload[k])}
    # the private head learned, and the encoder's BatchNorm statistics still moved (as in the code)
    assert any(k.startswith("private_head") for k in changed) and any(
        "running_mean" in k for k in changed
    )
