"""A tiny Speech Commands v0.02 tree of tones (no espeak): fast fixture for loader and engine tests.

Each word is a chord of two tones whose frequencies identify the word, so models can learn it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf

from fedac.data.gsc import WORDS_35

RATE = 16000


def word_tone(
    word_index: int, speaker_index: int, rng: np.random.Generator, seconds: float = 1.0
) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    shift = 1.0 + 0.03 * (speaker_index % 5)
    f1, f2 = (200 + 60 * word_index) * shift, (900 + 97 * (word_index % 7)) * shift
    audio = 0.3 * np.sin(2 * np.pi * f1 * t) + 0.2 * np.sin(2 * np.pi * f2 * t)
    return (audio + 0.01 * rng.standard_normal(len(t))).astype(np.float32)


def make_gsc_tree(
    root: Path, speakers: int = 8, words: list[str] | None = None, clips: int = 1, seed: int = 0
) -> Path:
    """Speakers 0..speakers-1; the last two are the validation and test speakers."""
    rng = np.random.default_rng(seed)
    root = Path(root)
    val, test = [], []
    for w, word in enumerate(WORDS_35):
        (root / word).mkdir(parents=True, exist_ok=True)
        if words is not None and word not in words:
            continue
        for s in range(speakers):
            speaker = f"{s:08x}"
            for n in range(clips):
                name = f"{word}/{speaker}_nohash_{n}.wav"
                sf.write(root / name, word_tone(w, s, rng), RATE, subtype="PCM_16")
                if s == speakers - 2:
                    val.append(name)
                elif s == speakers - 1:
                    test.append(name)
    (root / "validation_list.txt").write_text("\n".join(val) + "\n")
    (root / "testing_list.txt").write_text("\n".join(test) + "\n")
    (root / "_background_noise_").mkdir(exist_ok=True)
    sf.write(
        root / "_background_noise_" / "white_noise.wav",
        0.1 * rng.standard_normal(RATE * 5).astype(np.float32),
        RATE,
    )
    return root
