"""A dataset reduced to what federated training needs: which clip, which label, which client, which
split.

Every loader (gsc.py, urbansound8k.py, cremad.py, iemocap.py) turns an official on-disk layout into
a Manifest; everything downstream (features, partitions, the engine) only sees Manifests.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class Clip:
    path: str
    """Absolute path of the audio file."""
    label: int
    client: str
    """Natural client id: speaker, actor or recording source."""
    split: str
    """train, val or test."""
    group: str = ""
    """Source-recording key; clips sharing it stay together in grouped partitions. Empty: the
    path."""
    offset: float = 0.0
    """Start of the clip inside the file, seconds (e.g. 1 s slices of a long background-noise
    file)."""
    duration: float | None = None
    """Seconds to read from offset; None reads to the end of the file."""
    text: str = ""
    """Transcript of a speech-recognition clip (normalised, `data.text`); empty for
    classification."""

    @property
    def source(self) -> str:
        return self.group or self.path


@dataclass
class Manifest:
    name: str
    """Dataset identity used in cache keys, e.g. 'speech_commands-35'."""
    root: str
    classes: list[str]
    clips: list[Clip] = field(default_factory=list)
    kind: str = "classification"
    """classification (a label per clip) or ctc (a transcript per clip; `classes` is the character
    vocabulary)."""
    trials: list[tuple[str, str, int]] = field(default_factory=list)
    """Speaker-verification trials (path a, path b, 1 = same speaker), e.g. VoxCeleb1's
    veri_test2.txt."""
    dealt: bool = False
    """The data names no clients: training clips were dealt at random (IID) over data.num_clients
    (audiofolder / hf without a client column, layout.user_manifest), so the clients are not
    natural."""

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def split_indices(self, split: str) -> list[int]:
        return [i for i, clip in enumerate(self.clips) if clip.split == split]

    def counts(self) -> dict[str, int]:
        counts = Counter(clip.split for clip in self.clips)
        return {split: counts.get(split, 0) for split in SPLITS}
