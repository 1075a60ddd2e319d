"""FedAdam / FedYogi / FedAdagrad / FedAvgM server steps (Reddi et al. 2021, Alg. 2) over two
rounds, against values written out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from fedac.algorithms.fedopt import server_step
from fedac.settings.fedopt import FedOptConfig

OPT = FedOptConfig(server_lr=0.1, beta1=0.9, beta2=0.99, tau=0.01, momentum=0.5, avgm_server_lr=2.0)

# x_0, then the cohort averages of round 1 and round 2
X0 = [1.0, -2.0, 0.5]
AVG1 = [1.5, -3.0, 0.5]  # Delta_1 = [0.5, -1.0, 0.0]
# round 2 average is relative to x_1, given per test as x_1 + Delta_2 with Delta_2 = [0.2, 0.4,
# -0.3]
D2 = [0.2, 0.4, -0.3]


def params(values) -> dict[str, torch.Tensor]:
    return {"w": torch.tensor(values, dtype=torch.float64), "count": torch.tensor(4)}


def two_steps(rule: str):
    state = {"m": {}, "v": {}}
    x1, state1 = server_step(rule, params(X0), params(AVG1), state, OPT)
    avg2 = params([a + d for a, d in zip(x1["w"].tolist(), D2)])
    x2, state2 = server_step(rule, x1, avg2, state1, OPT)
    return x1, state1, x2, state2


def close(tensor: torch.Tensor, expected: list[float]) -> None:
    assert tensor.tolist() == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_fedadam_two_steps():
    x1, s1, x2, s2 = two_steps("adam")
    d1 = [0.5, -1.0, 0.0]
    m1 = [0.1 * d for d in d1]  # (1 - 0.9) * Delta
    v1 = [0.01 * d * d for d in d1]  # (1 - 0.99) * Delta^2
    x1_exp = [x + 0.1 * m / (math.sqrt(v) + 0.01) for x, m, v in zip(X0, m1, v1)]
    # element 0: m = 0.05, v = 0.0025 -> 1 + 0.1 * 0.05 / 0.06 = 1.083333...
    assert x1_exp[0] == pytest.approx(1 + 0.1 * 0.05 / 0.06)
    close(x1["w"], x1_exp)
    close(s1["m"]["w"], m1)
    close(s1["v"]["w"], v1)
    m2 = [0.9 * m + 0.1 * d for m, d in zip(m1, D2)]
    v2 = [0.99 * v + 0.01 * d * d for v, d in zip(v1, D2)]
    close(s2["m"]["w"], m2)
    close(s2["v"]["w"], v2)
    close(x2["w"], [x + 0.1 * m / (math.sqrt(v) + 0.01) for x, m, v in zip(x1_exp, m2, v2)])
    # integer buffers follow the average
    assert x2["count"].item() == 4


def test_fedyogi_two_steps():
    x1, s1, x2, s2 = two_steps("yogi")
    d1 = [0.5, -1.0, 0.0]
    m1 = [0.1 * d for d in d1]
    # v_1 = v_0 - (1 - beta2) * Delta^2 * sign(v_0 - Delta^2) with v_0 = 0: sign(-Delta^2) = -1 (0
    # for Delta = 0)
    v1 = [0.01 * 0.25, 0.01 * 1.0, 0.0]
    close(s1["v"]["w"], v1)
    x1_exp = [x + 0.1 * m / (math.sqrt(v) + 0.01) for x, m, v in zip(X0, m1, v1)]
    close(x1["w"], x1_exp)
    # round 2: v_1 - Delta_2^2 = [0.0025 - 0.04, 0.01 - 0.16, 0 - 0.09] all < 0 -> v grows by 0.01 *
    # Delta^2
    v2 = [0.0025 + 0.01 * 0.04, 0.01 + 0.01 * 0.16, 0.0 + 0.01 * 0.09]
    m2 = [0.9 * m + 0.1 * d for m, d in zip(m1, D2)]
    close(s2["v"]["w"], v2)
    close(x2["w"], [x + 0.1 * m / (math.sqrt(v) + 0.01) for x, m, v in zip(x1_exp, m2, v2)])


def test_fedyogi_shrinks_v_when_it_exceeds_delta_squared():
    state = {
        "m": {"w": torch.zeros(1, dtype=torch.float64)},
        "v": {"w": torch.tensor([1.0], dtype=torch.float64)},
    }
    # Delta = 0.5 -> Delta^2 = 0.25 < v = 1: v_new = 1 - 0.01 * 0.25 * (+1) = 0.9975 (Adam would
    # give 0.9925)
    _, new = server_step(
        "yogi",
        {"w": torch.tensor([0.0], dtype=torch.float64)},
        {"w": torch.tensor([0.5], dtype=torch.float64)},
        state,
        OPT,
    )
    assert new["v"]["w"].item() == pytest.approx(0.9975)


def test_fedadagrad_two_steps():
    x1, s1, x2, s2 = two_steps("adagrad")
    d1 = [0.5, -1.0, 0.0]
    m1 = [0.1 * d for d in d1]
    v1 = [0.25, 1.0, 0.0]  # v_0 + Delta^2
    close(s1["v"]["w"], v1)
    x1_exp = [x + 0.1 * m / (math.sqrt(v) + 0.01) for x, m, v in zip(X0, m1, v1)]
    # element 1: -2 + 0.1 * (-0.1) / 1.01
    assert x1_exp[1] == pytest.approx(-2 - 0.01 / 1.01)
    close(x1["w"], x1_exp)
    v2 = [0.25 + 0.04, 1.0 + 0.16, 0.0 + 0.09]
    m2 = [0.9 * 0.05 + 0.1 * 0.2, 0.9 * -0.1 + 0.1 * 0.4, 0.9 * 0.0 + 0.1 * -0.3]
    close(s2["v"]["w"], v2)
    close(s2["m"]["w"], m2)
    close(x2["w"], [x + 0.1 * m / (math.sqrt(v) + 0.01) for x, m, v in zip(x1_exp, m2, v2)])


def test_fedavgm_two_steps():
    x1, s1, x2, s2 = two_steps("avgm")
    # m_1 = 0.5 * 0 + Delta_1; x_1 = x_0 + 2.0 * m_1
    close(s1["m"]["w"], [0.5, -1.0, 0.0])
    close(x1["w"], [1.0 + 2 * 0.5, -2.0 + 2 * -1.0, 0.5])
    # m_2 = 0.5 * m_1 + Delta_2 = [0.45, -0.1, -0.3]; x_2 = x_1 + 2 * m_2
    close(s2["m"]["w"], [0.45, -0.1, -0.3])
    close(x2["w"], [2.0 + 0.9, -4.0 - 0.2, 0.5 - 0.6])
    assert s2["v"] == {}


def test_fedavgm_with_unit_lr_and_no_momentum_is_fedavg():
    opt = FedOptConfig(momentum=0.0, avgm_server_lr=1.0)
    x, _ = server_step("avgm", params(X0), params(AVG1), {"m": {}, "v": {}}, opt)
    close(x["w"], AVG1)


def test_server_step_does_not_modify_inputs():
    x0, avg = params(X0), params(AVG1)
    state = {
        "m": {"w": torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)},
        "v": {"w": torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)},
    }
    server_step("adam", x0, avg, state, OPT)
    close(x0["w"], X0)
    close(state["m"]["w"], [1.0, 1.0, 1.0])
    close(state["v"]["w"], [1.0, 1.0, 1.0])
