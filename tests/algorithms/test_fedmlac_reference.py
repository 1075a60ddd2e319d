"""One full FedMLAC client update (Algorithm 1: two batches, personalized step then Plug-in step)
written out step by step (two batches, 3 and 2 clips), against both the sequential (`client_update`)
and the cohort (`cohort_update`) paths.

The reference calls none of fedac's model, loss or optimizer code: the CRNN-Tiny forward (conv,
ReLU, ceil-mode max-pool, GRU cell, mean over time, head), the softmaxes, cross-entropy, the KL
terms of Eq. 8-9 with temperature and SGD with momentum and weight decay are all spelled out below
on plain tensors, so a bug in the shared loss code (distillation_kl, personalized_loss, plugin_loss,
local.cross_entropy) shows on both paths instead of passing their comparison with each other.
"""

from __future__ import annotations

import pytest
import torch

from fedac.algorithms.base import ClientData, Task
from fedac.algorithms.fedmlac import FedMLAC
from fedac.config import load_config
from fedac.seeding import torch_generator
from fedac.training.step import train_client

FEATURES, FRAMES, CLASSES, HIDDEN, CHANNELS = 3, 5, 3, 32, 16
LR, MOMENTUM, WEIGHT_DECAY = 0.1, 0.9, 0.01
SEED, ROUND = 4, 2
SHAPES = {
    "conv.0.weight": (CHANNELS, FEATURES, 5),
    "conv.0.bias": (CHANNELS,),
    "rnn.weight_ih_l0": (3 * HIDDEN, CHANNELS),
    "rnn.weight_hh_l0": (3 * HIDDEN, HIDDEN),
    "rnn.bias_ih_l0": (3 * HIDDEN,),
    "rnn.bias_hh_l0": (3 * HIDDEN,),
    "head.weight": (CLASSES, HIDDEN),
    "head.bias": (CLASSES,),
}


def hand_set(phase: float, scale: float) -> dict[str, torch.Tensor]:
    """Weights by formula: a sine over each tensor's entries (no RNG)."""
    out = {}
    for i, (name, shape) in enumerate(SHAPES.items()):
        n = torch.tensor(shape).prod().item()
        out[name] = (
            scale * torch.sin(torch.arange(n, dtype=torch.float32) * 0.731 + phase + i)
        ).reshape(shape)
    return out


OMEGA0 = hand_set(0.0, 0.4)  # the client's own model
THETA0 = hand_set(1.3, 0.5)  # the global Plug-in it receives
X = (
    torch.cos(torch.arange(5 * FEATURES * FRAMES, dtype=torch.float32) * 0.53).reshape(
        5, FEATURES, FRAMES
    )
    * 2.0
)
Y = torch.tensor([0, 1, 2, 2, 1])
CLIENT = ClientData("spk", X, Y, torch.zeros(0, FEATURES, FRAMES), torch.zeros(0, dtype=torch.long))
# On the cohort path a larger client trains alongside, so the client's short second batch (2 of 3)
# is padded inside the stacked step.
COMPANION = ClientData(
    "big",
    torch.sin(torch.arange(6 * FEATURES * FRAMES, dtype=torch.float32)).reshape(
        6, FEATURES, FRAMES
    ),
    torch.tensor([2, 0, 1, 1, 0, 2]),
    torch.zeros(0, FEATURES, FRAMES),
    torch.zeros(0, dtype=torch.long),
)


# --- the reference --------------------------------------------------------------------------------


def crnn_tiny(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """(batch, features, frames) -> logits, CRNN-Tiny of fedmlac.md Table 3 without dropout."""
    h = torch.nn.functional.conv1d(x, p["conv.0.weight"], p["conv.0.bias"], padding=2).clamp_min(
        0.0
    )
    if h.shape[-1] % 2:  # ceil-mode pooling: the odd last frame is its own window (values are >= 0)
        h = torch.cat([h, torch.zeros_like(h[..., :1])], dim=-1)
    h = h.view(*h.shape[:2], -1, 2).amax(-1).transpose(1, 2)  # (batch, frames / 2, channels)
    w_ir, w_iz, w_in = p["rnn.weight_ih_l0"].chunk(3)
    w_hr, w_hz, w_hn = p["rnn.weight_hh_l0"].chunk(3)
    b_ir, b_iz, b_in = p["rnn.bias_ih_l0"].chunk(3)
    b_hr, b_hz, b_hn = p["rnn.bias_hh_l0"].chunk(3)
    state = torch.zeros(x.shape[0], HIDDEN)
    outputs = []
    for t in range(h.shape[1]):
        xt = h[:, t]
        r = torch.sigmoid(xt @ w_ir.T + b_ir + state @ w_hr.T + b_hr)
        z = torch.sigmoid(xt @ w_iz.T + b_iz + state @ w_hz.T + b_hz)
        n = torch.tanh(xt @ w_in.T + b_in + r * (state @ w_hn.T + b_hn))
        state = (1 - z) * n + z * state
        outputs.append(state)
    return torch.stack(outputs, 1).mean(1) @ p["head.weight"].T + p["head.bias"]


def log_softmax(z: torch.Tensor) -> torch.Tensor:
    return z - torch.logsumexp(z, dim=-1, keepdim=True)


def ce(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Batch mean of -log p(y)."""
    return -log_softmax(z)[torch.arange(len(y)), y].mean()


def kl(teacher: torch.Tensor, student: torch.Tensor, t: float) -> torch.Tensor:
    """T^2 * batch mean of sum_c p_t(c) log(p_t(c) / p_s(c)) on logits / T (Eq. 5, Hinton scaling);
    the teacher is a constant."""
    log_pt, log_ps = log_softmax(teacher.detach() / t), log_softmax(student / t)
    return t * t * (log_pt.exp() * (log_pt - log_ps)).sum(-1).mean()


class SGD:
    """d = g + wd * w; buf = d on the first step, then momentum * buf + d; w <- w - lr * buf."""

    def __init__(self):
        self.buf: dict[str, torch.Tensor] = {}

    def step(
        self, params: dict[str, torch.Tensor], grads: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        new = {}
        for k, w in params.items():
            d = grads[k] + WEIGHT_DECAY * w
            self.buf[k] = d if k not in self.buf else MOMENTUM * self.buf[k] + d
            new[k] = (w - LR * self.buf[k]).detach()
        return new


def grads(loss: torch.Tensor, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return dict(zip(params, torch.autograd.grad(loss, list(params.values()))))


def reference_update(alpha: float, temperature: float, ce_weight: float, teacher: str):
    omega, theta = dict(OMEGA0), dict(THETA0)
    opt_omega, opt_theta = SGD(), SGD()
    # batch order only
    order = torch.randperm(5, generator=torch_generator(SEED, "batches", ROUND, CLIENT.name))
    losses, plugin_losses = [], []
    for idx in order.split(3):
        x, y = X[idx], Y[idx]
        # Eq. 8: the personalized step, the Plug-in a fixed teacher
        omega = {k: v.detach().requires_grad_() for k, v in omega.items()}
        omega_logits = crnn_tiny(omega, x)
        theta_logits = crnn_tiny(theta, x).detach()
        loss = alpha * ce(omega_logits, y) + (1 - alpha) * kl(
            theta_logits, omega_logits, temperature
        )
        omega = opt_omega.step(omega, grads(loss, omega))
        # Eq. 9: the Plug-in step, the personalized model the teacher (before or after its step)
        teacher_logits = (
            omega_logits.detach() if teacher == "pre_update" else crnn_tiny(omega, x).detach()
        )
        theta = {k: v.detach().requires_grad_() for k, v in theta.items()}
        student = crnn_tiny(theta, x)
        plugin = kl(teacher_logits, student, temperature) + ce_weight * ce(student, y)
        theta = opt_theta.step(theta, grads(plugin, theta))
        losses.append(float(loss.detach()))
        plugin_losses.append(float(plugin.detach()))
    return omega, theta, sum(losses) / 2, sum(plugin_losses) / 2


# --- the comparison -------------------------------------------------------------------------------

CASES = {
    "paper": dict(alpha=0.5, temperature=1.0, ce_weight=0.0, teacher="pre_update"),
    "softened": dict(alpha=0.3, temperature=2.0, ce_weight=0.5, teacher="post_update"),
}


def fedmlac(case: dict, execution: str) -> FedMLAC:
    cfg = load_config(
        overrides=[
            "model.client_model=crnn_tiny",
            "fedmlac.plugin_model=crnn_tiny",
            "model.dropout=0",
            f"train.lr={LR}",
            f"train.momentum={MOMENTUM}",
            f"train.weight_decay={WEIGHT_DECAY}",
            "train.batch_size=3",
            "train.local_epochs=1",
            f"runtime.execution={execution}",
            f"fedmlac.alpha={case['alpha']}",
            f"fedmlac.temperature={case['temperature']}",
            f"fedmlac.plugin_ce_weight={case['ce_weight']}",
            f"fedmlac.teacher={case['teacher']}",
            "fedmlac.ml=true",
        ]
    )
    return FedMLAC(cfg, Task(FEATURES, CLASSES, [CLIENT.name, COMPANION.name]))


def run_path(case: dict, path: str):
    algo = fedmlac(case, path)
    if path == "sequential":
        return train_client(algo, dict(THETA0), dict(OMEGA0), CLIENT, ROUND, SEED)
    results = algo.cohort_update(
        dict(THETA0), [dict(OMEGA0), hand_set(2.1, 0.3)], [CLIENT, COMPANION], ROUND, SEED
    )
    return results[0]


@pytest.mark.parametrize("path", ["sequential", "cohort"])
@pytest.mark.parametrize("case", list(CASES))
def test_client_update_matches_the_written_out_reference(case, path):
    omega, theta, loss, plugin_loss = reference_update(**CASES[case])
    result = run_path(CASES[case], path)
    for name in SHAPES:
        assert torch.allclose(result.state[name], omega[name], atol=1e-5, rtol=1e-4), (
            f"omega {name}"
        )
        assert torch.allclose(result.upload[name], theta[name], atol=1e-5, rtol=1e-4), (
            f"theta {name}"
        )
    assert result.metrics["loss"] == pytest.approx(loss, rel=1e-5)
    assert result.metrics["plugin_loss"] == pytest.approx(plugin_loss, rel=1e-5)


def test_reference_is_sensitive_to_what_it_checks():
    """Two batches really moved both models, far beyond the comparison's tolerance, and each case
    exercises the loss terms differently."""
    paper, softened = reference_update(**CASES["paper"]), reference_update(**CASES["softened"])
    for params, start in ((paper[0], OMEGA0), (paper[1], THETA0)):
        assert max(float((params[k] - start[k]).abs().max()) for k in SHAPES) > 1e-2
    assert max(float((paper[1][k] - softened[1][k]).abs().max()) for k in SHAPES) > 1e-2
    assert min(paper[3], softened[3]) > 1e-3 and abs(paper[2] - softened[2]) > 1e-3
