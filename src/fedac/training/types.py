"""The types that algorithms, engine, attacks and the Flower apps pass around, and what the models
read.

Plain data, no behaviour beyond accessors: a client's resident tensors (`ClientData`), what a client
update returns (`ClientResult`), what an algorithm knows of the federation (`Task`), evaluation
splits and the whole federation's tensors (`EvalSplit`, `FederatedData`), parameter dicts
(`Params`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import torch
from torch import nn

from fedac.config import Config
from fedac.data.manifest import Manifest
from fedac.errors import DatasetError

if TYPE_CHECKING:  # (both load the audio readers; only the annotations need them)
    from fedac.data.augment import AugmentedWindows
    from fedac.data.waveform import Padded

Params = dict[str, torch.Tensor]

Windows: TypeAlias = "torch.Tensor | Padded"
"""Windows as a client's `holdout_x` and an evaluation split's `x` hold them: feature windows, or
the padded waveforms (or cached CNN features) the SSL encoders read (engine/waveform.py). Both are
indexed by a tensor of rows and have `len` and `shape[0]`."""
TrainWindows: TypeAlias = "torch.Tensor | Padded | AugmentedWindows"
"""A client's training windows `x`: `Windows`, or windows augmented afresh at every batch
(`features.augment`, engine/data.py), indexed the same way."""
Labels: TypeAlias = "torch.Tensor | Padded"
"""A client's `y` / `holdout_y`: one class per window, or CTC target sequences
(engine/waveform.py)."""


@dataclass
class Task:
    """What an algorithm needs to know about the federated data, not the data itself."""

    num_features: int
    num_classes: int
    clients: list[str]
    class_counts: list[list[int]] | None = None
    """Training windows per class of each client (aligned with `clients`), for methods that weigh
    clients by their label distribution (FedKWS-UI's ALT)."""
    kind: str = "classification"
    """classification, or ctc (sequence targets, scored by WER / CER); see engine/waveform.py."""


@dataclass
class ClientData:
    """One client's resident tensors: training windows and its local held-out windows."""

    name: str
    x: TrainWindows
    y: Labels
    holdout_x: Windows
    holdout_y: Labels
    step_limit: int | None = None
    """The local steps this update may take (the virtual clock's partial work, engine/clock/:
    a client that misses the deadline sends the steps it finished); None: all."""

    @property
    def num_samples(self) -> int:
        return int(self.y.shape[0])


def class_labels(y: Labels, method: str) -> torch.Tensor:
    """`y` as one class per window, for a method whose loss or statistics need classes; a TypeError
    naming `method` for CTC target sequences (engine/waveform.py's ASR task)."""
    if not isinstance(y, torch.Tensor):
        raise TypeError(
            f"{method} needs one class label per window, not CTC target sequences "
            f"({type(y).__name__}); the FedAvg family (fedavg, fedprox, fedadam, ...) and "
            "earlyexit train ASR"
        )
    return y


def feature_windows(x: TrainWindows, method: str) -> torch.Tensor | AugmentedWindows:
    """`x` as feature windows (or `features.augment`'s, which index to feature tensors), for a
    method that reads them with a KWS network; a TypeError naming `method` for the SSL encoders'
    padded waveforms."""
    from fedac.data.waveform import Padded  # (loads the audio readers: only where it is needed)

    if isinstance(x, Padded):
        raise TypeError(
            f"{method} reads feature windows, not the padded waveforms of an SSL encoder "
            "(model.name=w2v2_*): set model.name to a feature model (`fedac models` lists them)"
        )
    return x


@dataclass
class ClientResult:
    upload: Any
    """What travels to the server (never the personalized model)."""
    state: Any = None
    """The client's new persistent state, kept on the client."""
    metrics: dict[str, float] = field(default_factory=dict)


def clone_params(params: Params) -> Params:
    return {name: value.detach().clone() for name, value in params.items()}


def model_params(model: nn.Module) -> Params:
    return clone_params(model.state_dict())


@dataclass
class EvalSplit:
    """Windows of one evaluation split; `clip` maps each window to its clip (0..num_clips-1)."""

    x: Windows
    clip: torch.Tensor
    labels: torch.Tensor
    """One label per clip."""
    kind: str = "classification"
    """classification, ctc (scored by WER / CER against `texts`) or verification (EER over
    `trials`)."""
    texts: list[str] | None = None
    """ctc: the reference transcript of each clip."""
    trials: torch.Tensor | None = None
    """verification: (M, 3) rows (clip a, clip b, 1 = same speaker)."""

    @property
    def num_clips(self) -> int:
        return int(self.labels.shape[0])


@dataclass
class FederatedData:
    task: Task
    manifest: Manifest
    clients: list[ClientData]
    val: EvalSplit | None
    test: EvalSplit | None
    """val, test: None only on a Flower device node started without test-root (flower/devices.py); a
    simulation holds both and reads them through `eval_split`."""
    extra_test: dict[str, EvalSplit] = field(default_factory=dict)
    """Further test splits reported as `<name>_<metric>` (LibriSpeech test_other, VoxCeleb1 asv
    trials)."""
    bad_files: dict[str, str] = field(default_factory=dict)
    """data.on_bad_file=skip: path -> reason of the audio files left out because they cannot be
    decoded."""

    def eval_split(self, name: str) -> EvalSplit:
        """`val` or `test`, which every simulation holds;
        a DatasetError where this data has none."""
        held = self.val if name == "val" else self.test
        if held is None:
            raise DatasetError(
                f"this federation's data holds no {name} split (a Flower device "
                "node holds one only when started with test-root)"
            )
        return held

    def client(self, name: str) -> ClientData:
        return self._by_name[name]

    def __post_init__(self) -> None:
        self._by_name = {c.name: c for c in self.clients}


def normalize(features: torch.Tensor) -> torch.Tensor:
    """Per-utterance, per-coefficient mean/variance normalisation (needs no statistics from other
    clients)."""
    x = features.float()
    mean = x.mean(dim=2, keepdim=True)
    std = x.std(dim=2, keepdim=True, unbiased=False)
    return ((x - mean) / (std + 1e-5)).contiguous()


def model_input(features: torch.Tensor, cfg: Config) -> torch.Tensor:
    """What the models read: CMVN-normalised features, or FedKWS-UI's scaled MFCCs as they are
    (`features.style=fedkws`: the official code applies no normalisation)."""
    return features.float().contiguous() if cfg.features.style == "fedkws" else normalize(features)


def all_finite(obj: Any) -> bool:
    """True when every tensor inside an upload (dicts / lists / dataclasses of tensors) is free of
    NaN and Inf."""
    tensors: list[torch.Tensor] = []

    def scan(o: Any) -> bool:  # collects the floating tensors, checks Python floats
        if isinstance(o, torch.Tensor):
            if o.is_floating_point() and o.numel():
                tensors.append(o)
            return True
        if isinstance(o, dict):
            return all(scan(v) for v in o.values())
        if isinstance(o, (list, tuple)):
            return all(scan(v) for v in o)
        if is_dataclass(o) and not isinstance(o, type):  # (zero-shot's uploads)
            return all(scan(getattr(o, f.name)) for f in fields(o))
        return math.isfinite(o) if isinstance(o, float) else True

    if not scan(obj):
        return False
    # One foreach L2 norm call (16x faster than an isfinite + all per tensor, which took 2.7 % of a
    # FedMLAC round): NaN and Inf propagate into a norm, so a finite one proves the tensor finite;
    # only a non-finite norm (possibly an overflow of huge finite values) needs the exact check.
    return (
        not tensors
        or bool(torch.stack(torch._foreach_norm(tensors)).isfinite().all())
        or all(bool(torch.isfinite(t).all()) for t in tensors)
    )


def usable(result: ClientResult) -> bool:
    """Whether a client's result enters the round: its upload and new state are finite."""
    return all_finite(result.upload) and all_finite(result.state)
