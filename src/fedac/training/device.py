"""Where a run computes (`runtime.device`) and in what arithmetic (`runtime.precision`).

The rule every layer follows: tensors are created where the data they meet already lives
(`device=x.device`, `x.new_zeros`, `zeros_like`), so only two places choose a device: the engine,
which puts the client data and evaluation splits there once (`place`), and `Algorithm.make_model`,
which builds every model on the CPU (so its initial weights equal a CPU run's, whatever the device)
and then moves it. tests/training/test_device.py runs rounds with torch's default device set to
`meta`, so a tensor created without following that rule fails the test.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any

import torch

from fedac.config import DEVICE_SYNTAX, PRECISIONS, device_names
from fedac.errors import ConfigError
from fedac.training.types import FederatedData


def resolve_device(setting: str) -> torch.device:
    """`runtime.device` as a torch.device: auto is $FEDAC_DEVICE when set (so a whole test suite or
    job can be pointed at one device), else the first CUDA GPU when torch sees one, else the CPU.
    Naming a GPU that is not there fails here, with the setting's name, before anything is built."""
    if not DEVICE_SYNTAX.match(str(setting)):
        raise ConfigError(f"runtime.device must be auto, cpu, cuda or cuda:N, got {setting!r}")
    if setting == "auto":
        chosen = os.environ.get("FEDAC_DEVICE", "")
        if chosen and chosen != "auto":
            return resolve_device(chosen)
        return resolve_device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(setting)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"runtime.device={setting}: this torch sees no CUDA GPU (torch "
                f"{torch.__version__}, CUDA build {torch.version.cuda or 'none'}); use --set "
                "runtime.device=cpu, or "
                "install a CUDA build of torch (README, Quick start)"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(
                f"runtime.device={setting}: only {torch.cuda.device_count()} CUDA GPU(s) are "
                "visible"
            )
        # `cuda` is the current GPU, named with its index: tensors report cuda:N
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def resolve_devices(setting: str, device: torch.device) -> list[torch.device]:
    """`runtime.devices` as the list of devices the stacked path spreads its chunks over: empty, the
    run's `device` alone; `all`, every CUDA GPU torch sees; else a comma list of `runtime.device`
    values (each checked as `resolve_device` checks it; `cpu` may appear, so a one-GPU machine or a
    test can mix)."""
    names = device_names(setting)
    if not names:
        return [device]
    if names == ["all"]:
        if not torch.cuda.is_available():
            raise ConfigError(
                "runtime.devices=all: this torch sees no CUDA GPU; leave runtime.devices empty to "
                "train on runtime.device alone"
            )
        return [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    try:
        return [resolve_device(name) for name in names]
    except ConfigError as err:
        raise ConfigError(f"runtime.devices={setting}: {err}") from None


def device_name(device: torch.device) -> str:
    """What results.json and a run's first line say: `cpu`, or `cuda:0 (NVIDIA H100 80GB HBM3)`."""
    if device.type != "cuda":
        return device.type
    index = device.index if device.index is not None else torch.cuda.current_device()
    return f"cuda:{index} ({torch.cuda.get_device_name(index)})"


def to_device(obj: Any, device: torch.device | str, pin: bool = False) -> Any:
    """`obj` with every tensor inside (dicts, lists, tuples, dataclasses and objects with a `.to`,
    such as data.waveform.Padded or data.augment.AugmentedWindows) moved to `device`; other values
    unchanged. Checkpoints go through it twice: to the CPU when written, to the run's device when
    resumed, so a GPU checkpoint resumes on the CPU and the reverse. `pin`: tensors that land on the
    CPU are page-locked (what makes copies to a GPU asynchronous; needs CUDA), those of `.to`
    objects excepted."""
    if isinstance(obj, torch.Tensor):
        # host to GPU only: no race
        moved = obj.to(device, non_blocking=torch.device(device).type != "cpu")
        return (
            moved.pin_memory()
            if pin and moved.device.type == "cpu" and not moved.is_pinned()
            else moved
        )
    if isinstance(obj, dict):
        return {k: to_device(v, device, pin) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(v, device, pin) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init}
        moved_fields = {name: to_device(value, device, pin) for name, value in fields.items()}
        if all(moved_fields[name] is value for name, value in fields.items()):
            return obj  # already there: the same object (callers may compare splits by identity)
        return dataclasses.replace(obj, **moved_fields)
    if hasattr(obj, "to") and callable(obj.to) and not isinstance(obj, torch.nn.Module):
        return obj.to(device)
    return obj


def place(
    data: FederatedData, device: torch.device, clients_on: torch.device | None = None
) -> FederatedData:
    """The federation's client data and evaluation splits moved to `device` (the manifest, task and
    file lists stay as they are), resident there for the whole run. `clients_on`: the clients' data
    goes there instead (the host, pinned, when it does not fit on a GPU: `runtime.client_memory`);
    each round then copies its cohort's data to `device`."""
    home = clients_on if clients_on is not None else device
    pin = home.type == "cpu" and device.type == "cuda"
    clients = [to_device(c, home, pin) for c in data.clients]
    val, test = to_device(data.val, device), to_device(data.test, device)
    extra = {name: to_device(split, device) for name, split in data.extra_test.items()}
    if (
        val is data.val
        and test is data.test
        and all(a is b for a, b in zip(clients, data.clients))
        and all(extra[name] is split for name, split in data.extra_test.items())
    ):
        return data  # already resident there (a CPU run): nothing copied, the same object
    return dataclasses.replace(data, clients=clients, val=val, test=test, extra_test=extra)


def nbytes(obj: Any) -> int:
    """Bytes of every tensor inside `obj` (the containers `to_device` walks, and the attributes of
    objects)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v) for v in obj)
    if hasattr(obj, "__dict__") and not isinstance(obj, (type, torch.nn.Module)):
        return sum(nbytes(v) for v in vars(obj).values())
    return 0


def check_precision(precision: str, device: torch.device) -> None:
    if precision not in PRECISIONS:
        raise ConfigError(
            f"runtime.precision must be one of {', '.join(PRECISIONS)}, got {precision!r}"
        )
    if precision == "tf32" and device.type != "cuda":
        raise ConfigError(
            "runtime.precision=tf32 needs a CUDA device (TensorFloat-32 is a GPU number format); "
            "on the CPU use fp32 or bf16"
        )


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The forward passes' arithmetic: bf16 / fp16 autocast, else nothing (fp32, and tf32, which
    `configure_precision` sets process-wide)."""
    if precision in ("bf16", "fp16"):
        dtype = torch.bfloat16 if precision == "bf16" else torch.float16
        return torch.autocast(device.type, dtype=dtype)
    return contextlib.nullcontext()


def configure_precision(precision: str, device: torch.device, deterministic: bool = True) -> None:
    """tf32: CUDA matmuls and convolutions in TensorFloat-32 (process-wide, as torch sets it); the
    other precisions leave torch's fp32 defaults alone. `deterministic` (runtime.deterministic): on
    a GPU, only deterministic kernels. Without it a resumed run on an H200 ended unlike the
    uninterrupted one (cuDNN's convolution backward sums with atomics); warn_only keeps an op with
    no deterministic kernel running, with torch's warning naming it."""
    check_precision(precision, device)
    if device.type == "cuda":
        tf32 = precision == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        if deterministic:
            # cuBLAS reads this when it creates its handle; ":4096:8" is the setting torch's docs
            # give
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.deterministic = deterministic
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(deterministic, warn_only=True)
