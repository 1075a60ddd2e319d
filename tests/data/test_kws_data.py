"""`data.gsc12=fedkws`: FedKWS-UI's 12-class Speech Commands construction on a GSC tree."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from fedac.config import load_config
from fedac.data.features import _clip_windows
from fedac.data.gsc import load_manifest
from fedac.errors import DatasetError

WORDS = 10


def manifest(root, construction):
    return load_manifest(
        root, load_config(overrides=["data.task=12", f"data.gsc12={construction}"]).data
    )


def test_fedkws_twelve_class_construction(gsc_root):
    m = manifest(gsc_root, "fedkws")
    silence, unknown = m.classes.index("_silence_"), m.classes.index("_unknown_")
    for split in ("train", "val", "test"):
        clips = [c for c in m.clips if c.split == split]
        words = sum(c.label not in (silence, unknown) for c in clips)
        counts = Counter(c.label for c in clips)
        # the fixture: 6 training speakers (val, test: 1 each) x 2 clips x 10 words; 10% each for
        # the negatives
        assert words == {"train": 120, "val": 20, "test": 20}[split]
        assert counts[unknown] == counts[silence] == round(0.1 * words)
    train_speakers = {c.client for c in m.clips if c.split == "train" and c.label < WORDS}
    negatives = [c for c in m.clips if c.label in (silence, unknown)]
    # the source clip's speaker
    assert {c.client for c in negatives if c.split == "train"} <= train_speakers
    assert all(c.duration == 0.0 for c in negatives if c.label == silence)  # zeroed waveform
    # unknown and silence draw different clips
    assert len({c.path for c in negatives}) == len(negatives)
    zeroed = m.clips.index(next(c for c in negatives if c.label == silence))
    (window,) = _clip_windows(m, zeroed, load_config().features, 100.0, 0)
    assert window.shape == (16000,) and not np.any(window)


def test_fedac_construction_is_the_default_and_differs(gsc_root):
    default = load_manifest(gsc_root, load_config(overrides=["data.task=12"]).data)
    unknown = default.classes.index("_unknown_")
    # every other word
    assert sum(c.label == unknown and c.split == "train" for c in default.clips) == 6 * 2 * 25
    with pytest.raises(DatasetError, match="data.gsc12 must be fedac or fedkws"):
        manifest(gsc_root, "speechbrain")


def test_min_speaker_clips_drops_small_speakers(gsc_root):
    from fedac.data.partition import partition

    m = manifest(gsc_root, "fedkws")
    sizes = {
        c.name: c.num_samples + len(c.holdout)
        for c in partition(m, load_config().data, 0, "natural")
    }
    # keeps the speakers holding at least the median count
    cut = sorted(sizes.values())[len(sizes) // 2]
    kept = partition(m, load_config(overrides=[f"data.min_speaker_clips={cut}"]).data, 0, "natural")
    assert {c.name for c in kept} == {name for name, n in sizes.items() if n >= cut} != set(sizes)
    with pytest.raises(DatasetError, match="data.min_speaker_clips=1000"):
        partition(m, load_config(overrides=["data.min_speaker_clips=1000"]).data, 0, "natural")
