"""Synthetic emotional speech in the CREMA-D layout, rendered offline with espeak-ng.

:func:`generate` writes what `fedac.data.cremad` reads::

    <out>/AudioWAV/<actor>_<sentence>_<emotion>_<level>.wav   16 kHz mono int16, about 1.5-3 s
    <out>/SYNTHETIC.txt                                        provenance
    <out>/.fedac_complete                                      JSON marker, written last

As in CREMA-D, actors 1001.. read the 12 sentences (IEO TIE IOM IWW TAI MTI IWL ITH DFA ITS TSI WSI)
in the emotions ANG HAP SAD NEU, level XX (unspecified), except IEO, read neutral once and in ANG,
HAP, SAD at the levels LO, MD and HI; each actor also reads one sentence in DIS and FEA, which the
4-class loader must leave out. 54 kept clips per actor, 4914 for the default 91 actors.

An actor is an espeak-ng accent x voice variant (distinct pairs) with its own base pitch,
intonation range, speaking rate, expressiveness, loudness, microphone band and noise floor.
Emotion is acted through prosody and voice quality relative to the actor's neutral voice:
pitch level and range, rate, loudness, spectral tilt, and for some emotions roughness (fast
random pitch perturbation), saturation, tremor and breathiness. Each utterance scales its emotion
by an intensity = level x actor expressiveness x a random factor, and some deliveries are nearly
flat, so the classes overlap: learnable, not trivial, and harder across actors than within one.

Deterministic: every random draw derives from (seed, purpose, actor[, file]), so the files do not
depend on the number of workers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import signal

from fedac.data import layout
from fedac.data.synth import espeak
from fedac.seeding import numpy_rng

__all__ = ["SENTENCES", "EMOTIONS", "DEFAULT_ACTORS", "SAMPLE_RATE", "generate", "plan_files"]

SAMPLE_RATE = layout.SAMPLE_RATE
DEFAULT_ACTORS = 91
FIRST_ACTOR = 1001
_FORMAT_VERSION = 1
_AUDIO_DIR = "AudioWAV"
_README = "SYNTHETIC.txt"

SENTENCES = {
    "IEO": "It's eleven o'clock",
    "TIE": "That is exactly what happened",
    "IOM": "I'm on my way to the meeting",
    "IWW": "I wonder what this is about",
    "TAI": "The airplane is almost full",
    "MTI": "Maybe tomorrow it will be cold",
    "IWL": "I would like a new alarm clock",
    "ITH": "I think I have a doctor's appointment",
    "DFA": "Don't forget a jacket",
    "ITS": "I think I've seen this before",
    "TSI": "The surface is slick",
    "WSI": "We'll stop in a couple of minutes",
}
EMOTIONS = ("ANG", "HAP", "SAD", "NEU")  # the 4-class task; DIS and FEA are written as distractors
_LEVEL_INTENSITY = {"LO": 0.55, "MD": 0.85, "HI": 1.25, "XX": 1.0}
# Variants that do not voice (whisper) or are a single effect (croak): no pitch, no prosody to act.
_UNVOICED = frozenset({"whisper", "whisperf", "croak"})


@dataclass(frozen=True)
class _Prosody:
    """An emotion's change from the actor's neutral voice at intensity 1."""

    pitch: float = 0.0  # espeak pitch units (0..100 scale)
    pitch_range: float = 0.0  # espeak range units
    rate: float = 1.0  # speaking-rate factor
    gain_db: float = 0.0
    tilt_db: float = 0.0  # level of the band above ~1.5 kHz (+ brighter, - darker)
    roughness: float = 0.0  # depth of fast random pitch perturbation (jitter)
    drive: float = 0.0  # tanh saturation (pressed, strained voice)
    tremor: float = 0.0  # depth of 4-7 Hz pitch and loudness modulation
    breath: float = 0.0  # level of aspiration noise relative to the voice
    exclaim: float = 0.0  # probability of reading the sentence with '!'


_PROSODY = {
    "NEU": _Prosody(exclaim=0.05),
    "ANG": _Prosody(
        pitch=8,
        pitch_range=12,
        rate=1.10,
        gain_db=6,
        tilt_db=6,
        roughness=0.012,
        drive=1.5,
        exclaim=0.6,
    ),
    "HAP": _Prosody(pitch=16, pitch_range=28, rate=1.08, gain_db=2.5, tilt_db=2.5, exclaim=0.45),
    "SAD": _Prosody(
        pitch=-12, pitch_range=-25, rate=0.80, gain_db=-5, tilt_db=-6, tremor=0.012, breath=0.5
    ),
    "DIS": _Prosody(pitch=-6, pitch_range=-5, rate=0.88, gain_db=1, tilt_db=-2, roughness=0.006),
    "FEA": _Prosody(pitch=14, pitch_range=-5, rate=1.15, gain_db=-2, tremor=0.02, breath=0.3),
}


@dataclass(frozen=True)
class _Actor:
    actor_id: int
    voice: str
    pitch: float
    pitch_range: float
    rate: float  # words per minute
    expressiveness: float
    level_db: float  # speech RMS in dBFS
    noise_db: float
    highpass_hz: float
    lowpass_hz: float
    extra_sentence: str  # read in DIS and FEA


def plan_files(extra_sentence: str) -> list[tuple[str, str, str]]:
    """(sentence, emotion, level) of every file an actor records; DIS and FEA only for
    `extra_sentence`."""
    files = [(s, e, "XX") for s in SENTENCES if s != "IEO" for e in EMOTIONS]
    files += [("IEO", "NEU", "XX")] + [
        ("IEO", e, lv) for e in EMOTIONS if e != "NEU" for lv in ("LO", "MD", "HI")
    ]
    files += [(extra_sentence, "DIS", "XX"), (extra_sentence, "FEA", "XX")]
    return files


def plan_actors(actors: int, seed: int, purpose: str = "cremad-actors") -> list[_Actor]:
    """`actors` distinct espeak voices with their own pitch, rate, expressiveness, level and
    channel."""
    rng = numpy_rng(seed, purpose)
    variants = [v for v in espeak.voice_variants() if v not in _UNVOICED]
    pairs = [f"{a}+{v}" for a in espeak.english_voices() for v in variants]
    voices: list[str] = []
    while len(voices) < actors:  # distinct accent x variant pairs while they last
        voices.extend(pairs[i] for i in rng.permutation(len(pairs)))
    return [
        _Actor(
            actor_id=FIRST_ACTOR + i,
            voice=voices[i],
            pitch=rng.uniform(25, 75),
            pitch_range=rng.uniform(35, 60),
            rate=float(np.exp(rng.uniform(np.log(145), np.log(195)))),
            expressiveness=rng.uniform(0.6, 1.3),
            level_db=rng.uniform(-28, -18),
            noise_db=rng.uniform(-66, -50),
            highpass_hz=rng.uniform(60, 200),
            lowpass_hz=rng.uniform(4500, 7600),
            extra_sentence=str(rng.choice(list(SENTENCES))),
        )
        for i in range(actors)
    ]


def _to_16k(x: np.ndarray, rate: int) -> np.ndarray:
    g = np.gcd(SAMPLE_RATE, rate)
    return signal.resample_poly(x.astype(np.float64), SAMPLE_RATE // g, rate // g)


def _trim(x: np.ndarray, floor_db: float = -40.0) -> np.ndarray:
    loud = np.flatnonzero(np.abs(x) > np.abs(x).max() * 10.0 ** (floor_db / 20.0))
    return x[loud[0] : loud[-1] + 1]


def _warp(x: np.ndarray, speed: np.ndarray) -> np.ndarray:
    """Read x at a time-varying speed (1 = unchanged): modulates pitch and timing together."""
    positions = np.cumsum(speed)
    positions = positions[positions < len(x) - 1]
    return np.interp(positions, np.arange(len(x)), x)


def _smooth_noise(n: int, cutoff_hz: float, rng: np.random.Generator) -> np.ndarray:
    """Unit-RMS low-pass noise (a random but smooth modulation signal)."""
    sos = signal.butter(2, cutoff_hz, "lowpass", fs=SAMPLE_RATE, output="sos")
    y = signal.sosfilt(sos, rng.standard_normal(n))
    return y / (np.sqrt(np.mean(y**2)) + 1e-12)


def _envelope(x: np.ndarray) -> np.ndarray:
    sos = signal.butter(2, 30.0, "lowpass", fs=SAMPLE_RATE, output="sos")
    return np.maximum(signal.sosfiltfilt(sos, np.abs(x)), 0.0)


def _voice_quality(x: np.ndarray, p: _Prosody, s: float, rng: np.random.Generator) -> np.ndarray:
    n = len(x)
    t = np.arange(n) / SAMPLE_RATE
    speed = np.ones(n)
    if p.roughness:
        speed += s * p.roughness * _smooth_noise(n, rng.uniform(30, 70), rng)
    if p.tremor:
        speed += (
            s * p.tremor * np.sin(2 * np.pi * rng.uniform(4, 7) * t + rng.uniform(0, 2 * np.pi))
        )
    if p.roughness or p.tremor:
        x = _warp(x, speed)
        t = t[: len(x)]
    if p.tremor:
        x = x * (1 + 8 * s * p.tremor * np.sin(2 * np.pi * rng.uniform(4, 7) * t))
    if p.tilt_db:
        highs = signal.sosfilt(signal.butter(1, 1500, "highpass", fs=SAMPLE_RATE, output="sos"), x)
        x = x + (10 ** (s * p.tilt_db / 20) - 1) * highs
    if p.breath:
        hiss = signal.sosfilt(
            signal.butter(2, [1500, 6000], "bandpass", fs=SAMPLE_RATE, output="sos"),
            rng.standard_normal(len(x)),
        )
        hiss *= _envelope(x) / (np.sqrt(np.mean(hiss**2)) + 1e-12)
        x = x + min(s, 2.0) * p.breath * hiss
    if p.drive:
        g = 1 + s * p.drive * 3
        peak = np.abs(x).max() + 1e-12
        x = np.tanh(g * x / peak) * peak / np.tanh(g)
    return x


def _render(actor: _Actor, sentence: str, emotion: str, level: str, seed: int) -> np.ndarray:
    rng = numpy_rng(seed, "cremad-utterance", actor.actor_id, sentence, emotion, level)
    p = _PROSODY[emotion]
    s = _LEVEL_INTENSITY[level] * actor.expressiveness * float(np.exp(rng.normal(0, 0.3)))
    if rng.random() < 0.12:  # a flat, barely acted delivery
        s *= 0.25
    text = SENTENCES[sentence] + ("!" if rng.random() < p.exclaim else ".")
    return perform(actor, text, emotion, s, rng)


def perform(
    actor: _Actor, text: str, emotion: str, s: float, rng: np.random.Generator
) -> np.ndarray:
    """`actor` reads `text` acting `emotion` (a key of the prosody table) at intensity `s`: 16 kHz
    audio with the actor's band, level, pauses and noise floor. Shared by the CREMA-D and IEMOCAP
    stand-ins."""
    p = _PROSODY[emotion]
    eng = espeak.engine()
    raw = eng.synth(
        text,
        actor.voice,
        rate=int(np.clip(actor.rate * np.exp(s * np.log(p.rate) + rng.normal(0, 0.07)), 80, 450)),
        pitch=int(np.clip(round(actor.pitch + s * p.pitch + rng.normal(0, 6)), 0, 100)),
        pitch_range=int(
            np.clip(round(actor.pitch_range + s * p.pitch_range + rng.normal(0, 10)), 0, 100)
        ),
        seed=int(rng.integers(2**31)),
    )
    if raw.size == 0 or not np.any(raw):
        raise espeak.EspeakError(f"espeak rendered no audio for {text!r} with {actor.voice!r}")
    x = _voice_quality(_trim(_to_16k(raw, eng.sample_rate)), p, s, rng)
    band = signal.butter(
        2, [actor.highpass_hz, actor.lowpass_hz], "bandpass", fs=SAMPLE_RATE, output="sos"
    )
    x = signal.sosfilt(band, x)
    level = 10 ** ((actor.level_db + s * p.gain_db + rng.normal(0, 2.5)) / 20)
    x *= level / (np.sqrt(np.mean(x**2)) + 1e-12)
    lead, tail = (int(rng.uniform(0.05, 0.3) * SAMPLE_RATE) for _ in range(2))
    x = np.concatenate([np.zeros(lead), x, np.zeros(tail)])
    x += 10 ** ((actor.noise_db + rng.normal(0, 2)) / 20) * rng.standard_normal(len(x))
    peak = np.abs(x).max()
    return x * (0.97 / peak) if peak > 0.97 else x


def _render_actor(task: tuple) -> int:
    actor, out, seed = task
    files = plan_files(actor.extra_sentence)
    for sentence, emotion, level in files:
        x = _render(actor, sentence, emotion, level, seed)
        layout.write_wav(out / _AUDIO_DIR / f"{actor.actor_id}_{sentence}_{emotion}_{level}.wav", x)
    return len(files)


def generate(
    out_dir: str | Path,
    actors: int = DEFAULT_ACTORS,
    seed: int = 0,
    progress: bool = True,
    workers: int = 2,
) -> dict:
    """Generate (or reuse) a synthetic CREMA-D tree under `out_dir`; returns its stats.

    A complete generation with the same seed and actors is returned as is (stats["cached"] True);
    an interrupted or differently-sized one is replaced; a folder holding an AudioWAV that fedac
    did not write raises FileExistsError.
    """
    start = time.perf_counter()
    out = Path(out_dir)
    params = {
        "generator": "cremad",
        "format_version": _FORMAT_VERSION,
        "seed": int(seed),
        "actors": int(actors),
    }
    if int(actors) < 1:  # validate before touching the disk
        raise ValueError(f"need at least one actor, got {actors}")
    cached = layout.cached_stats(out, params, [_AUDIO_DIR, _README])
    if cached is not None:
        return dict(cached, seconds=round(time.perf_counter() - start, 3), out_dir=str(out))
    plan = plan_actors(int(actors), int(seed))
    (out / _AUDIO_DIR).mkdir()
    counts = layout.run_tasks(
        _render_actor, [(a, out, int(seed)) for a in plan], workers, "synth cremad", progress
    )
    kept = sum(len([f for f in plan_files(a.extra_sentence) if f[1] in EMOTIONS]) for a in plan)
    stats = {"actors": len(plan), "files": int(sum(counts)), "kept_files": kept}
    (out / _README).write_text(
        "SYNTHETIC stand-in for CREMA-D -- not real speech.\n"
        "Generated by fedac.data.synth.emotions.generate() with espeak-ng, format version "
        f"{_FORMAT_VERSION}.\nseed: {seed}\nactors: {actors} "
        f"({FIRST_ACTOR}..{FIRST_ACTOR + actors - 1})\nfiles: {stats['files']}\nEmotions are acted "
        "by prosody and voice-quality changes of espeak-ng voices.\nespeak-ng is GPL-3.0-or-later; "
        "the audio contains no third-party recordings.\n"
    )
    layout.finish(out, params, stats)
    return dict(
        stats, cached=False, seconds=round(time.perf_counter() - start, 3), out_dir=str(out)
    )
