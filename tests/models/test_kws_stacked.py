"""The hand-written stacked KWS forms (models/kws_stacked.py) against the per-client modules: the
outputs, every parameter's gradient and BatchNorm's running statistics of K clients with different
weights, in training mode, for each network alone and inside FedKWS-UI's two-head model, on full
and on padded steps; and a 2-round FedKWS-UI run on the stacked path against the sequential one.

Tolerances: in float64 both sides compute the same function to ~1e-13 (relative to each tensor's
largest entry), which is what proves the forms right: 1e-10. In float32 the sums run in another
order (a grouped convolution or batched matmul for the per-client oneDNN call, scaled-dot-product
attention for nn.MultiheadAttention's, the GRU's recurrence for nn.GRU's) and BatchNorm over a batch
of 4 divides by small standard deviations at every layer, so rounding grows with depth: ResNet15's
gradients (up to 13 BatchNorms deep) differ by up to ~3e-2 relative, the others' by < 1e-4. The
float32 case therefore checks outputs to 1e-4 and gradients to 5e-2."""

from __future__ import annotations

import copy

import pytest
import torch

from algorithm_harness import federate, max_diff
from fedac.algorithms.fedkwsui import TwoHeadModel
from fedac.models import KWS_MODELS
from fedac.models.kws_stacked import stacked_kws
from fedac.models.stacked import stack_params

FEATURES, CLASSES, K = 40, 5, 3
TOLS = {torch.float64: (1e-10, 1e-10), torch.float32: (1e-4, 5e-2)}


def frames_for(name: str) -> int:
    return 101 if name == "kwt" else 31


def clients(name: str, two_heads: bool, dtype=torch.float64) -> list[torch.nn.Module]:
    models = []
    for k in range(K):
        torch.manual_seed(k)
        net = KWS_MODELS[name](FEATURES, CLASSES)
        models.append((TwoHeadModel(net, CLASSES) if two_heads else net).train().to(dtype))
    return models


def rel(a: torch.Tensor, b: torch.Tensor, scale: float = 0.0) -> float:
    """Largest difference relative to the reference's largest entry (or `scale` when larger)."""
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max()) / max(float(b.abs().max()), scale, 1e-12)


def check(models, x, method, weight=None):
    """Stacked vs per-client: outputs, gradients of a random projection of them, buffers."""
    out_tol, grad_tol = TOLS[x.dtype]
    form = stacked_kws(models[0])
    assert form is not None
    states = [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in models]
    stacked = stack_params(states)
    leaves = {n: stacked[n].clone().requires_grad_() for n in form.param_names}
    entries = {**stacked, **leaves}
    out = form(entries, x, None, weight, method)
    probe = torch.randn_like(out)
    if weight is not None:  # padding carries weight 0 in every loss
        probe = probe * (weight > 0).view(*weight.shape, *[1] * (out.dim() - 2))
    (out * probe).sum().backward()
    for k, model in enumerate(models):
        rows = slice(None) if weight is None else weight[k] > 0
        fn = model.embed if method == "embed" else model
        mine = fn(x[k][rows])
        assert rel(out[k][rows], mine) < out_tol, method
        model.zero_grad()
        (mine * probe[k][rows]).sum().backward()
        # relative to the model's largest gradient entry: a convolution's bias before BatchNorm has
        # a zero gradient in exact arithmetic, so both sides are rounding noise (~1e-7) there
        scale = max(float(p.grad.abs().max()) for p in model.parameters() if p.grad is not None)
        for n, p in model.named_parameters():
            if p.grad is None:  # not on this method's path (the head of `embed`)
                grad = leaves[n].grad
                assert grad is None or not grad[k].any(), n
                continue
            assert leaves[n].grad is not None, n
            assert rel(leaves[n].grad[k], p.grad, 1e-3 * scale) < grad_tol, (n, k)
        for n, b in model.named_buffers():
            assert torch.allclose(entries[n][k].double(), b.double(), rtol=1e-5, atol=1e-6), n


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("two_heads", [False, True], ids=["plain", "two-head"])
@pytest.mark.parametrize("name", list(KWS_MODELS))
def test_stacked_kws_form_equals_the_per_client_modules(name, two_heads, dtype):
    models = clients(name, two_heads, dtype)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(K, 4, FEATURES, frames_for(name), generator=g, dtype=dtype)
    check(models, x, "forward")
    check(copy.deepcopy(models), x, "embed")


@pytest.mark.parametrize("name", ["dscnn", "resnet15", "mhattrnn"])
def test_padded_steps_take_batch_statistics_over_real_samples_only(name):
    models = clients(name, True)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(K, 4, FEATURES, frames_for(name), generator=g, dtype=torch.float64)
    weight = torch.tensor([[0.25] * 4, [1 / 3] * 3 + [0.0], [0.5, 0.5, 0.0, 0.0]])
    check(models, x, "forward", weight)


def test_two_head_methods_and_unknown_ones():
    models = clients("dscnn", True)
    form = stacked_kws(models[0])
    assert form is not None
    stacked = stack_params([m.state_dict() for m in models])
    z = torch.randn(K, 2, models[0].embedding_dim, dtype=torch.float64)
    for method in ("global_logits", "private_logits"):
        got = form(stacked, z, method=method)
        for k, m in enumerate(models):
            assert rel(got[k], getattr(m, method)(z[k])) < 1e-10
    with pytest.raises(Exception, match="no method 'classify'"):
        form(stacked, z, method="classify")
    assert stacked_kws(torch.nn.Linear(2, 2)) is None


def fedkwsui(model: str, execution: str, clients_: list):
    from fedac.algorithms import build_algorithm
    from fedac.algorithms.base import Task
    from fedac.config import load_config

    counts = [torch.bincount(c.y, minlength=CLASSES).tolist() for c in clients_]
    cfg = load_config(
        overrides=[
            "algorithm=fedkwsui",
            f"model.name={model}",
            "train.batch_size=4",
            "runtime.device=cpu",
            "train.max_grad_norm=50",
            "fedkwsui.local_steps=2",
            f"runtime.execution={execution}",
        ]
    )
    return build_algorithm(cfg, Task(FEATURES, CLASSES, [c.name for c in clients_], counts))


def fedkwsui_clients(model: str) -> list:
    from fedac.algorithms.base import ClientData

    g = torch.Generator().manual_seed(4)
    frames = frames_for(model)
    return [  # unequal sizes: padded steps, BatchNorm over each client's real samples
        ClientData(
            f"c{i}",
            torch.randn(n, FEATURES, frames, generator=g),
            torch.randint(0, CLASSES, (n,), generator=g),
            torch.zeros(0, FEATURES, frames),
            torch.zeros(0, dtype=torch.long),
        )
        for i, n in enumerate([7, 5, 3])
    ]


#: Relative tolerance of two FedKWS-UI rounds, stacked against sequential: float32 rounding, which
#: BatchNorm over 3-7 clips amplifies. ResNet15 (11 BatchNorm layers) differed by 1.8e-3 of its
#: largest weight under PyTorch's AVX2 kernels (ATEN_CPU_CAPABILITY=avx2 on an AVX-512 Xeon; the
#: float64 forward test above shows the two forms equal), so its tolerance is 5e-3, as MOON's is.
FEDKWSUI_TOLERANCE = {"resnet15": 5e-3}


@pytest.mark.parametrize("name", list(KWS_MODELS))
def test_two_fedkwsui_rounds_train_stacked_as_they_train_alone(name):
    """Two FedKWS-UI rounds (private phase, ALT, ALO loss, clipping, server mean) on the stacked
    form and on the sequential path: the same global model to float32 rounding (float64 shows the
    forms exact; BatchNorm over 3-4 clips amplifies float32's)."""
    data = fedkwsui_clients(name)
    stacked = fedkwsui(name, "cohort", data)
    assert stacked.stacked_kind(name) == "kws"
    server_s, states_s, _ = federate(stacked, data)
    server_q, _, _ = federate(fedkwsui(name, "sequential", data), data)
    scale = max(float(v.abs().max()) for v in server_q["params"].values() if v.is_floating_point())
    tolerance = FEDKWSUI_TOLERANCE.get(name, 1e-3)
    assert max_diff(server_q["params"], server_s["params"]) <= tolerance * max(scale, 1.0)


@pytest.mark.parametrize("faster", ["stacked", "sequential"])
def test_auto_times_the_hand_written_form_and_says_what_it_chose(
    faster, monkeypatch, capsys, tmp_path
):
    """Under auto a KWS network's hand-written form is timed against the sequential path (a fake
    clock makes either faster): the faster one trains, and the run prints the measurement."""
    from fedac.engine import execution

    data = fedkwsui_clients("mhattrnn")
    alg = fedkwsui("mhattrnn", "auto", data)

    plan = execution.ExecutionPlan(alg, execution.ProbeCache(tmp_path))  # a run's (rank 0's)
    assert plan.vmapped == ["mhattrnn"] and plan.needs_probe
    stacked_s, sequential_s = (1.0, 3.0) if faster == "stacked" else (3.0, 1.0)
    clock = iter([0.0, stacked_s, 10.0, 10.0 + sequential_s])
    monkeypatch.setattr(execution, "_now", lambda device: next(clock))
    plan.run(alg.broadcast(alg.init_server()), [None] * 3, data, 1, 0)
    printed = capsys.readouterr().err
    if faster == "stacked":
        assert plan.path == "stacked"
        assert plan.verdict.startswith(
            "stacked: auto measured model mhattrnn's stacked path (kws) faster on cpu: 1.00 s "
            "against 3.00 s"
        )
    else:
        assert plan.path.startswith(
            "sequential: auto measured model mhattrnn's stacked path (kws) slower"
        )
    assert f"fedac: clients train {plan.verdict}" in printed


@pytest.mark.parametrize("name", ["dscnn", "kwt", "mhattrnn"])
def test_under_bf16_autocast_the_forms_compute_as_the_modules_do(name):
    """runtime.precision=bf16 runs the forms under autocast as it runs the per-client modules
    (MHAttRNN's GRU in fp32): the logits agree to bf16's rounding (8 bits of mantissa: 5e-2 of
    the largest logit), and they differ from fp32's (autocast is in effect)."""
    models = clients(name, False, torch.float32)
    form = stacked_kws(models[0])
    assert form is not None
    stacked = stack_params([{k: v.clone() for k, v in m.state_dict().items()} for m in models])
    x = torch.randn(K, 4, FEATURES, frames_for(name), generator=torch.Generator().manual_seed(5))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = form(stacked, x)
        alone = [m(x[k]) for k, m in enumerate(models)]
    fp32 = form(stack_params([m.state_dict() for m in clients(name, False, torch.float32)]), x)
    for k in range(K):
        assert rel(out[k].float(), alone[k].float()) < 5e-2
    assert not torch.equal(out.float(), fp32)
