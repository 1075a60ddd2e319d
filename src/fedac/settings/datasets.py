"""The dataset registry (`--dataset`, the `dataset` setting) and each dataset's own settings.

A `DatasetSpec` names a corpus's loader and embedded stand-in as "module:function" strings (imported
when a run uses them) and may name its settings dataclass (`settings=`): `Config` adds those fields
to the `data` section (`--set data.task=12`), beside the shared ones (partition, num_clients, ...:
config.py). This module imports no torch, so a dataset's name and settings are checked when the
config loads; fedac.data.registry re-exports the table with the functions that load a dataset.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fedac.fields import number
from fedac.registry import Registry, resolve


@dataclass
class SpeechCommandsSettings:
    task: str = "35"  # (checked by the loader, data/gsc.py, as the construction below)
    """Speech Commands: "35" (all words) or "12" (10 words + _silence_ + _unknown_)."""
    gsc12: str = "fedac"
    """Speech Commands 12-class construction: fedac (every other word is _unknown_, background-noise
    slices are _silence_) or fedkws (FedKWS-UI's: per split, 10% of the ten words' clip count drawn
    from the other words as _unknown_ and another 10% with a zeroed waveform as _silence_, both
    keeping their speaker)."""
    synth_speakers: int = number(300, ">= 1")
    """Speakers of the embedded synthetic Speech Commands (used only when root is None)."""


@dataclass
class HFSettings:
    audio_column: str = "audio"
    """--dataset hf: the column holding each clip (datasets Audio: bytes, path or array +
    sampling_rate)."""
    label_column: str = "label"
    """--dataset hf: the class column (ClassLabel, strings or integers)."""
    speaker_column: str = "speaker_id"
    """--dataset hf: the natural client column, used when present (none: dealt like audiofolder's
    clips)."""


@dataclass(frozen=True)
class DatasetSpec:
    loader: str
    """'module:function' with signature (root, DataConfig) -> Manifest."""
    synthesizer: str | None
    """'module:function' with signature (out_dir, seed=..., progress=..., **kw) writing the official
    layout."""
    default_partition: str
    description: str
    synth_command: str | None = None
    """CLI verb that writes the stand-in: `fedac data <synth_command> --out DIR [--<synth_size_arg>
    N]`."""
    synth_size_arg: str | None = None
    """Name of the synthesizer's size keyword (speakers, actors, ...), exposed as a CLI option."""
    synth_kwargs: Callable[[Any], dict] = lambda data: {}
    """Size arguments for the embedded stand-in taken from the data config (config.DataConfig, e.g.
    its number of speakers)."""
    settings: str | type | None = None
    """The dataset's own settings dataclass (or its "module:Class", no torch): fields of the `data`
    section."""

    def load_fn(self) -> Callable[..., Any]:
        """The loader, (root, config.DataConfig) -> data.manifest.Manifest (imported now)."""
        return resolve(self.loader)


#: The dataset registry (fedac/registry.py): built-ins here, plug-ins from the `fedac.datasets`
#: entry points. fedac.data.registry re-exports it.
DATASETS = Registry(
    "dataset",
    {
        "speech_commands": DatasetSpec(
            "fedac.data.gsc:load_manifest",
            "fedac.data.synth.speech_commands:generate",
            "natural",
            "Google Speech Commands v0.02 keyword spotting (35 or 12 classes), client = speaker",
            synth_command="synth-speech-commands",
            synth_size_arg="speakers",
            synth_kwargs=lambda data: {"speakers": data.synth_speakers},
            settings=SpeechCommandsSettings,
        ),
        "urbansound8k": DatasetSpec(
            "fedac.data.urbansound8k:load_manifest",
            "fedac.data.synth.urban:generate",
            "dirichlet",
            "UrbanSound8K sound events (10 classes), test = one official fold, Dirichlet over 50 "
            "clients grouped by fsID",
            synth_command="synth-urban",
            synth_size_arg="recordings",
            # The stand-in's default size (synth.urban.DEFAULT_RECORDINGS), named in its cache
            # folder.
            synth_kwargs=lambda data: {"recordings": 800},
        ),
        "cremad": DatasetSpec(
            "fedac.data.cremad:load_manifest",
            "fedac.data.synth.emotions:generate",
            "natural",
            "CREMA-D emotions (ANG HAP SAD NEU), client = actor (all 91), test = a held-out actor "
            "fold",
            synth_command="synth-emotions",
            synth_size_arg="actors",
            synth_kwargs=lambda data: {"actors": 91},
        ),
        "iemocap": DatasetSpec(
            "fedac.data.iemocap:load_manifest",
            "fedac.data.synth.iemocap:generate",
            "natural",
            "IEMOCAP improvised emotions (neu hap+exc sad ang), client = speaker, "
            "leave-one-session-out test",
            synth_command="synth-iemocap",
            synth_size_arg="scenarios",
            synth_kwargs=lambda data: {"scenarios": 8},
        ),
        "librispeech": DatasetSpec(
            "fedac.data.librispeech:load_manifest",
            "fedac.data.synth.librispeech:generate",
            "natural",
            "LibriSpeech CTC speech recognition (characters), client = speaker, test-clean + "
            "test-other; SSL models only",
            synth_command="synth-librispeech",
            synth_size_arg="speakers",
            synth_kwargs=lambda data: {"speakers": 100},
        ),
        "voxceleb1": DatasetSpec(
            "fedac.data.voxceleb1:load_manifest",
            "fedac.data.synth.voxceleb1:generate",
            "iid",
            "VoxCeleb1 speaker identification (IID over data.num_clients) + verification trials "
            "(EER); SSL models only",
            synth_command="synth-voxceleb1",
            synth_size_arg="speakers",
            synth_kwargs=lambda data: {"speakers": 200},
        ),
        # natural: metadata.csv's client column, or (without one) training clips dealt IID over
        # data.num_clients
        "audiofolder": DatasetSpec(
            "fedac.data.audiofolder:load_manifest",
            None,
            "natural",
            "your own clips: data.root=DIR with DIR/<label>/*.wav or DIR/metadata.csv "
            "(file,label[,client][,split])",
        ),
        # natural: the speaker column (data.speaker_column), or (without one) training clips dealt
        # IID like audiofolder's
        "hf": DatasetSpec(
            "fedac.data.hf:load_manifest",
            None,
            "natural",
            "a Hugging Face datasets folder: data.root=DIR from save_to_disk or parquet files "
            "(needs fedac[hf])",
            settings=HFSettings,
        ),
    },
)
