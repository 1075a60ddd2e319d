"""train.device: every tensor of a round follows the run's device (issue 45).

CI has no GPU, so the plumbing is checked with torch's *default* device set to `meta` while a run
trains on the CPU: a tensor created without following the data or the model's device (a factory call
that lost its `device=`, a model built outside `Algorithm.make_model`) lands on `meta`, and the
first operation that meets the run's CPU tensors raises. On a GPU the same mistake would put a
tensor on the CPU next to CUDA ones. The run is built (data loading, features) with the ordinary
default; from its first round to its final evaluation the default is `meta`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from fedac.config import load_config
from fedac.engine.simulator import Simulator
from fedac.errors import ConfigError
from fedac.training.device import resolve_device, to_device
from gsc_fixture import make_gsc_tree

pytestmark = pytest.mark.usefixtures("one_thread")

#: One round of each algorithm, on its default (stacked where it has one) path, plus the layers the
#: engine applies over uploads: robust rules, DP noise and a model-poisoning attack.
CASES = {
    "fedavg": ("fedavg", []),
    "fedavg-sequential": ("fedavg", ["train.execution=sequential"]),
    "fedmlac-two-devices-host": (
        "fedmlac",
        ["train.devices=cpu,cpu", "train.cohort_chunk=1", "train.client_memory=host"],
    ),
    "fedadam-median-dp": (
        "fedadam",
        ["aggregation.method=median", "dp.noise_multiplier=0.5", "dp.clip=1.0"],
    ),
    "fedprox-attack": ("fedprox", ["attack.kind=gaussian", "attack.fraction=0.3"]),
    "fedmlac-lpa": ("fedmlac", ["fedmlac.lpa=true"]),
    "fedkad": ("fedkad", []),
    "fedkwsui-augmented": (
        "fedkwsui",
        ["model.name=dscnn", "data.task=12", "features.style=fedkws", "features.augment=true"],
    ),
    "fedmmd": ("fedmmd", ["model.name=dscnn", "data.task=12"]),
    "central": ("central", ["central.warmup_epochs=0"]),
    "earlyexit": ("earlyexit", ["model.name=w2v2_tiny", "train.batch_size=4"]),
}


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return make_gsc_tree(tmp_path_factory.mktemp("device_gsc"), speakers=8, clips=2)


def simulator(tree, out, algorithm, extra):
    cfg = load_config(
        overrides=[
            f"data.root={tree}",
            f"data.cache_dir={tree}/../cache",
            "model.name=crnn_tiny",
            "train.fraction=0.5",
            "train.rounds=1",
            "train.local_epochs=1",
            "train.cohort_workers=1",
            "train.device=cpu",
            *extra,
        ],
        algorithm=algorithm,
    )
    return Simulator(cfg, out, progress=False)


@contextmanager
def meta_default_device():
    """torch's default device set to meta (the module docstring says why), with one exception that
    is torch's, not fedac's: Adam (and AdamW, its subclass) keeps its `step` counter on the CPU on
    purpose ("special device hosting for step" in torch/optim/adam.py). torch 2.13 creates it with
    device="cpu"; torch 2.11 leaves it to the default device, so under meta the first step's
    `.item()` failed there (the zero-shot test). Adam's state is therefore set up with the CPU as
    default, as 2.13 says explicitly; every other factory call, fedac's included, still meets
    meta."""
    init_group = torch.optim.Adam._init_group

    def cpu_hosted_step(self, *args, **kwargs):
        # factory calls without device= only; zeros_like(p) still follows p
        with torch.device("cpu"):
            return init_group(self, *args, **kwargs)

    torch.optim.Adam._init_group = cpu_hosted_step
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device(None)
        torch.optim.Adam._init_group = init_group


def run_on_meta_default(runner):
    """`runner.run()` under `meta_default_device()`."""
    with meta_default_device():
        return runner.run()


def test_the_meta_default_spares_only_torchs_cpu_hosted_adam_step():
    """Adam steps under the meta default on any torch (2.11's step counter followed the default
    device), and a factory call without device= still lands on meta, so the check below keeps its
    teeth."""
    x = torch.zeros(3, requires_grad=True)
    optimizer = torch.optim.Adam([x], lr=0.1)
    with meta_default_device():
        x.grad = torch.ones(3, device="cpu")
        optimizer.step()
        assert torch.zeros(1).device.type == "meta"
    assert (
        optimizer.state[x]["step"].device.type == "cpu" and optimizer.state[x]["step"].item() == 1.0
    )
    assert torch.allclose(x.detach(), torch.full((3,), -0.1))  # Adam's first step: -lr * sign(grad)


@pytest.mark.parametrize("case", CASES)
def test_a_round_creates_every_tensor_on_the_runs_device(case, tree, tmp_path):
    algorithm, extra = CASES[case]
    results = run_on_meta_default(simulator(tree, tmp_path / case, algorithm, extra))
    assert results["rounds"] == 1 and results["device"] == "cpu"
    assert json.loads((tmp_path / case / "results.json").read_text())["device"] == "cpu"


def test_zeroshot_rounds_create_every_tensor_on_the_runs_device(tmp_path):
    """The streaming driver and zero-shot's score tables, impressions and k-medoids (a registration
    round)."""
    from test_zeroshot import WORDS_10

    from fedac.engine.zeroshot import ZeroShotDriver

    root = tmp_path / "gsc"
    make_gsc_tree(root, speakers=8, clips=1)
    make_gsc_tree(root, speakers=8, words=WORDS_10, clips=6)
    cfg = load_config(
        overrides=[
            "algorithm=zeroshot",
            f"data.root={root}",
            f"data.cache_dir={tmp_path / 'cache'}",
            "zeroshot.scale=0.05",
            "zeroshot.rounds=5",
            "zeroshot.di_steps=5",
            "zeroshot.di_per_class=4",
            "train.local_epochs=1",
            "train.device=cpu",
        ]
    )
    runner = ZeroShotDriver(cfg, tmp_path / "run", progress=False)
    results = run_on_meta_default(runner)
    assert results["device"] == "cpu"
    assert any(row.get("new_labels", 0) > 0 for row in results["history"]), (
        "no registration round ran"
    )


def test_a_lost_device_argument_fails_the_check(tree, tmp_path, monkeypatch):
    """The check can fail: the stacked FedAvg step with its loss accumulator created without
    `device=` (what deleting that argument in algorithms/fedavg.py does) stops the run."""
    import fedac.algorithms.fedavg as cohort

    def zeros(*size, device=None, **kwargs):  # drops the device argument, as the mutation would
        return torch.zeros(*size, **kwargs)

    monkeypatch.setattr(cohort, "torch", types.SimpleNamespace(**{**vars(torch), "zeros": zeros}))
    with pytest.raises((RuntimeError, NotImplementedError)):
        run_on_meta_default(simulator(tree, tmp_path / "mutant", "fedavg", []))


def test_device_setting_is_checked(monkeypatch):
    with pytest.raises(ConfigError, match="train.device must be auto, cpu, cuda or cuda:N"):
        load_config(overrides=["train.device=gpu"])
    with pytest.raises(ConfigError, match="train.precision must be one of"):
        load_config(overrides=["train.precision=fp8"])
    monkeypatch.delenv("FEDAC_DEVICE")
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setenv("FEDAC_DEVICE", "cpu")
    assert resolve_device("auto") == torch.device("cpu")
    # `cuda` and auto name the current GPU with its index, as its tensors report it (so devices
    # compare equal)
    monkeypatch.delenv("FEDAC_DEVICE")
    for name, value in {"is_available": True, "device_count": 2, "current_device": 1}.items():
        monkeypatch.setattr(torch.cuda, name, lambda value=value: value)
    assert resolve_device("cuda") == resolve_device("auto") == torch.device("cuda", 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without CUDA")
def test_cuda_without_a_gpu_is_a_clear_error(tmp_path):
    """`--set train.device=cuda` on a machine without CUDA: exit 2 at once, one line naming the
    setting."""
    script = Path(sys.executable).with_name("fedac")
    done = subprocess.run(
        [
            str(script),
            "run",
            "--rounds",
            "1",
            "--set",
            "train.device=cuda",
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2, done.stderr
    assert "train.device=cuda" in done.stderr and "no CUDA GPU" in done.stderr
    assert "Traceback" not in done.stderr


def test_to_device_moves_nested_state_and_keeps_the_rest():
    state = {
        "round": 3,
        "server": {"params": {"w": torch.ones(2)}, "known": [torch.zeros(1, dtype=torch.bool)]},
        "history": [{"loss": 0.5}],
        "name": "x",
    }
    moved = to_device(state, "meta")
    assert moved["server"]["params"]["w"].device.type == "meta"
    assert (
        moved["server"]["known"][0].device.type == "meta"
        and moved["server"]["known"][0].dtype == torch.bool
    )
    assert moved["round"] == 3 and moved["history"] == [{"loss": 0.5}] and moved["name"] == "x"
    assert state["server"]["params"]["w"].device.type == "cpu"  # the original is untouched


def test_precision_bf16_autocasts_the_sequential_steps_and_leaves_the_stacked_crnn_in_fp32(
    tree, tmp_path
):
    """train.precision=bf16 changes a sequentially trained model (autocast is in effect) but stays
    near fp32; the stacked CRNN path, whose hand-written backward is fp32, trains exactly as in
    fp32."""

    def trained(name, *extra):
        sim = simulator(tree, tmp_path / name, "fedavg", ["train.select=last", *extra])
        sim.run()
        return sim.state.server["params"]

    fp32 = trained("fp32", "train.execution=sequential")
    bf16 = trained("bf16", "train.execution=sequential", "train.precision=bf16")
    changed = max(
        float((fp32[k] - bf16[k]).abs().max()) for k in fp32 if fp32[k].is_floating_point()
    )
    assert 0 < changed < 0.1
    stacked, stacked_bf16 = trained("stacked"), trained("stacked-bf16", "train.precision=bf16")
    assert all(torch.equal(stacked[k], stacked_bf16[k]) for k in stacked)


def test_train_client_runs_every_runtime_under_the_precisions_autocast():
    """train_client (the step the simulator, the stream runner and the Flower ClientApp share)
    applies train.precision, so no runtime can forget it."""
    from fedac.training.step import train_client
    from fedac.training.types import ClientData, ClientResult

    class Recorder:
        def __init__(self, precision):
            self.cfg = load_config(overrides=[f"train.precision={precision}"])
            self.device = torch.device("cpu")

        def client_update(self, payload, state, data, round_idx, generator):
            return ClientResult(
                None,
                None,
                {
                    "autocast": torch.is_autocast_enabled("cpu"),
                    "dtype": str(torch.get_autocast_dtype("cpu")),
                },
            )

    data = ClientData(
        "c0",
        torch.zeros(1, 2, 3),
        torch.zeros(1, dtype=torch.long),
        torch.zeros(0, 2, 3),
        torch.zeros(0, dtype=torch.long),
    )
    assert train_client(Recorder("bf16"), None, None, data, 1, 0).metrics == {
        "autocast": True,
        "dtype": "torch.bfloat16",
    }
    assert train_client(Recorder("fp32"), None, None, data, 1, 0).metrics["autocast"] is False


def test_features_are_computed_on_the_runs_device_and_a_gpus_are_cached_apart(
    tree, tmp_path, monkeypatch
):
    """Feature extraction runs its STFT, mel and DCT on `train.device` (FEDAC_TEST_DEVICE on a GPU
    machine, the CPU in CI); a GPU's features (equal to the CPU's to float rounding) get a cache
    file of their own."""
    import os

    from fedac.data import features as feats
    from fedac.data.registry import load_manifest

    device = resolve_device(os.environ.get("FEDAC_TEST_DEVICE", "cpu"))
    cfg = load_config(overrides=[f"data.root={tree}"])
    manifest = load_manifest(cfg, False)
    assert feats._fingerprint(manifest, cfg.features, 100.0, 0, "cuda") != feats._fingerprint(
        manifest, cfg.features, 100.0, 0
    )
    seen, call = [], feats.FeatureExtractor.__call__
    monkeypatch.setattr(
        feats.FeatureExtractor,
        "__call__",
        lambda self, waves: (
            seen.append((waves.device, self.window.device, self.mel.device)) or call(self, waves)
        ),
    )
    on_cpu = feats.load_features(manifest, cfg.features, str(tmp_path), progress=False)
    on_device = feats.load_features(
        manifest, cfg.features, str(tmp_path), progress=False, device=device
    )
    assert {devices for devices in seen} == {(torch.device("cpu"),) * 3, (device,) * 3}
    assert on_device.features.device.type == "cpu" and on_device.features.dtype == torch.float16
    torch.testing.assert_close(
        on_device.features.float(), on_cpu.features.float(), atol=2e-2, rtol=1e-2
    )
    assert len(list((tmp_path / "features").glob("*.pt"))) == (1 if device.type == "cpu" else 2)


@pytest.mark.parametrize("deterministic", [True, False])
def test_train_deterministic_sets_the_gpu_kernels_and_leaves_the_cpu_alone(
    monkeypatch, deterministic
):
    """train.deterministic: on a GPU, deterministic cuDNN algorithms, no autotuning and torch's
    deterministic mode (a resumed GPU run ended unlike the uninterrupted one without them); the
    CPU's settings stay as they are. The flags are process-wide, so the test restores them."""
    from fedac.training.device import configure_precision

    saved = (
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
    )
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        torch.backends.cudnn.benchmark = True
        configure_precision("fp32", torch.device("cpu"), deterministic)
        assert torch.backends.cudnn.benchmark and not torch.are_deterministic_algorithms_enabled()
        # sets flags only: no GPU needed
        configure_precision("fp32", torch.device("cuda"), deterministic)
        assert (
            torch.backends.cudnn.deterministic is deterministic
            and not torch.backends.cudnn.benchmark
        )
        assert torch.are_deterministic_algorithms_enabled() is deterministic
        assert (os.environ.get("CUBLAS_WORKSPACE_CONFIG") == ":4096:8") is deterministic
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[:2]
        torch.use_deterministic_algorithms(saved[2], warn_only=saved[3])
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[4:]
