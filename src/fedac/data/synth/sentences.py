"""Synthetic read sentences for the speech stand-ins beyond keywords (LibriSpeech, VoxCeleb1
layouts).

A *talker* is the Speech Commands stand-in's speaker model (speech_commands.py): an espeak-ng accent
x voice variant with its own pitch, intonation range, speaking rate, level, microphone colouring,
room and noise floor. A sentence comes from a small grammar (subject, verb, object, place, time;
about 200 words), so transcripts share words across speakers as read speech does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy import signal

from fedac.data.synth import espeak
from fedac.data.synth.speech_commands import (
    SAMPLE_RATE,
    _colored_noise,
    _fade,
    _random_room,
    _random_timbre,
    _speaker_ids,
    _to_16k,
    _trim,
    _voice_names,
)

_SUBJECTS = (
    "the old man",
    "a young girl",
    "my brother",
    "the farmer",
    "his mother",
    "our teacher",
    "the captain",
    "a tall woman",
    "the little boy",
    "her father",
    "the doctor",
    "a quiet student",
    "the king",
    "my neighbour",
    "the baker",
    "a strange dog",
    "the soldier",
    "your sister",
    "the driver",
    "a poor fisherman",
)
_VERBS = (
    "found",
    "painted",
    "carried",
    "opened",
    "lost",
    "sold",
    "watched",
    "cleaned",
    "brought",
    "dropped",
    "kept",
    "hid",
    "wanted",
    "bought",
    "broke",
    "followed",
    "counted",
    "remembered",
    "took",
    "showed",
)
_OBJECTS = (
    "a red box",
    "the heavy stone",
    "three apples",
    "an old letter",
    "the silver key",
    "a green hat",
    "the broken chair",
    "some fresh bread",
    "a small boat",
    "the wooden door",
    "two black horses",
    "a golden ring",
    "the big map",
    "a warm coat",
    "the blue bottle",
    "seven coins",
    "a long rope",
    "the white flowers",
    "an empty basket",
    "the iron gate",
)
_PLACES = (
    "in the garden",
    "near the river",
    "at the station",
    "by the window",
    "under the bridge",
    "in the kitchen",
    "on the hill",
    "behind the house",
    "at the market",
    "in the forest",
    "across the road",
    "inside the church",
    "on the ship",
    "near the school",
    "in the village",
)
_TIMES = (
    "yesterday",
    "last night",
    "this morning",
    "before dinner",
    "after the rain",
    "every sunday",
    "in the winter",
    "at noon",
    "a week ago",
    "before sunrise",
    "during the storm",
    "that evening",
)


def sentence(rng: np.random.Generator) -> str:
    """One grammar sentence in LibriSpeech's transcript form (upper case, no punctuation)."""
    words = [
        _SUBJECTS[rng.integers(len(_SUBJECTS))],
        _VERBS[rng.integers(len(_VERBS))],
        _OBJECTS[rng.integers(len(_OBJECTS))],
    ]
    if rng.random() < 0.7:
        words.append(_PLACES[rng.integers(len(_PLACES))])
    if rng.random() < 0.5:
        words.append(_TIMES[rng.integers(len(_TIMES))])
    return " ".join(words).upper()


@dataclass
class Talker:
    """Everything a worker needs to render one speaker's sentences (picklable)."""

    index: int
    speaker_id: str
    voice: str
    pitch: float
    pitch_range: float
    rate: float
    level_db: float
    noise_db: float
    noise_exponent: float
    timbre: np.ndarray
    room: np.ndarray | None
    snr_db: float | None = None
    """Additive noise at this SNR over the speech (harder conditions), or None: only the noise
    floor."""


def talkers(rng: np.random.Generator, n: int) -> list[Talker]:
    """n speakers with distinct ids, drawn as the Speech Commands stand-in draws its speakers."""
    ids = _speaker_ids(rng, n)
    combos = _voice_names()
    voices: list[str] = []
    while len(voices) < n:
        voices.extend(combos[i] for i in rng.permutation(len(combos)))
    return [
        Talker(
            i,
            ids[i],
            voices[i],
            rng.uniform(15, 85),
            rng.uniform(20, 90),
            float(np.exp(rng.uniform(np.log(140), np.log(200)))),
            rng.uniform(-30, -16),
            rng.uniform(-68, -48),
            rng.uniform(0.0, 2.0),
            _random_timbre(rng),
            _random_room(rng),
        )
        for i in range(n)
    ]


def harder(talker: Talker, rng: np.random.Generator) -> Talker:
    """LibriSpeech test-other-like conditions: 30-45% faster speech, noise at 10-20 dB SNR, and a
    reverberant room (RT60 0.4-0.8 s)."""
    rt60 = rng.uniform(0.4, 0.8)
    t = np.arange(int(rt60 * SAMPLE_RATE)) / SAMPLE_RATE
    tail = rng.standard_normal(t.size) * np.exp(-6.9 * t / rt60)
    tail *= 10.0 ** (rng.uniform(-12, -6) / 20.0) / np.sqrt(np.sum(tail**2))
    tail[0] = 1.0
    return replace(
        talker,
        rate=talker.rate * rng.uniform(1.3, 1.45),
        room=tail,
        snr_db=float(rng.uniform(10, 20)),
    )


def render(text: str, talker: Talker, rng: np.random.Generator) -> np.ndarray:
    """One utterance of `text` at 16 kHz: espeak-ng speech, the talker's colouring, room and
    noise."""
    engine = espeak.engine()
    x = engine.synth(
        text.lower(),
        talker.voice,
        rate=int(np.clip(round(talker.rate * np.exp(rng.normal(0, 0.05))), 80, 450)),
        pitch=round(float(np.clip(talker.pitch + rng.normal(0, 4), 0, 100))),
        pitch_range=round(float(np.clip(talker.pitch_range + rng.normal(0, 6), 0, 100))),
        seed=int(rng.integers(2**31)),
        fresh=False,
    )
    speech = _fade(_trim(_to_16k(x, engine.sample_rate)))
    if speech.size == 0 or not np.any(speech):
        raise espeak.EspeakError(f"espeak rendered no audio for {text!r} with {talker.voice!r}")
    pad = int(rng.uniform(0.05, 0.25) * SAMPLE_RATE)
    x = np.concatenate([np.zeros(pad), speech, np.zeros(pad)])
    x = signal.sosfilt(talker.timbre, x)
    if talker.room is not None:
        x = signal.fftconvolve(x, talker.room)[: x.size]
    active = x[pad : pad + speech.size]
    x *= 10.0 ** ((talker.level_db + rng.normal(0, 2.0)) / 20.0) / (
        np.sqrt(np.mean(active**2)) + 1e-12
    )
    speech_rms = np.sqrt(np.mean(x[pad : pad + speech.size] ** 2))
    x += 10.0 ** ((talker.noise_db + rng.normal(0, 2.0)) / 20.0) * _colored_noise(
        x.size, rng, talker.noise_exponent
    )
    if talker.snr_db is not None:
        x += (
            speech_rms
            * 10.0 ** (-talker.snr_db / 20.0)
            * _colored_noise(x.size, rng, rng.uniform(0.0, 1.0))
        )
    peak = np.abs(x).max()
    return x * (0.97 / peak) if peak > 0.97 else x
