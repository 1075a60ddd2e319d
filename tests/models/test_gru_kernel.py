"""The fused stacked GRU (fedac/kernels/gru.cpp) against independent references: torch's nn.GRU
(values and gradients, autograd through torch's own GRU) and the pure-torch recurrence of
models/stacked.py; and the choice between them (`runtime.gru_kernel`), including the fallback when
the build fails."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from fedac import kernels
from fedac.errors import ConfigError
from fedac.models.stacked import _GRULayer, _recurrence_backward, _recurrence_forward

SUPPORTED = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
#: Every build this CPU runs (an AVX-512 CPU runs the AVX2 build too): each is checked, not only the
#: one a run here would pick, so an AVX2 machine's build is tested on an AVX-512 one.
BUILDS = {"AVX2": ["AVX2"], "AVX512": ["AVX512", "AVX2"]}.get(
    torch.backends.cpu.get_cpu_capability(), []
)


@pytest.fixture
def fused(monkeypatch):
    """The build a run here uses (`runtime.gru_kernel=fused`)."""
    if not SUPPORTED:
        pytest.skip(
            "the fused GRU is built for AVX2 and AVX-512 CPUs; this one runs the pure-torch path"
        )
    monkeypatch.setitem(kernels._state, "mode", "fused")
    module = kernels.fused_gru()
    assert module is not None, kernels._state["error"]  # it must build where it is supported
    return module


@pytest.fixture(params=["AVX2", "AVX512"])
def build(request):
    """Each build of gru.cpp this CPU can run (the AVX2 one compiles on first use here, about a
    minute)."""
    if request.param not in BUILDS:
        pytest.skip(
            f"torch reports CPU capability {torch.backends.cpu.get_cpu_capability()}: "
            f"no {request.param} build here"
        )
    return kernels._build(capability=request.param)


def stacked_gru(grus: list[nn.GRU], x: torch.Tensor):
    """models/stacked.py's GRU over K clients (each with its own nn.GRU's weights); x (K, B, T,
    C)."""
    k, b, t, c = x.shape
    frames = x.transpose(1, 2).reshape(k, t * b, c).requires_grad_()
    suffixes = ["", "_reverse"] if grus[0].bidirectional else [""]
    params = {
        f"{kind}{s}": torch.stack([getattr(g, f"{kind}_l0{s}") for g in grus])
        .detach()
        .requires_grad_()
        for s in suffixes
        for kind in ("weight_ih", "bias_ih", "weight_hh", "bias_hh")
    }
    outs = [
        _GRULayer.apply(
            frames,
            *(params[f"{kind}{s}"] for kind in ("weight_ih", "bias_ih", "weight_hh", "bias_hh")),
            t,
            bool(s),
        )
        for s in suffixes
    ]
    out = torch.cat(outs, dim=3).transpose(1, 2)  # (K, T, B, H) -> (K, B, T, H * directions)
    return out, frames, params


@pytest.mark.parametrize(
    "k,b,t,c,hidden,bidirectional",
    [
        (3, 4, 13, 8, 128, True),  # CRNN-Base's hidden size
        (2, 16, 26, 32, 64, False),  # CRNN-Lite's
        (
            2,
            3,
            7,
            5,
            20,
            True,
        ),  # hidden not a multiple of the 8 (AVX2) or 16 (AVX-512) vector lanes
        (1, 2, 1, 4, 12, True),  # one step
    ],
)
def test_fused_gru_matches_nn_gru_values_and_gradients(fused, k, b, t, c, hidden, bidirectional):
    assert kernels.recurrence_kernel("cpu") is fused  # what _GRULayer runs below
    torch.manual_seed(k * 100 + t)
    grus = [nn.GRU(c, hidden, batch_first=True, bidirectional=bidirectional) for _ in range(k)]
    x = torch.randn(k, b, t, c)
    out, frames, params = stacked_gru(grus, x)
    grad = torch.randn_like(out)
    got = torch.autograd.grad((out * grad).sum(), [frames, *params.values()])
    for i, gru in enumerate(grus):
        xi = x[i].clone().requires_grad_()
        expected, _ = gru(xi)
        assert torch.allclose(out[i], expected, atol=1e-6, rtol=1e-5)
        ref = torch.autograd.grad((expected * grad[i]).sum(), [xi, *gru.parameters()])
        grad_x = got[0][i].view(t, b, c).transpose(0, 1)
        assert torch.allclose(grad_x, ref[0], atol=1e-5, rtol=1e-4)
        names = [n for n, _ in gru.named_parameters()]
        for name, r in zip(names, ref[1:]):
            key = name.replace("_l0", "")
            assert torch.allclose(got[1 + list(params).index(key)][i], r, atol=1e-5, rtol=1e-4), (
                name
            )


# a partial last vector in both builds; CRNN-Base's hidden size
@pytest.mark.parametrize("h", [24, 128])
@pytest.mark.parametrize("reverse", [False, True])
def test_fused_recurrence_equals_the_pure_torch_one(build, reverse, h):
    fused = build
    torch.manual_seed(3)
    k, t, b = 3, 9, 5
    # recurrent weights scaled ~ 1 / sqrt(h), as nn.GRU initializes them (0.3 at h = 24)
    gi, b_hh = torch.randn(k, t, b, 3 * h), torch.randn(k, 3 * h)
    w_hh = torch.randn(k, 3 * h, h) * 0.3 * (24 / h) ** 0.5
    w_t = w_hh.transpose(1, 2).contiguous()
    ref = _recurrence_forward(gi, w_t, b_hh, reverse)
    got = fused.forward(gi, w_t, b_hh, reverse)
    for a, e in zip(got, ref):
        assert a.shape == e.shape and torch.allclose(a, e, atol=1e-6)
    grad_out = torch.randn(k, t, b, h)
    for a, e in zip(
        fused.backward(grad_out, *ref, w_hh, reverse),
        _recurrence_backward(grad_out, *ref, w_hh, reverse),
    ):
        assert torch.allclose(a, e, atol=1e-5, rtol=1e-5)
    gi[0, 0, 0, 0] = float("nan")  # NaN propagates (the engine rejects non-finite uploads)
    assert torch.isnan(fused.forward(gi, w_t, b_hh, reverse)[0][0]).any()


@pytest.mark.skipif("AVX512" not in BUILDS, reason="needs a CPU that runs both builds")
def test_the_avx2_and_avx512_builds_agree_bit_for_bit():
    """The two widths run the same per-element code (Sleef's 8- and 16-lane exp / tanh are one
    algorithm, the same fused multiply-adds), so a machine's choice of build does not move a run's
    numbers; only the ATen matmuls around them may differ between machines."""
    avx2, avx512 = kernels._build(capability="AVX2"), kernels._build(capability="AVX512")
    torch.manual_seed(5)
    k, t, b, h = 2, 11, 3, 40  # 40: two full AVX-512 vectors and a partial one, five AVX2 vectors
    gi, w_hh, b_hh = (
        torch.randn(k, t, b, 3 * h),
        torch.randn(k, 3 * h, h) * 0.2,
        torch.randn(k, 3 * h),
    )
    w_t = w_hh.transpose(1, 2).contiguous()
    grad_out = torch.randn(k, t, b, h)
    for reverse in (False, True):
        fwd = [m.forward(gi, w_t, b_hh, reverse) for m in (avx2, avx512)]
        bwd = [m.backward(grad_out, *f, w_hh, reverse) for m, f in zip((avx2, avx512), fwd)]
        for x, y in zip(fwd[0] + bwd[0], fwd[1] + bwd[1]):
            assert torch.equal(x, y)


def test_kernel_modes_and_the_fallback_when_the_build_fails(monkeypatch, caplog):
    monkeypatch.setitem(kernels._state, "mode", "auto")
    kernels.set_gru_kernel("torch")
    assert kernels.fused_gru() is None and kernels.status()["fused_gru"] is False
    with pytest.raises(ConfigError, match="runtime.gru_kernel"):
        kernels.set_gru_kernel("cuda")

    def broken(verbose=False):
        raise RuntimeError("no compiler")

    for key, value in {"module": None, "error": None, "tried": False}.items():
        monkeypatch.setitem(kernels._state, key, value)
    monkeypatch.setattr(kernels, "_build", broken)
    with caplog.at_level(logging.WARNING, logger="fedac.kernels"):
        kernels.set_gru_kernel("auto")
        assert kernels.fused_gru() is None
    assert "pure-torch GRU" in caplog.text and "no compiler" in caplog.text  # the run says so
    assert kernels.status()["error"] == "RuntimeError: no compiler"
    with pytest.raises(ConfigError, match="did not build: RuntimeError: no compiler"):
        kernels.set_gru_kernel("fused")


def _load_kernel_in_subprocess(path_env: str) -> str:
    """stderr of a fresh process that loads the kernel with this PATH (as a shell with or without
    the venv's bin directory first would)."""
    import os
    import subprocess
    import sys

    code = (
        "import logging; logging.basicConfig(level=logging.WARNING)\n"
        "import fedac.kernels as k; assert k.fused_gru() is not None, k.status()"
    )
    env = {**os.environ, "PATH": path_env}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return done.stderr


@pytest.mark.slow
def test_the_kernel_builds_once_whatever_ninja_path_finds(fused):
    """Issue 43: a checkout used with and without .venv/bin on PATH saw two ninjas take turns
    rebuilding gru.o ("command line changed"). The build folder is keyed by the toolchain and the
    pip ninja always runs, so a second process, with PATH reordered, loads the same .so without
    compiling (and a real build always says so)."""
    import os
    import sys

    capability = kernels.status()["capability"]
    so = kernels.build_dir(capability) / f"{kernels.module_name(capability)}.so"
    assert so.is_file()
    before = so.stat().st_mtime_ns
    venv_bin = os.path.dirname(sys.executable)
    system_first = os.pathsep.join(["/usr/bin", "/bin", venv_bin])
    venv_first = os.pathsep.join([venv_bin, "/usr/bin", "/bin"])
    for path_env in (system_first, venv_first, system_first):
        stderr = _load_kernel_in_subprocess(path_env)
        assert "building the fused GRU" not in stderr, stderr
    assert so.stat().st_mtime_ns == before  # nothing was recompiled
    assert kernels.build_key() == kernels.build_key()  # (stable within a process)


def test_two_checkouts_of_one_source_build_in_two_folders(monkeypatch, tmp_path):
    """ninja's build file names the source's path: a worktree linking the main checkout's build
    folder rebuilt its kernel, and the main one rebuilt it back. The key tells the paths apart and
    nothing else (the same bytes elsewhere are another key; the same path is the same key)."""
    here = kernels.build_key("AVX2")
    copy = tmp_path / "gru.cpp"
    copy.write_bytes(kernels._SOURCE.read_bytes())
    monkeypatch.setattr(kernels, "_SOURCE", copy)
    elsewhere = kernels.build_key("AVX2")
    assert elsewhere != here
    assert kernels.build_key("AVX2") == elsewhere


def test_a_missing_build_is_announced(monkeypatch, tmp_path, caplog):
    """Every real build says so (not only the first): an empty key folder means a build and a
    message."""
    monkeypatch.setattr(kernels, "build_dir", lambda capability=None: tmp_path / "empty-key")

    def fake_load(name, sources, build_directory, verbose, extra_cflags):
        return "module"

    import torch.utils.cpp_extension as ext

    monkeypatch.setattr(ext, "load", fake_load)
    if not SUPPORTED:
        pytest.skip("the fused GRU is built for AVX2 and AVX-512 CPUs")
    with caplog.at_level(logging.WARNING, logger="fedac.kernels"):
        assert kernels._build() == "module"
    assert "building the fused GRU kernel" in caplog.text


def test_the_build_follows_torchs_cpu_capability(monkeypatch):
    """AVX-512 where torch's kernels run AVX-512 (an AVX2-only build ran the gate passes at half
    width there), AVX2 where torch says AVX2 or FEDAC_GRU_CAPABILITY=avx2 asks for it, none for
    DEFAULT; each build with the flags torch compiles that capability with, under its own name and
    key."""
    loads = []

    def fake_load(name, sources, build_directory, verbose, extra_cflags):
        loads.append((name, build_directory, extra_cflags))
        return name

    import torch.utils.cpp_extension as ext

    monkeypatch.setattr(ext, "load", fake_load)
    monkeypatch.delenv(kernels.CAPABILITY_ENV, raising=False)
    for reported, forced, expected in [
        ("AVX512", None, "AVX512"),
        ("AVX2", None, "AVX2"),
        ("AVX512", "avx2", "AVX2"),
        ("AVX2", "avx512", "AVX2"),
        ("AVX512", "default", "DEFAULT"),
        ("DEFAULT", "avx2", "DEFAULT"),
    ]:
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: reported)
        if forced:
            monkeypatch.setenv(kernels.CAPABILITY_ENV, forced)
        else:
            monkeypatch.delenv(kernels.CAPABILITY_ENV, raising=False)
        assert kernels.cpu_capability() == expected, (reported, forced)
        if expected == "DEFAULT":
            with pytest.raises(
                RuntimeError, match="needs AVX2 or AVX-512; torch reports CPU capability DEFAULT"
            ):
                kernels._build()
        else:
            assert kernels._build() == f"fedac_gru_{expected.lower()}"
            assert f"-DCPU_CAPABILITY_{expected}" in loads[-1][2] and "-mfma" in loads[-1][2]
            assert ("-mavx512f" in loads[-1][2]) == (expected == "AVX512")
    monkeypatch.setenv(kernels.CAPABILITY_ENV, "sse4")
    with pytest.raises(
        ConfigError, match="FEDAC_GRU_CAPABILITY=sse4: expected one of default, avx2, avx512"
    ):
        kernels.cpu_capability()
    # each build keeps its own folder
    assert kernels.build_dir("AVX2") != kernels.build_dir("AVX512")


def test_each_build_runs_its_vector_width(build):
    """The CPU_CAPABILITY_* macro took effect: ATen's Vectorized<float> has 16 lanes in the AVX-512
    build and 8 in the AVX2 one (the -m flags alone would leave 8)."""
    assert build.lanes() == (16 if build.__name__.endswith("avx512") else 8)


def test_a_fresh_process_builds_what_aten_cpu_capability_says():
    """torch's own switch reaches the kernel: ATEN_CPU_CAPABILITY=avx2 loads the AVX2 build (on an
    AVX-512 CPU), =default the pure-torch GRU with a warning."""
    import os
    import subprocess
    import sys

    code = (
        "import logging; logging.basicConfig(level=logging.WARNING)\n"
        "import fedac.kernels as k; m = k.fused_gru(); print(k.status()['capability'], m.lanes() "
        "if m else 0)"
    )
    cases = {"default": "None 0", **({"avx2": "AVX2 8"} if "AVX2" in BUILDS else {})}
    for value, expected in cases.items():
        env = {**os.environ, "ATEN_CPU_CAPABILITY": value}
        env.pop(kernels.CAPABILITY_ENV, None)
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert done.stdout.split() == expected.split(), done.stderr
        if value == "default":
            assert "using the pure-torch GRU" in done.stderr and "capability DEFAULT" in done.stderr


# --- the GPU's kernel (kernels/gru_triton.py), run by Triton's interpreter on the CPU -------------

TRITON_CHECK = r"""
import torch
from fedac import kernels
from fedac.kernels import gru_triton
from fedac.models.stacked import StackedCRNN, _recurrence_backward, _recurrence_forward
from fedac.models.crnn import CRNN_SPECS

torch.manual_seed(0)
for k, t, b, hidden in ((3, 5, 4, 10), (2, 3, 2, 300)):  # 300 hidden units: two thread blocks a row
    for reverse in (False, True):
        gi = torch.randn(k, t, b, 3 * hidden)
        w_hh, b_hh = torch.randn(k, 3 * hidden, hidden) * 0.3, torch.randn(k, 3 * hidden)
        w_t = w_hh.transpose(1, 2).contiguous()
        ref = _recurrence_forward(gi, w_t, b_hh, reverse)
        got = gru_triton.forward(gi, w_t, b_hh, reverse)
        grad_out = torch.randn(k, t, b, hidden)
        for a, e in zip(got + gru_triton.backward(grad_out, *ref, w_hh, reverse),
                        ref + _recurrence_backward(grad_out, *ref, w_hh, reverse)):
            torch.testing.assert_close(a, e, atol=2e-6, rtol=1e-5)

# a stacked CRNN's logits and gradients under runtime.gru_kernel=triton's kernel, against torch's
spec = CRNN_SPECS["crnn_tiny"]
model = StackedCRNN(spec, dropout=0.0)
from fedac.models import build_model
modules = [build_model("crnn_tiny", 8, 5, 0.0) for _ in range(3)]
params = {n: torch.stack([dict(m.named_parameters())[n].detach() for m in modules]).requires_grad_()
          for n, _ in modules[0].named_parameters()}
x = torch.randn(3, 4, 8, 21)
results = {}
for mode in ("torch", "triton"):
    kernels.set_gru_kernel(mode)
    logits = model(params, x)
    grads = torch.autograd.grad(logits.square().sum(), list(params.values()))
    results[mode] = (logits, grads)
torch.testing.assert_close(results["triton"][0], results["torch"][0], atol=1e-5, rtol=1e-5)
for a, e in zip(results["triton"][1], results["torch"][1]):
    torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4)
assert kernels.recurrence_kernel("cpu") is gru_triton
print("ok")
"""


def test_triton_recurrence_equals_the_pure_torch_one_under_the_interpreter():
    pytest.importorskip("triton")
    import os
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", TRITON_CHECK],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TRITON_INTERPRET": "1"},
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_triton_mode_picks_the_gpu_kernel_and_names_what_is_missing(monkeypatch, caplog):
    monkeypatch.setitem(kernels._state, "mode", "auto")
    monkeypatch.setitem(kernels._state, "warned_cpu_triton", False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if pytest.importorskip("triton"):
        from fedac.kernels import gru_triton

        assert kernels.recurrence_kernel("cuda") is gru_triton  # auto on a GPU: Triton
        kernels.set_gru_kernel("triton")
        with caplog.at_level("WARNING", logger="fedac.kernels"):
            # no interpreter: the CPU keeps its own
            assert kernels.recurrence_kernel("cpu") is kernels.fused_gru()
            assert kernels.recurrence_kernel("cpu") is kernels.fused_gru()
        said = [r.getMessage() for r in caplog.records if "gru_kernel=triton" in r.getMessage()]
        assert len(said) == 1 and "CPU's own GRU recurrence" in said[0]  # said once, not per step
        kernels.set_gru_kernel("torch")
        assert (
            kernels.recurrence_kernel("cuda") is None and kernels.recurrence_kernel("cpu") is None
        )
    monkeypatch.setitem(kernels._state, "triton", None)
    monkeypatch.setitem(
        kernels._state, "triton_error", "ModuleNotFoundError: No module named 'triton'"
    )
    kernels.set_gru_kernel("auto")
    assert kernels.recurrence_kernel("cuda") is None  # the pure-torch recurrence
    with pytest.raises(
        ConfigError, match="runtime.gru_kernel=triton, but Triton is not usable here"
    ):
        kernels.set_gru_kernel("triton")


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="compiles the Triton kernel for a GPU (benchmarks/gpu/check.sh)",
)
@pytest.mark.parametrize("reverse", [False, True])
def test_triton_recurrence_on_the_gpu_equals_the_pure_torch_one(reverse):
    from fedac.kernels import gru_triton

    torch.manual_seed(0)
    k, t, b, hidden = 64, 25, 16, 128
    gi, w_hh, b_hh = (
        torch.randn(k, t, b, 3 * hidden, device="cuda"),
        torch.randn(k, 3 * hidden, hidden, device="cuda") * 0.1,
        torch.randn(k, 3 * hidden, device="cuda"),
    )
    w_t = w_hh.transpose(1, 2).contiguous()
    ref = _recurrence_forward(gi, w_t, b_hh, reverse)
    grad_out = torch.randn(k, t, b, hidden, device="cuda")
    for a, e in zip(
        gru_triton.forward(gi, w_t, b_hh, reverse)
        + gru_triton.backward(grad_out, *ref, w_hh, reverse),
        ref + _recurrence_backward(grad_out, *ref, w_hh, reverse),
    ):
        torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4)
