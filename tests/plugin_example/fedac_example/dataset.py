# fedac_example/dataset.py
"""A dataset: its on-disk layout <root>/<client>/<class>/<split>-<n>.wav, a loader from that layout
to a Manifest, and a synthesizer that writes a small stand-in in the layout (used when data.root is
unset)."""

import wave
from pathlib import Path

import numpy as np

from fedac.data.manifest import Clip, Manifest
from fedac.errors import DatasetError

CLASSES = ["low", "mid", "high"]
SPLITS = {"train": 6, "val": 1, "test": 1}  # clips per client, class and split
RATE = 16000


def load_manifest(root: Path, cfg) -> Manifest:
    clips = []
    for path in sorted(Path(root).glob("*/*/*.wav")):
        client, label, split = path.parent.parent.name, path.parent.name, path.stem.split("-")[0]
        if label not in CLASSES or split not in SPLITS:
            raise DatasetError(
                f"{path}: expected <client>/<{'|'.join(CLASSES)}>/<train|val|test>-<n>.wav"
            )
        clips.append(Clip(str(path), CLASSES.index(label), client, split))
    if not clips:
        raise DatasetError(f"{root} holds no <client>/<class>/<split>-<n>.wav clips")
    return Manifest("tones", str(root), list(CLASSES), clips)


def generate(out_dir, seed=0, progress=False, clients=6):
    out = Path(out_dir)
    if (out / "DONE").is_file():
        return
    rng = np.random.default_rng(seed)
    t = np.arange(RATE) / RATE
    for k in range(clients):
        # each client's timbre: the weight of the second harmonic
        harmonic = 0.2 + 0.6 * k / clients
        for c, label in enumerate(CLASSES):
            (out / f"client{k}" / label).mkdir(parents=True, exist_ok=True)
            for split, count in SPLITS.items():
                for n in range(count):
                    f0 = 220.0 * 2**c * rng.uniform(0.9, 1.1)
                    onset = rng.uniform(0.1, 0.4)  # a half-second tone burst in background noise
                    burst = (t >= onset) & (t < onset + 0.5)
                    audio = burst * (
                        np.sin(2 * np.pi * f0 * t) + harmonic * np.sin(4 * np.pi * f0 * t)
                    )
                    audio = 0.3 * audio / np.abs(audio).max() + 0.02 * rng.standard_normal(RATE)
                    with wave.open(str(out / f"client{k}" / label / f"{split}-{n}.wav"), "wb") as w:
                        w.setnchannels(1), w.setsampwidth(2), w.setframerate(RATE)
                        w.writeframes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())
    (out / "DONE").write_text("")
