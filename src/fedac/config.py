"""Typed experiment configuration: defaults < config file < CLI flags < ``--set key=value``.

Every run saves the resolved config as ``config.yaml`` in its run directory; that file is a valid
``--config`` input, so any run can be repeated exactly.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedac.errors import ConfigError

# (also importable from here, as settings written before fields.py do)
from fedac.fields import number
from fedac.registry import Entry, Registry, check_choice, choice, resolve
from fedac.settings.aggregation import AGGREGATORS
from fedac.settings.algorithms import ALGORITHMS
from fedac.settings.attacks import ATTACKS
from fedac.settings.clock import CLOCK_MODES
from fedac.settings.codecs import CODECS
from fedac.settings.datasets import DATASETS
from fedac.settings.models import MODELS
from fedac.settings.selection import SELECTORS, not_read

log = logging.getLogger(__name__)


def check_ranges(section: Any, prefix: str = "") -> None:
    """Raise ConfigError naming the first numeric setting outside its declared range, or the first
    name-valued setting (`choice`) that names none of its choices (None is always valid)."""
    if isinstance(section, Config):  # the algorithms' sections are no dataclass fields of Config
        for name, value in section.sections().items():
            check_ranges(value, prefix + name + ".")
    for f in dataclasses.fields(section):
        key, value = prefix + f.name, getattr(section, f.name)
        if dataclasses.is_dataclass(value):
            check_ranges(value, key + ".")
            continue
        if "choices" in f.metadata:
            check_choice(key, value, f.metadata["choices"])
        valid = f.metadata.get("valid")
        if valid is None or value is None:
            continue
        if isinstance(value, list):
            if not all(v in valid for v in value):
                raise ConfigError(f"{key} must hold numbers {valid}, got {value!r}")
        elif value not in valid:
            raise ConfigError(
                f"{key} must {'lie' if valid.high is not None else 'be'} {valid}, got {value!r}"
            )


@dataclass
class DataShared:
    """The `data` settings every dataset reads; a dataset's own (Speech Commands' task, hf's
    columns) are declared with it in settings/datasets.py and added to `DataConfig` below."""

    root: str | None = None
    """Dataset root in its official layout. None: the embedded synthetic stand-in (generated
    once)."""
    partition: str | None = choice(None, ("natural", "dirichlet", "iid", "pooled"))
    """natural (speaker/actor id), dirichlet (over labels), iid, or pooled (one client holding every
    training clip, what `--algorithm central` trains on); None: the dataset's protocol default
    (pooled for central)."""
    num_clients: int = number(50, ">= 1")
    """Clients for dirichlet / iid partitions (natural: one per speaker)."""
    alpha: float = number(0.5, "> 0")
    """Dirichlet concentration over labels (smaller = more skewed)."""
    min_client_size: int = number(10, ">= 0")
    """Dirichlet: redraw until every client holds at least this many training clips."""
    min_speaker_clips: int = number(0, ">= 0")
    """Natural partition: drop the clients (speakers) with fewer training clips than this
    (FedKWS-UI: 5); 0 keeps every client."""
    group_by_source: bool = True
    """Dirichlet: keep clips of one source recording (e.g. UrbanSound8K fsID) on one client."""
    local_holdout: float = number(0.2, "[0, 1)")
    """Fraction of each client's training clips held out for personalized (local) evaluation."""
    max_clients: int | None = number(None, ">= 1")
    """Keep at most this many clients (seeded choice); None keeps all."""
    test_fold: str | None = None
    """Held-out fold/session/actor group for datasets whose test split is a fold (None: dataset
    default)."""
    snr_db: float = number(100.0, "finite")
    """White Gaussian noise added to train and test audio at this SNR; 100 dB = clean."""
    label_error: float = number(0.0, "[0, 1]")
    """Per-client label error rate on training labels (diagonal 1 - e transition matrix)."""
    cache_dir: str | None = None
    """Feature / synthetic data cache; None: $FEDAC_HOME or ~/.cache/fedac."""
    on_bad_file: str = "error"
    """A clip that cannot be decoded (corrupt, truncated, empty): error (stop with a message naming
    the file) or skip (leave it out, list it in the run directory's bad_files.txt and go on)."""


@dataclass
class FeatureConfig:
    kind: str = choice("mfcc", ("mfcc", "logmel"))
    """mfcc or logmel."""
    sample_rate: int = number(16000, ">= 1")
    n_mels: int = number(40, ">= 1")
    n_mfcc: int = number(40, ">= 1")
    win_ms: float = number(30.0, "> 0")
    hop_ms: float = number(10.0, "> 0")
    clip_seconds: float = number(1.0, "> 0")
    """Model input length; shorter audio is zero-padded, longer audio windowed."""
    style: str = choice("fedac", ("fedac", "fedkws"))
    """fedac: the settings above, natural-log mel, per-utterance mean/variance normalisation (CMVN).
    fedkws: FedKWS-UI's official pipeline, which replaces sample_rate, win_ms, hop_ms, n_mels,
    n_mfcc and kind: 8 kHz audio, MFCC(n_mfcc 40, n_mels 40, n_fft = window = 240 (30 ms), hop 80
    (10 ms), HTK mel 0-4 kHz), power in dB floored 80 dB under each clip's peak, divided by 500, no
    CMVN (see data/features.py)."""
    augment: bool = False
    """FedKWS-UI's training augmentation, drawn afresh for every batch (data/augment.py): +-100 ms
    time shift, background noise (p 0.8, volume U(0, 0.1)) and SpecAugment (one mask of <= 5
    coefficients, one of <= 10 frames). Keeps training waveforms in memory and trains one client
    after another."""
    test_augment: bool = False
    """The same shift and noise on validation and test clips, fixed per (seed, clip) (the official
    code augments its test set); the clean test set is reported beside it as clean_* results."""


@dataclass
class ModelShared:
    """The `model` settings of every network; a model's own (the SSL encoders') are declared with it
    in settings/models.py and added to `ModelConfig` below."""

    name: str = choice("crnn_lite", MODELS)
    """Global model for FedAvg-family algorithms (see `fedac models`)."""
    dropout: float = number(0.1, "[0, 1)")
    heterogeneous: bool = False
    """Each client draws one of `zoo` (seeded), for algorithms that allow per-client models."""
    client_model: str = choice("crnn_base", MODELS)
    """Personalized model of every client in the homogeneous setting (FedMLAC, FedKAD)."""
    zoo: list[str] = choice(
        None,
        MODELS,
        default_factory=lambda: ["crnn_tiny", "crnn_lite", "crnn_mid", "crnn_base", "crnn_deep"],
    )


@dataclass
class TrainConfig:
    rounds: int = number(50, ">= 1")
    fraction: float = number(0.1, "(0, 1]")
    """Active ratio: fraction of clients sampled each round (at least one)."""
    local_epochs: int = number(5, ">= 1")
    local_steps: int = number(0, ">= 0")
    """0: `local_epochs` passes over the client's data; > 0: exactly this many SGD steps of a loader
    reshuffled whenever it runs out (FedKWS-UI's protocol: every client 50 steps, whatever its
    size)."""
    batch_size: int = number(16, ">= 1")
    lr: float = number(0.1, "> 0")
    momentum: float = number(0.9, "[0, 1)")
    """Local SGD momentum (buffers reset every round). The defaults make the embedded default run
    learn in a few minutes; configs/paper.yaml holds fedmlac.md's schedule (lr 0.01, 1 local epoch,
    20% active, 5000 rounds)."""
    weight_decay: float = number(0.0, ">= 0")
    paper_optimizer: bool = False
    """Run the algorithm at its paper's local optimiser and aggregation weights (settings/paper.py,
    docs/algorithms.md), beneath whatever a file, flag or --set gives; false (the default): the
    shared `train.*` / `aggregation.weighting` defaults every committed table ran."""
    optimizer: str = "sgd"
    """Local optimiser, new every round: sgd (lr, momentum, weight_decay), adam or adamw (torch Adam
    / AdamW with lr and weight_decay; FedKWS-UI's protocol trains its Transformer with adamw, the
    early-exit paper its SSL encoders). The stacked path has all three
    (training/functional.py)."""
    max_grad_norm: float = number(0.0, ">= 0")
    """Clip every local step's gradient to this L2 norm (FedKWS-UI's protocol: 50); 0: no clipping.
    The stacked path clips each client's gradient on its own."""
    eval_every: int = number(5, ">= 1")
    """Evaluate on the validation split every k rounds (and after the last round). `fedac run` left
    at this default makes a run of fewer than 5 x 5 rounds evaluate every rounds // 5 rounds (every
    round below 10), so that its curves have a line (`fit_eval_schedule`); config.yaml records the
    value used."""
    checkpoint_every: int = number(5, ">= 1")
    select: str = choice("best_val", ("best_val", "last"))
    """Final model: best_val (highest validation accuracy) or last. Never chosen on test."""
    test_curve: bool = False
    """Also log the shared model's test accuracy at every evaluation (a curve only, never used to
    select a model) and report `test_last5_mean`, the mean of the last 5 (FedKWS-UI Fig. 2's
    legend)."""
    eval_batch_size: int = number(512, ">= 1")

    if not typing.TYPE_CHECKING:  # (the checker keeps reporting a moved name as an error)

        def __getattr__(self, name: str) -> Any:
            # (only asked for a name the section does not hold)
            raise AttributeError(_moved(name) or f"train has no setting {name!r}")

        def __setattr__(self, name: str, value: Any) -> None:
            moved = _moved(name)
            if moved:  # (an old name set in code would otherwise be a new, unread attribute)
                raise AttributeError(moved)
            object.__setattr__(self, name, value)


def _moved(name: str) -> str | None:
    """What code reading or setting `train.<name>` is told when the setting moved (RENAMED)."""
    new = RENAMED.get(f"train.{name}")
    return f"train.{name} is now {new} (cfg.{new})" if new else None


#: `runtime.execution`'s paths (engine/execution.py): checked here, once, when the config loads.
EXECUTION_MODES = ("auto", "cohort", "sequential", "probe")


@dataclass
class RuntimeConfig:
    """Where and how a run computes, which training/runtime.py resolves once per run (`Runtime`):
    the device(s), the arithmetic, how a round's clients train and on how many threads, and the
    process-wide switches. Apart from `precision` and `deterministic`, none of them changes a run's
    numbers beyond float rounding (experiments/compare.py `HOW_TO_COMPUTE`). Written under `train`
    before they had a section of their own; those names still load (`RENAMED`)."""

    device: str = "auto"
    """Where models, client data, training, aggregation and evaluation live: auto (the first CUDA
    GPU when torch sees one, else the CPU), cpu, cuda or cuda:N (training/device.py). Numbers on a
    GPU equal the CPU's to float rounding, not bitwise; a checkpoint written on one resumes on the
    other."""
    devices: str = ""
    """Several devices for one run's stacked path: all (every CUDA GPU torch sees) or a comma
    list (cuda:0,cuda:1); empty (the default): `runtime.device` alone. Each chunk of stacked clients
    trains on the next free device (its data, payload and models copied there, its results back);
    the data, the server, aggregation and evaluation stay on `runtime.device`, and the sequential
    path uses it alone. Results equal one device's to float rounding, with dropout masks drawn per
    device type."""
    precision: str = "fp32"
    """Arithmetic of training steps and evaluation forwards: fp32 (the default, reproducible), tf32
    (CUDA matmuls and convolutions in TensorFloat-32), bf16 or fp16 (torch.autocast around the
    clients' steps and the evaluations; fp16 has no loss scaling, so bf16 is the safer of the two).
    Parameters, optimiser state and the server's means stay fp32 / fp64. Tolerances:
    docs/performance.md."""
    deterministic: bool = True
    """On a GPU, use only deterministic kernels (cuDNN's deterministic convolution algorithms, no
    autotuning, torch's deterministic-algorithm mode, cuBLAS's fixed workspace), so a resumed run
    ends exactly like an uninterrupted one on the same machine and two runs of one command agree.
    false: the fastest kernels, some of which sum with atomics; results then differ between runs at
    float rounding, which a long run grows to the few points docs/architecture.md's "Determinism and
    portability" shows. No effect on the CPU, whose kernels are deterministic already.
    Process-wide."""
    threads: int = number(1, ">= 0")
    """torch intra-op threads; 0 keeps torch's default. Per-client batches of 16 short clips run
    fastest on one thread (see benchmarks/)."""
    execution: str = choice("auto", EXECUTION_MODES)
    """How a round's clients train: cohort (clients of one architecture stacked into one
    computation, engine/execution.py; a configuration that cannot stack is an error naming why),
    sequential (one client after another), auto (stacked where the algorithm has a stacked path,
    except a vmapped network on the CPU, slower there than one client at a time; on a GPU such a
    network is timed both ways on a probe chunk of the first round and the faster path kept), or
    probe (that timing on any device). Both paths give the same numbers to float rounding, so a
    choice by timing can differ between two runs: pin cohort or sequential for bit-for-bit repeats.
    The run's first line and results.json's `execution` name the path taken (`stacked` or
    `sequential: <reason>`)."""
    cohort_chunk: int = number(0, ">= 0")
    """Cohort path: at most this many clients stacked at once, which bounds activation memory; 0
    (auto): 16 on the CPU (each step's tensors stay in cache; fastest on CRNN-Base + CRNN-Lite,
    benchmarks/README.md), and on a GPU as many as fit in the free memory, measured on a probe chunk
    (training/packing.py)."""
    cohort_workers: int = number(0, ">= 0")
    """Cohort path: chunks trained at once on this many threads, each running torch ops on `threads`
    intra-op threads; 0: one per usable core left by `threads`, or one on a GPU. Numbers do not
    depend on it. On 2 free cores 2 workers ran 1.8x faster than 1, where threads=2 gave 1.36x
    (benchmarks/README.md)."""
    client_memory: str = "auto"
    """Where the clients' data and personalized models live between rounds: device (resident on
    `runtime.device`: a round copies nothing), host (CPU memory, page-locked on a GPU: each round
    copies its cohort's data and models to the device and the updated models back), or auto (device
    when both fit in half the GPU's free memory, the other half left to the stacked chunks; on the
    CPU the two are one). Numbers do not depend on it (training/packing.py)."""
    keep_freed_memory: bool = True
    """Let glibc's malloc keep freed memory for reuse instead of unmapping every large tensor
    (training/runtime.py): 7-9 % faster FedMLAC rounds, same peak RSS. Process-wide; no effect off
    glibc."""
    gru_kernel: str = choice("auto", ("auto", "fused", "torch", "triton"))
    """Cohort path's GRU recurrence: fused (the compiled CPU kernel of fedac/kernels, built by
    scripts/setup.sh or on first use; fail if it does not build), triton (the GPU kernel of
    kernels/gru_triton.py; fail if Triton does not import), torch (the pure-torch loop, the
    reference), or auto (the CPU: fused when it builds, else torch and a warning; a GPU: triton when
    it imports, else torch). Same numbers to float rounding. Process-wide."""
    dist_timeout: float = number(1800.0, "> 0")
    """Several processes (torchrun, engine/distributed.py): seconds a rank waits in a collective
    (the gather of a round's results) for the others before it stops with an error naming its rank
    and the round. It must exceed the longest gap between two ranks reaching a collective: a round's
    training on the slowest rank plus rank 0's evaluation and checkpoint."""


DEVICE_SYNTAX = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
CLIENT_MEMORY = ("auto", "device", "host")


def device_names(setting: str) -> list[str]:
    """`runtime.devices` spelled right, as its names: [] (empty: `runtime.device` alone), ["all"],
    or the comma list's cpu / cuda / cuda:N entries (training/device.py resolves them)."""
    setting = str(setting).strip()
    if setting in ("", "all"):
        return [setting] if setting else []
    names = [name.strip() for name in setting.split(",")]
    if not all(DEVICE_SYNTAX.match(name) and name != "auto" for name in names):
        raise ConfigError(
            "runtime.devices must be empty, all, or a comma list of cpu, cuda or cuda:N, got "
            f"{setting!r}"
        )
    return names


def check_compute(runtime: RuntimeConfig) -> None:
    """`runtime.device` and `runtime.precision` spelled right, before torch loads (whether the GPU
    exists is asked when the run starts: training/device.py)."""
    if not DEVICE_SYNTAX.match(str(runtime.device)):
        raise ConfigError(
            f"runtime.device must be auto, cpu, cuda or cuda:N, got {runtime.device!r}"
        )
    if runtime.precision not in PRECISIONS:
        raise ConfigError(
            f"runtime.precision must be one of {', '.join(PRECISIONS)}, got {runtime.precision!r}"
        )
    device_names(runtime.devices)
    if runtime.client_memory not in CLIENT_MEMORY:
        raise ConfigError(
            f"runtime.client_memory must be one of {', '.join(CLIENT_MEMORY)}, got "
            f"{runtime.client_memory!r}"
        )


@dataclass
class AggregationShared:
    """The `aggregation` settings of every rule; a rule's own (LPA's v_l, Krum's num_malicious, ...)
    are declared with it in settings/aggregation.py and added to `AggregationConfig` below."""

    method: str = choice("mean", AGGREGATORS)
    """How uploaded models are combined: mean (n_k-weighted, Eq. 3), lpa (Layer-wise Pruning, Eq.
    10-14), a robust rule (median, trimmed_mean, krum, multikrum, bulyan, norm_bound) or a plug-in's
    (`fedac list`)."""
    weighting: str = choice("n_k", ("n_k", "uniform"))
    """The weights of every mean the server takes (mean, LPA's Eq. 14, Multi-Krum's and norm_bound's
    mean): n_k (each upload by its client's training clips, Eq. 3) or uniform (1/|S| per upload, as
    FedKWS-UI's paper and code average every method). Median, trimmed mean, Krum and Bulyan never
    weight."""


@dataclass
class AttackShared:
    """Poisoned clients (fedac/rules/attacks.py), applied by the runtimes over client data and
    uploads: the settings of every attack; an attack's own (the backdoor's trigger, gaussian's
    noise_std, ...) are declared with it in settings/attacks.py and added to `AttackConfig`
    below."""

    kind: str = choice("none", ATTACKS)
    """none; data poisoning: label_flip (all labels to `target`), label_permute (a seeded
    permutation of the classes), backdoor (a trigger mixed into the audio, relabelled to `target`);
    model poisoning: sign_flip, gaussian, scale (model replacement), little (a colluding "little is
    enough" shift)."""
    fraction: float = number(0.0, "[0, 1]")
    """Share of the clients that are malicious (a seeded choice that holds for the whole run)."""
    measure_backdoor: bool = False
    """Report `attack_success_rate` (the triggered test clips of other classes that the shared model
    assigns to `target`) with any attack.kind, not only the backdoor: for a run with no backdoor it
    is the rate a model that never saw the trigger gives, the baseline the backdoor's rate is read
    against."""


@dataclass
class SelectionShared:
    """Which clients train each round (engine/clock/selection.py, docs/system.md): the rule every
    selection shares; a rule's own settings (Oort's, power-of-choice's, FedCS's) are declared with
    it in settings/selection.py and added to `SelectionConfig` below."""

    method: str = choice("random", SELECTORS)
    """random (uniform among the clients online: the numbers of a run before selection existed),
    oort, poc (power-of-choice), fedcs, or a plug-in's (`fedac list selectors`)."""


#: The sections a registered part adds its settings to: section -> (its registry, the class of the
#: fields every part shares). Each part's fields join its section (`--set aggregation.v_l=0.2`), so
#: a config.yaml keeps one flat mapping per section, as before the parts declared their own.
KIND_SECTIONS: dict[str, tuple[Registry, type]] = {
    "data": (DATASETS, DataShared),
    "model": (MODELS, ModelShared),
    "aggregation": (AGGREGATORS, AggregationShared),
    "attack": (ATTACKS, AttackShared),
    "selection": (SELECTORS, SelectionShared),
}


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


@functools.cache
def section_with_parts(base: type, parts: tuple[tuple[str, type], ...], section: str) -> type:
    """`base` (a dataclass) with the fields of each (part name, settings dataclass) in `parts`
    added, as a dataclass named like `base`. Parts may declare one field alike (Krum and Bulyan:
    num_malicious); a field declared twice with another type or default, or one that redefines a
    field of `base`, is refused."""
    hints, owner = (
        typing.get_type_hints(base),
        {f.name: "the shared one" for f in dataclasses.fields(base)},
    )
    declared = {f.name: f for f in dataclasses.fields(base)}
    added: list[tuple[str, Any, Any]] = []
    for part, cls in parts:
        part_hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(
                    f"{section}.{f.name} of '{part}' ({cls.__name__}) needs a default"
                )
            if f.name in declared:
                if hints[f.name] == part_hints[f.name] and _default(declared[f.name]) == _default(
                    f
                ):
                    continue
                raise ConfigError(
                    f"{section}.{f.name} of '{part}' ({cls.__name__}) differs in type or default "
                    f"from {owner[f.name]}; rename it"
                )
            declared[f.name], hints[f.name], owner[f.name] = f, part_hints[f.name], f"'{part}''s"
            added.append(
                (
                    f.name,
                    part_hints[f.name],
                    dataclasses.field(
                        default=f.default, default_factory=f.default_factory, metadata=f.metadata
                    ),
                )
            )
    if not added:
        return base
    name = base.__name__.removesuffix("Shared").removesuffix("Config") + "Config"
    cls = dataclasses.make_dataclass(name, added, bases=(base,))
    cls.__module__, cls.__doc__ = __name__, f"The `{section}` section: {base.__doc__}"
    return cls


def section_class(section: str, plugins: bool = True) -> type:
    """The dataclass of `section` (one of KIND_SECTIONS): the built-in parts' class (DataConfig,
    ...) with the fields of every other registered part that declares settings (a plug-in's, or one
    added by `register`) added; `plugins` false: the built-ins' class alone."""
    registry, _ = KIND_SECTIONS[section]
    builtin, known = _BUILTIN[section]
    extra = (
        tuple(part for part in registry.settings_classes().items() if part not in known)
        if plugins
        else ()
    )
    return section_with_parts(builtin, extra, section) if extra else builtin


_BUILTIN: dict[str, tuple[type, tuple[tuple[str, type], ...]]] = {}
for _section, (_registry, _base) in KIND_SECTIONS.items():
    # (no entry point is read at import)
    _parts = tuple(_registry.settings_classes(plugins=False).items())
    _BUILTIN[_section] = (section_with_parts(_base, _parts, _section), _parts)
# what the type checker reads: the same fields, declared statically (tests/test_settings.py)
if typing.TYPE_CHECKING:
    from fedac.settings.aggregation import (
        LPASettings,
        MultiKrumSettings,
        NormBoundSettings,
        TrimSettings,
    )
    from fedac.settings.attacks import (
        BackdoorSettings,
        GaussianSettings,
        LittleSettings,
        ScaleSettings,
    )
    from fedac.settings.datasets import HFSettings, SpeechCommandsSettings
    from fedac.settings.models import SSLSettings
    from fedac.settings.selection import FedCSSettings, OortSettings, PowerOfChoiceSettings

    @dataclass  # (so that the checker's __init__ takes every base's fields)
    class DataConfig(DataShared, SpeechCommandsSettings, HFSettings): ...

    @dataclass
    class ModelConfig(ModelShared, SSLSettings): ...

    @dataclass
    class AggregationConfig(
        AggregationShared, LPASettings, TrimSettings, MultiKrumSettings, NormBoundSettings
    ): ...

    @dataclass
    class AttackConfig(
        AttackShared, BackdoorSettings, GaussianSettings, ScaleSettings, LittleSettings
    ): ...

    @dataclass
    class SelectionConfig(SelectionShared, OortSettings, PowerOfChoiceSettings, FedCSSettings): ...
else:
    DataConfig, ModelConfig = _BUILTIN["data"][0], _BUILTIN["model"][0]
    """The `data` / `model` sections of the built-in datasets / models: the shared fields and each
    part's own."""
    AggregationConfig, AttackConfig = _BUILTIN["aggregation"][0], _BUILTIN["attack"][0]
    """The `aggregation` / `attack` sections of the built-in rules / attacks."""
    SelectionConfig = _BUILTIN["selection"][0]
    """The `selection` section of the built-in selection rules."""


@dataclass
class PrivacyConfig:
    """Differential privacy of the shared model (fedac/rules/privacy.py)."""

    mode: str = "none"
    """none; central (DP-FedAvg, McMahan et al. 2018: the server clips every update to `clip`,
    averages them unweighted and adds Gaussian noise) or client (each client clips its own update
    before upload, the server adds the same noise)."""
    clip: float = number(1.0, "> 0")
    """L2 bound C on each client's update."""
    noise_multiplier: float = number(1.0, ">= 0")
    """z: the noise added to the sum of clipped updates has standard deviation z * C."""
    delta: float = number(1e-5, "(0, 1)")
    """delta at which epsilon is reported."""


@dataclass
class SystemConfig:
    """Devices, availability and time (engine/clock/; docs/system.md): a deterministic virtual
    clock decides which sampled clients' updates count and when. Off by default (`devices=none`,
    `availability=always`, `mode=sync`, no deadline, dropout or over-commitment): every client is
    online, finishes at once and reports in the same instant, and a run gives the numbers it gave
    before the clock existed."""

    devices: str = "none"
    """none (no device model: every client takes no time); synthetic (seeded heavy-tailed compute
    speeds and bandwidths, docs/traces.md states the distribution); or the path of a CSV / JSON
    device trace with columns client, flops_per_s, up_bps, down_bps and optional memory_mb."""
    availability: str = "always"
    """A registered availability model (settings/clock.py `AVAILABILITY`, `fedac list
    availability`): always; synthetic (a seeded diurnal on/off pattern per client); a plug-in's.
    Or the path of a CSV / JSON trace of per-client active intervals (client, start_s, end_s; a
    `period_s` column repeats them)."""
    fill: str = choice("cycle", ("cycle", "error"))
    """Clients a trace omits: cycle (the run's i-th client takes the trace's entry i mod entries, as
    FedScale maps its traces; one warning says how many) or error (the trace is refused, naming
    them). docs/traces.md."""
    deadline: float = number(0.0, ">= 0")
    """Virtual seconds a sync round waits for its clients; 0: no deadline (it waits for every
    client that finishes)."""
    overcommit: float = number(1.0, ">= 1")
    """Sample ceil(overcommit x K) clients and keep the first K that report (FedScale's
    over-commitment; K is train.fraction's cohort)."""
    dropout: float = number(0.0, "[0, 1)")
    """Per-round probability that a dispatched client fails mid-training (seeded per client and
    round): it contributes nothing."""
    partial: bool = False
    """A client that misses the deadline contributes the local steps it finished by then (instead
    of nothing), weighted by the share of its samples it processed."""
    mode: str = choice("sync", CLOCK_MODES)
    """A registered clock mode (settings/clock.py `CLOCK_MODES`, `fedac list clock_modes`): sync
    (rounds); fedbuff (Nguyen et al. 2022: `concurrency` clients train at once, the server applies
    the mean of every `buffer` arrived updates, each scaled by its staleness weight); fedasync (Xie
    et al. 2019: every arrival is mixed in at once with weight alpha x its staleness weight); a
    plug-in's. In the async modes one `train.rounds` round is one server update."""
    buffer: int = number(10, ">= 1")
    """FedBuff's K: updates per server step."""
    concurrency: int = number(0, ">= 0")
    """Async modes: clients training at once; 0: the sync cohort's size (train.fraction)."""
    max_staleness: int = number(10, ">= 0")
    """Async modes: an update computed on a model more than this many server steps old is
    discarded."""
    staleness_exponent: float = number(0.5, ">= 0")
    """Async modes: an update of staleness s is weighted (1 + s)^-a; 0.5 is FedBuff's and
    FedScale's 1/sqrt(1 + s), 0 weights every update alike."""
    alpha: float = number(0.6, "(0, 1]")
    """FedAsync's mixing weight: x <- (1 - a_s) x + a_s x_client with a_s = alpha (1 + s)^-a."""
    target_accuracy: float | None = number(None, "(0, 1]")
    """results.json reports the virtual time at which validation accuracy first reached this
    (None: not reported)."""


@dataclass
class CompressionConfig:
    """How client uploads are compressed on the wire (rules/compression.py, docs/compression.md):
    the update (upload - broadcast) of every method whose uploads are models of the broadcast's
    form; the byte ledger counts the compressed size. Off by default. In a Flower deployment each
    node sends the compressed bytes and keeps its own error-feedback residual."""

    method: str = choice("none", CODECS)
    """A registered codec (settings/codecs.py, `fedac list codecs`): none; topk / randk (send
    `ratio` of each update's entries, the whole update as one vector, with their indices: the
    largest in magnitude / a random subset seeded per client and round); qsgd (`levels`
    stochastic levels per entry and a norm per tensor, unbiased, seeded per client and round);
    int8 (a per-tensor scale and one byte per entry); bf16 (two bytes per entry)."""
    ratio: float = number(0.1, "(0, 1]")
    """topk / randk: the fraction of entries sent (k = max(1, ceil(ratio * entries)))."""
    levels: int = number(16, ">= 1")
    """qsgd: s, the quantisation levels."""
    error_feedback: bool | None = None
    """Keep what compression left out as client state (checkpointed) and add it to the next
    update. None: as the codec declares (on for the biased topk, randk, int8 and bf16; off for
    the unbiased qsgd, with which true is refused)."""
    download: bool = False
    """Quantise the broadcast model too (qsgd, int8 or bf16; without error feedback): the clients
    train from the quantised model and the ledger counts its bytes as received. The simulator
    only."""


@dataclass
class EvalConfig:
    """How the clients' held-out scores are summarised (results.json's per_client, clients.png,
    `fedac compare --worst`)."""

    min_client_clips: int = number(4, ">= 1")
    """The percentiles (p10 / p50 / p90) and the worst-10 % mean over clients count only the
    clients with at least this many held-out clips; the mean and std count every scored client.
    A client of k clips scores in steps of 1/k, and one at the typical accuracy p scores 0 by
    chance alone with probability (1 - p)^k: at p = 0.6 that is 16 % for k = 2 and 6.4 % for
    k = 3, enough to fill most of the worst 10 % with luck, and 2.6 % for k = 4. On the default
    run (240 speakers, data.local_holdout 0.2) 4 leaves out the 114 clients holding 1-3 held-out
    clips (25 / 46 / 43 of them) and ranks 126; its final worst-10 % mean then reads 14 % where
    over every client it reads 0. results.json's per_client says how many were left out."""


@dataclass
class LogConfig:
    """Experiment trackers (fedac/engine/tracking.py), written when a run ends, next to the run
    directory's own files."""

    tensorboard: bool = False
    """Write TensorBoard event files into <run directory>/tensorboard: metrics.csv's columns per
    round, each evaluation's per-client accuracies as histograms, confusion.png and clients.png.
    Needs the optional extra: pip install 'fedac[tensorboard]'."""
    mlflow: str | None = None
    """Log the run to MLflow: a directory (created if missing; a SQLite store DIR/mlflow.db with the
    artifacts in DIR/artifacts, which MLflow 3 reads back without opt-ins) or a tracking URI
    (sqlite:///..., http://...); params (every setting), metrics per round, final metrics and the
    run directory's files as artifacts. The run prints the line that reads it back (`mlflow ui
    --backend-store-uri sqlite:///DIR/mlflow.db`). None: off. Needs the optional extra: pip install
    'fedac[mlflow]'."""


def algorithm_sections() -> dict[str, type]:
    """Section name -> settings dataclass of every registered algorithm (built-ins and plug-ins),
    from the algorithm registry (settings/): each algorithm owns its settings in a file of its
    own."""
    sections: dict[str, type] = {}
    # (a broken plug-in is left out with a warning)
    for name, cls in ALGORITHMS.settings_classes().items():
        section = ALGORITHMS[name].section or name
        if (
            section in {f.name for f in dataclasses.fields(Config)}
            or sections.get(section, cls) is not cls
        ):
            raise ConfigError(
                f"algorithm '{name}' declares settings section '{section}', which another part "
                "holds"
            )
        sections[section] = cls
    return sections


@dataclass(eq=False)
class Config:
    """Every setting of a run. The fields below are shared by all algorithms; each registered
    algorithm adds its own section (`cfg.fedmlac`, a plug-in's `cfg.mine`), built from the algorithm
    registry when a Config is made (`algorithm_sections`), and each registered model, dataset,
    aggregator or attack adds its own fields to `model`, `data`, `aggregation` or `attack`
    (`section_class`), so a config.yaml written before keeps loading unchanged."""

    algorithm: str = choice("fedavg", ALGORITHMS)
    dataset: str = choice("speech_commands", DATASETS)
    seed: int = number(0, ">= 0")
    out: str | None = None
    """Run directory; None: runs/<timestamp>-<algorithm>-<dataset>-s<seed>."""
    data: DataConfig = field(default_factory=DataConfig)
    features: FeatureConfig = field(default_factory=FeatureConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    aggregation: AggregationConfig = field(default_factory=AggregationConfig)
    attack: AttackConfig = field(default_factory=AttackConfig)
    dp: PrivacyConfig = field(default_factory=PrivacyConfig)
    system: SystemConfig = field(default_factory=SystemConfig)
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    compression: CompressionConfig = field(default_factory=CompressionConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def __post_init__(self) -> None:
        for section in KIND_SECTIONS:  # plug-ins' settings join their kind's section
            cls, current = section_class(section), getattr(self, section)
            if type(current) is not cls:
                setattr(
                    self,
                    section,
                    cls(**{f.name: getattr(current, f.name) for f in dataclasses.fields(current)}),
                )
        for section, cls in algorithm_sections().items():
            setattr(self, section, cls())

    if typing.TYPE_CHECKING:
        # The algorithms' sections (`cfg.fedmlac`, a plug-in's) are set from the registry above, so
        # the type checker cannot see them: it takes any other attribute as Any.
        def __getattr__(self, name: str) -> Any: ...

    def sections(self) -> dict[str, Any]:
        """The algorithms' sections, by name (the shared ones are dataclass fields)."""
        shared = {f.name for f in dataclasses.fields(self)}
        return {
            name: value
            for name, value in vars(self).items()
            if name not in shared and not name.startswith("_")
        }

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.update({name: dataclasses.asdict(value) for name, value in self.sections().items()})
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and self.to_dict() == other.to_dict()


def _field_types(obj: Any) -> dict[str, Any]:
    """The settings `obj` holds, by name: its annotated fields, and on a Config the algorithms'
    sections."""
    hints = typing.get_type_hints(type(obj))
    if isinstance(obj, Config):
        hints.update({name: type(value) for name, value in obj.sections().items()})
    return hints


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Convert a YAML/CLI value to the annotated type, or raise ConfigError naming the key."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "")):
            return None
        return _coerce(value, options[0], key)
    if origin is list:
        (item_type,) = typing.get_args(annotation)
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"setting '{key}' expects a list, got {value!r}")
        return [_coerce(v, item_type, key) for v in value]
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):  # `--set x=1` arrives YAML-parsed as int
            return bool(value)
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"setting '{key}' expects true/false, got {value!r}")
    if annotation in (int, float, str) and (
        isinstance(value, (list, tuple, dict))
        or (isinstance(value, bool) and annotation is not str)
    ):
        # int(True) == 1 and str([...]) would silently turn a typo into a valid-looking setting.
        raise ConfigError(f"setting '{key}' expects {annotation.__name__}, got {value!r}")
    try:
        if annotation is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        if annotation is float:
            return float(value)
        if annotation is str:
            return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"setting '{key}' expects {annotation.__name__}, got {value!r}") from None
    return value


def _apply(
    obj: Any,
    values: dict[str, Any],
    prefix: str = "",
    given: dict[str, int] | None = None,
    layer: int = 0,
) -> None:
    """Set `values` on `obj`; `given` (if any) records the layer that set each key, a later layer a
    larger number."""
    hints = _field_types(obj)
    for name, value in values.items():
        key = f"{prefix}{name}"
        if name not in hints:
            known = ", ".join(sorted(prefix + h for h in hints))
            raise ConfigError(f"unknown setting '{key}'. Known settings here: {known}")
        current = getattr(obj, name)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(
                    f"setting '{key}' is a section; set its fields as {key}.<field>=..."
                )
            _apply(current, value, key + ".", given, layer)
        else:
            value = _coerce(value, hints[name], key)
            if key == "algorithm":  # named and loadable before its section is asked for
                # ConfigError listing the registered algorithms, or naming a broken plug-in
                ALGORITHMS[value]
            setattr(obj, name, value)
            if given is not None:
                given[key] = layer


def parse_override(text: str) -> tuple[str, Any]:
    """`a.b=c` -> ("a.b", yaml-parsed c). Raises ConfigError if there is no '='."""
    if "=" not in text:
        raise ConfigError(f"--set expects key=value, got {text!r}")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def _nest(key: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    node = out
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


#: Settings that moved, old name -> new name: the runtime settings, written under `train` before
#: they had a section of their own. A config file (every run directory's config.yaml of that time),
#: a flag or a --set that gives an old name is read as the new one.
RENAMED = {f"train.{f.name}": f"runtime.{f.name}" for f in dataclasses.fields(RuntimeConfig)}
#: The old names a notice was logged for in this process (one notice per name, however many files).
_NOTICED: set[str] = set()


def renamed_settings(values: dict[str, Any], where: str) -> dict[str, Any]:
    """One layer's settings (`where`: the file, flag or --set they came from), nested by section,
    with every old name of RENAMED moved to its new one. The first use of each old name logs a
    one-line warning naming the new name; a layer that gives one setting different values under
    its old and its new name is refused (ConfigError), since neither can be said to come later."""
    out = dict(values)
    for old, new in RENAMED.items():
        (old_section, old_name), (new_section, new_name) = old.split("."), new.split(".")
        section, target = out.get(old_section), out.get(new_section, {})
        if not isinstance(section, dict) or old_name not in section or not isinstance(target, dict):
            continue  # (a section that is no mapping: _apply says so)
        section, target = dict(section), dict(target)
        value = section.pop(old_name)
        if new_name in target and target[new_name] != value:
            raise ConfigError(
                f"{where} sets {old} = {value!r} and {new} = {target[new_name]!r}: {old} is the "
                f"old name of {new}; keep {new} alone"
            )
        target[new_name] = value
        out[old_section], out[new_section] = section, target
        if old not in _NOTICED:
            _NOTICED.add(old)
            log.warning("%s: %s is now %s (read as %s; write the new name)", where, old, new, new)
    return out


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    algorithm_defaults: bool = True,
    **flags: Any,
) -> Config:
    """Resolve defaults, the algorithm's run defaults (its registry entry's `defaults`, e.g.
    RUN_DEFAULTS in settings/fedmlac.py; unless `algorithm_defaults` is false), then a YAML file,
    then keyword flags (e.g. rounds=...), then `key=value` overrides, then the algorithm's `finish`
    hook. Every numeric setting is checked against its declared range before anything runs
    (ConfigError naming the key)."""
    given: dict[str, int] = {}
    _warn_repeated(overrides or [])
    cfg = _layered(Config(), path, overrides, flags, given)
    entry = ALGORITHMS[cfg.algorithm]
    entry = entry if isinstance(entry, Entry) else None  # (a plug-in may register its class itself)
    run_defaults = entry.run_defaults() if entry is not None and algorithm_defaults else {}
    if cfg.train.paper_optimizer:  # the paper's optimiser and weights, under the run's own layers
        from fedac.settings.paper import paper_settings

        run_defaults = {**run_defaults, **paper_settings(cfg.algorithm)}
    if run_defaults:
        # The algorithm is known only once every layer is read: start again with its defaults
        # underneath.
        base = Config()
        for key, value in run_defaults.items():
            _apply(base, renamed_settings(_nest(key, value), f"{cfg.algorithm}'s run defaults"))
        given.clear()
        cfg = _layered(base, path, overrides, flags, given)
    check_ranges(cfg)
    check_compute(cfg.runtime)
    if entry is not None and entry.finish:
        resolve(entry.finish)(cfg, given)
    # The keys a file, flag or --set gave (defaults adapted to the data never override them); not a
    # field: never saved.
    vars(cfg)["_given"] = dict(given)
    return cfg


def last_settings(overrides: list[str]) -> list[str]:
    """`overrides` without the ones a later `--set` of the same key replaces (the settings that
    take effect, in the order given): what a command's own layers pass on, so that a layer
    replacing an earlier one's value (a table's dataset after its protocol) raises no warning and
    two spellings of one configuration are one sweep."""
    keys = [parse_override(text)[0] for text in overrides]
    return [text for i, text in enumerate(overrides) if keys[i] not in keys[i + 1 :]]


def _warn_repeated(overrides: list[str]) -> None:
    """A warning for each key that several `--set`s give (the last one wins, as the shell's order
    says, and an earlier one was likely meant to be kept)."""
    values: dict[str, list[str]] = {}
    for text in overrides:
        key, _ = parse_override(text)
        values.setdefault(key, []).append(text.split("=", 1)[1].strip())
    for key, given in values.items():
        if len(given) > 1:
            log.warning(
                "--set %s is given %d times (%s): the last one, %s=%s, is kept",
                key,
                len(given),
                ", ".join(given),
                key,
                given[-1],
            )


def algorithm_defaults(name: str) -> dict[str, Any]:
    """The run defaults algorithm `name` sets under a config file, flags and --set ({} for none)."""
    entry = ALGORITHMS[name]
    return entry.run_defaults() if isinstance(entry, Entry) else {}


def _layered(
    cfg: Config,
    path: str | Path | None,
    overrides: list[str] | None,
    flags: dict[str, Any],
    given: dict[str, int],
) -> Config:
    """Apply the config file (layer 0), the flags (1), then each override (2, 3, ...) onto `cfg`."""
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping of settings")
        _apply(cfg, renamed_settings(loaded, f"config file {path}"), given=given, layer=0)
    for key, value in flags.items():
        if value is not None:
            _apply(cfg, renamed_settings(_nest(key, value), key), given=given, layer=1)
    for layer, text in enumerate(overrides or [], start=2):
        key, value = parse_override(text)
        _apply(cfg, renamed_settings(_nest(key, value), f"--set {text}"), given=given, layer=layer)
    return cfg


#: The evaluations `fit_eval_schedule` gives a short run at least (where its rounds allow).
MIN_EVALUATIONS = 5


def fit_eval_schedule(cfg: Config) -> str | None:
    """A new `fedac run` whose train.eval_every no file, flag or --set gave evaluates at least
    MIN_EVALUATIONS times where its rounds allow: every max(1, rounds // MIN_EVALUATIONS) rounds
    when that is more often (`--rounds 5` every round, not only at its last). Sets the value in
    `cfg` (config.yaml records it, so a rerun of that file and a resume repeat it) and returns the
    line saying so, or None when nothing changed. Evaluation draws no random numbers, so training
    is unchanged; train.select=best_val chooses among more rounds."""
    if "train.eval_every" in vars(cfg).get("_given", {}):
        return None
    before, rounds = cfg.train.eval_every, cfg.train.rounds
    every = max(1, min(before, rounds // MIN_EVALUATIONS))
    if every == before:
        return None
    cfg.train.eval_every = every
    return (
        f"train.eval_every {before} -> {every}: a run of {rounds} rounds evaluates every {every} "
        f"(set train.eval_every to keep {before})"
    )


#: The partition settings and the schemes that read them (data/partition.py).
PARTITION_SETTINGS = {
    "num_clients": ("dirichlet", "iid"),
    "alpha": ("dirichlet",),
    "min_client_size": ("dirichlet",),
    "group_by_source": ("dirichlet",),
    "min_speaker_clips": ("natural",),
}


def not_applied(cfg: Config) -> dict[str, str]:
    """The `data` settings the run's partition does not read and the `selection` settings its rule
    does not read ("data.<name>" -> why), as config.yaml notes them. A user's dataset (audiofolder,
    hf: no stand-in) without a client column deals its clips over data.num_clients even under
    `natural`, which only its data tell: it gets no notes."""
    spec = DATASETS[cfg.dataset]
    scheme = str(cfg.data.partition or getattr(spec, "default_partition", "natural"))
    unread = not_read(cfg.selection.method)
    if scheme == "natural" and getattr(spec, "synthesizer", None) is None:
        return unread
    what = {
        "natural": " (the dataset's own clients: its speakers or actors)",
        "pooled": " (one client holds every training clip)",
    }.get(scheme, "")
    return {
        f"data.{name}": f"not applied under data.partition={scheme}{what}; read by "
        f"{' / '.join(schemes)}"
        for name, schemes in PARTITION_SETTINGS.items()
        if scheme not in schemes
    } | unread


def save_config(cfg: Config, path: str | Path) -> None:
    """config.yaml: every setting, a setting the run does not read marked with a YAML comment
    saying why (`not_applied`); the file loads back as the same Config."""
    lines, section = yaml.safe_dump(cfg.to_dict(), sort_keys=False).splitlines(), ""
    notes = not_applied(cfg)
    for k, line in enumerate(lines):
        if not line.startswith(" "):
            section = line.split(":", 1)[0]
        elif line.startswith("  ") and not line.startswith("   ") and ":" in line:
            note = notes.get(f"{section}.{line.strip().split(':', 1)[0]}")
            if note:
                lines[k] = f"{line}  # {note}"
    Path(path).write_text("\n".join(lines) + "\n")
