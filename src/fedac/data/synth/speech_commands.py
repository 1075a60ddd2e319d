"""Synthetic Google Speech Commands v0.02, rendered offline with espeak-ng.

:func:`generate` writes the real dataset's on-disk layout, so any GSC loader can read it::

    <out>/<word>/<speaker>_nohash_<n>.wav    35 words, 16 kHz mono int16, exactly 1 s
    <out>/validation_list.txt                 relative paths of the validation clips
    <out>/testing_list.txt                    relative paths of the test clips
    <out>/_background_noise_/*.wav            six 30 s noise recordings
    <out>/SYNTHETIC.txt                       provenance
    <out>/.fedac_complete                     JSON marker, written last

A *speaker* is an espeak-ng accent x voice variant with its own pitch, intonation range,
speaking rate, level, microphone colouring (EQ, optional low-pass, optional room reverb) and
noise floor. Like the real corpus the data is non-IID across speakers: every speaker records
a personal subset of the words with uneven repeat counts, the command words being the most
frequent, and the number of clips per speaker is heavy-tailed. Each speaker's clips all land
in one split (train / validation / testing, about 80/10/10 % of the speakers).

Everything derives from ``seed``: the same seed gives byte-identical files whatever the
number of workers; different seeds give different speakers and recordings.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy import signal

from fedac.data import layout
from fedac.data.synth import espeak

__all__ = ["WORDS", "SAMPLE_RATE", "generate"]

# Word groups of GSC v0.02 with sampling weights roughly matching the real clip counts
# (~3.9k per command word, ~3.8k per digit, ~2k per auxiliary word, ~1.6k per v0.02 addition).
_WORD_GROUPS: tuple[tuple[tuple[str, ...], float], ...] = (
    (("yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go"), 2.5),
    (("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"), 2.4),
    (("bed", "bird", "cat", "dog", "happy", "house", "marvin", "sheila", "tree", "wow"), 1.3),
    (("backward", "forward", "follow", "learn", "visual"), 1.0),
)
WORDS: tuple[str, ...] = tuple(sorted(w for group, _ in _WORD_GROUPS for w in group))
_WORD_WEIGHT = np.array(
    [next(wt for group, wt in _WORD_GROUPS if w in group) for w in WORDS], dtype=np.float64
)

SAMPLE_RATE = layout.SAMPLE_RATE
_CLIP = SAMPLE_RATE  # samples per clip: exactly one second
_MAX_WORD = int(0.96 * _CLIP)  # longest rendered word that still fits with a little margin
_FORMAT_VERSION = 2  # bump whenever the same seed would render different audio

_BACKGROUND_DIR = "_background_noise_"
_LISTS = {"validation": "validation_list.txt", "testing": "testing_list.txt"}
_README = "SYNTHETIC.txt"
_OWNED = (*WORDS, _BACKGROUND_DIR, *_LISTS.values(), _README)  # top-level entries generate() writes
_SPLIT_FRACTION = 0.1  # of the speakers, for each of validation and testing
_BACKGROUND_SECONDS = 30

# Independent random streams derived from the seed (see numpy SeedSequence).
_PLAN_STREAM, _SPEAKER_STREAM, _BACKGROUND_STREAM = 1, 2, 3

# Final punctuation changes espeak's intonation contour: a cheap source of prosodic variety.
_ENDINGS = ("", ".", "!", "?")
_ENDING_P = (0.4, 0.3, 0.2, 0.1)

_BACKGROUNDS = (
    "white_noise",
    "pink_noise",
    "brown_noise",
    "electric_hum",
    "running_tap",
    "babble",
)


@dataclass
class _Speaker:
    """Everything a worker needs to render one speaker's clips (picklable for spawn)."""

    index: int
    speaker_id: str
    split: str
    voice: str
    pitch: float
    pitch_range: float
    rate: float
    level_db: float  # speech RMS in dBFS
    noise_db: float  # background noise RMS in dBFS
    noise_exponent: float  # 0 white .. 2 brown
    timbre: np.ndarray  # second-order sections at 16 kHz (microphone / vocal-tract colouring)
    room: np.ndarray | None  # impulse response, or None for a dry recording
    counts: dict[str, int] = field(default_factory=dict)  # word -> number of repetitions


# --------------------------------------------------------------------------- DSP helpers


def _colored_noise(n: int, rng: np.random.Generator, exponent: float) -> np.ndarray:
    """Unit-RMS noise with power spectrum ~ 1/f**exponent (0 white, 1 pink, 2 brown)."""
    spectrum = np.fft.rfft(rng.standard_normal(n))
    freqs = np.fft.rfftfreq(n, d=1.0 / SAMPLE_RATE)
    # Clamp below 20 Hz so brown noise has no DC drift.
    spectrum *= np.maximum(freqs, 20.0) ** (-exponent / 2.0)
    out = np.fft.irfft(spectrum, n)
    return out / (np.sqrt(np.mean(out**2)) + 1e-12)


def _peaking_eq(freq: float, gain_db: float, q: float) -> np.ndarray:
    """One peaking-EQ biquad as a second-order section (audio-EQ-cookbook design)."""
    a = 10.0 ** (gain_db / 40.0)
    w0 = 2.0 * np.pi * freq / SAMPLE_RATE
    alpha = np.sin(w0) / (2.0 * q)
    b = np.array([1.0 + alpha * a, -2.0 * np.cos(w0), 1.0 - alpha * a])
    den = np.array([1.0 + alpha / a, -2.0 * np.cos(w0), 1.0 - alpha / a])
    return np.concatenate([b / den[0], den / den[0]])[None, :]


def _random_timbre(rng: np.random.Generator) -> np.ndarray:
    """A speaker's fixed colouring: mic high-pass, 2-3 EQ bands, maybe a band-limiting low-pass."""
    sections = [signal.butter(2, rng.uniform(60, 250), "highpass", fs=SAMPLE_RATE, output="sos")]
    for _ in range(rng.integers(2, 4)):
        sections.append(
            _peaking_eq(
                freq=float(np.exp(rng.uniform(np.log(150), np.log(5500)))),
                gain_db=float(rng.choice([-1, 1]) * rng.uniform(2, 9)),
                q=float(rng.uniform(0.7, 2.5)),
            )
        )
    if rng.random() < 0.6:  # cheap phone / laptop microphones cut the top end
        order = int(rng.integers(2, 5))
        sections.append(
            signal.butter(order, rng.uniform(3000, 7500), "lowpass", fs=SAMPLE_RATE, output="sos")
        )
    return np.concatenate(sections)


def _random_room(rng: np.random.Generator) -> np.ndarray | None:
    """Impulse response of a small room (exponentially decaying noise tail), or None (dry)."""
    if rng.random() < 0.5:
        return None
    rt60 = rng.uniform(0.15, 0.5)
    t = np.arange(int(rt60 * SAMPLE_RATE)) / SAMPLE_RATE
    tail = rng.standard_normal(t.size) * np.exp(-6.9 * t / rt60)  # -60 dB at rt60
    tail *= 10.0 ** (rng.uniform(-22, -10) / 20.0) / np.sqrt(np.sum(tail**2))
    tail[0] = 1.0  # direct sound
    return tail


def _fade(x: np.ndarray, ms: float = 5.0) -> np.ndarray:
    """Short raised-cosine fade in/out so cut edges do not click."""
    n = min(int(ms * SAMPLE_RATE / 1000), x.size // 2)
    if n > 0:
        ramp = 0.5 - 0.5 * np.cos(np.linspace(0, np.pi, n))
        x = x.copy()
        x[:n] *= ramp
        x[-n:] *= ramp[::-1]
    return x


def _trim(x: np.ndarray, floor_db: float = -40.0, pad_ms: float = 15.0) -> np.ndarray:
    """Cut espeak's leading/trailing silence: keep from first to last sample above the floor."""
    if x.size == 0:
        return x
    loud = np.flatnonzero(np.abs(x) > np.abs(x).max() * 10.0 ** (floor_db / 20.0))
    pad = int(pad_ms * SAMPLE_RATE / 1000)
    return x[max(loud[0] - pad, 0) : loud[-1] + pad + 1]


@functools.lru_cache(maxsize=4)
def _resampling_filter(up: int, down: int) -> np.ndarray:
    """resample_poly's default anti-aliasing FIR, designed once instead of on every call."""
    max_rate = max(up, down)
    return signal.firwin(20 * max_rate + 1, 1.0 / max_rate, window=("kaiser", 5.0))


def _to_16k(x: np.ndarray, rate: int) -> np.ndarray:
    if rate == SAMPLE_RATE:
        return x.astype(np.float64)
    g = np.gcd(SAMPLE_RATE, rate)
    up, down = SAMPLE_RATE // g, rate // g
    return signal.resample_poly(x.astype(np.float64), up, down, window=_resampling_filter(up, down))


# --------------------------------------------------------------------------- planning


def _speaker_ids(rng: np.random.Generator, n: int) -> list[str]:
    """n distinct 8-hex-digit ids, like the hashed speaker ids of GSC."""
    ids: list[str] = []
    seen: set[str] = set()
    while len(ids) < n:
        for value in rng.integers(0, 2**32, size=n, dtype=np.uint64):
            sid = f"{int(value):08x}"
            if sid not in seen and len(ids) < n:
                seen.add(sid)
                ids.append(sid)
    return ids


def _word_counts(rng: np.random.Generator) -> dict[str, int]:
    """A speaker's personal vocabulary and repeat counts (heavy-tailed total, mean ~30, min 5)."""
    total = min(5 + int(rng.lognormal(mean=np.log(25.0) - 0.405, sigma=0.9)), 250)
    k = min(int(rng.integers(10, len(WORDS) + 1)), total)
    p = _WORD_WEIGHT / _WORD_WEIGHT.sum()
    chosen = rng.choice(len(WORDS), size=k, replace=False, p=p)
    # Personal preference on top of the global word frequency -> uneven repeats per word.
    pref = rng.dirichlet(np.full(k, 0.8)) * _WORD_WEIGHT[chosen]
    counts = 1 + rng.multinomial(total - k, pref / pref.sum())
    return {WORDS[i]: int(c) for i, c in sorted(zip(chosen, counts))}


def _voice_names() -> list[str]:
    """Every English accent x voice variant of the bundled espeak-ng data, e.g. ``en-us+Alex``."""
    return [f"{a}+{v}" for a in espeak.english_voices() for v in espeak.voice_variants()]


def _plan(n_speakers: int, seed: int) -> list[_Speaker]:
    if n_speakers < 3:
        raise ValueError("need at least 3 speakers (one each for train, validation, testing)")
    rng = np.random.default_rng([seed, _PLAN_STREAM])
    ids = _speaker_ids(rng, n_speakers)

    # Distinct accent x variant pairs while they last; beyond that pairs repeat but every
    # other attribute is still drawn per speaker.
    combos = _voice_names()
    voices: list[str] = []
    while len(voices) < n_speakers:
        voices.extend(combos[i] for i in rng.permutation(len(combos)))

    n_held_out = max(1, round(_SPLIT_FRACTION * n_speakers))
    order = rng.permutation(n_speakers)
    split_of = {int(i): "validation" for i in order[:n_held_out]}
    split_of.update({int(i): "testing" for i in order[n_held_out : 2 * n_held_out]})

    return [
        _Speaker(
            index=i,
            speaker_id=ids[i],
            split=split_of.get(i, "train"),
            voice=voices[i],
            pitch=rng.uniform(15, 85),
            pitch_range=rng.uniform(20, 90),
            rate=float(np.exp(rng.uniform(np.log(125), np.log(215)))),
            level_db=rng.uniform(-30, -16),
            noise_db=rng.uniform(-68, -48),
            noise_exponent=rng.uniform(0.0, 2.0),
            timbre=_random_timbre(rng),
            room=_random_room(rng),
            counts=_word_counts(rng),
        )
        for i in range(n_speakers)
    ]


# --------------------------------------------------------------------------- rendering


def _say(word: str, spk: _Speaker, rng: np.random.Generator) -> np.ndarray:
    """One utterance of ``word`` at 16 kHz, trimmed, with per-utterance prosody jitter."""
    engine = espeak.engine()
    text = word + _ENDINGS[rng.choice(len(_ENDINGS), p=_ENDING_P)]
    pitch = float(np.clip(spk.pitch + rng.normal(0, 4), 0, 100))
    pitch_range = float(np.clip(spk.pitch_range + rng.normal(0, 6), 0, 100))
    rate = spk.rate * float(np.exp(rng.normal(0, 0.07)))
    seed = int(rng.integers(2**31))
    for _ in range(4):  # a slow speaker may overrun 1 s: speak faster and retry
        x = engine.synth(
            text,
            spk.voice,
            rate=int(np.clip(round(rate), 80, 450)),
            pitch=round(pitch),
            pitch_range=round(pitch_range),
            seed=seed,
            fresh=False,  # the speaker task resets the engine once (see _run_task)
        )
        x = _trim(_to_16k(x, engine.sample_rate))
        if x.size <= _MAX_WORD:
            return x
        rate *= 1.3
    return _fade(x[:_MAX_WORD])


def _clip(word: str, spk: _Speaker, rng: np.random.Generator) -> np.ndarray:
    """A 1 s recording: word at a random offset, speaker colouring, level jitter, noise floor."""
    speech = _fade(_say(word, spk, rng))
    if speech.size == 0 or not np.any(speech):
        raise espeak.EspeakError(f"espeak rendered no audio for {word!r} with {spk.voice!r}")
    start = int(rng.integers(0, _CLIP - speech.size + 1))
    x = np.zeros(_CLIP)
    x[start : start + speech.size] = speech
    x = signal.sosfilt(spk.timbre, x)
    if spk.room is not None:
        x = signal.fftconvolve(x, spk.room)[:_CLIP]
    active = x[start : start + speech.size]
    level = 10.0 ** ((spk.level_db + rng.normal(0, 2.5)) / 20.0)
    x *= level / (np.sqrt(np.mean(active**2)) + 1e-12)
    noise_level = 10.0 ** ((spk.noise_db + rng.normal(0, 2.0)) / 20.0)
    x += noise_level * _colored_noise(_CLIP, rng, spk.noise_exponent)
    peak = np.abs(x).max()
    return x * (0.97 / peak) if peak > 0.97 else x


def _render_speaker(spk: _Speaker, out: Path, seed: int) -> tuple[str, int]:
    # The stream depends on (seed, index) only, so scheduling cannot change the output.
    rng = np.random.default_rng([seed, _SPEAKER_STREAM, spk.index])
    for word, count in spk.counts.items():
        for n in range(count):
            layout.write_wav(out / word / f"{spk.speaker_id}_nohash_{n}.wav", _clip(word, spk, rng))
    return spk.split, sum(spk.counts.values())


def _babble(n: int, rng: np.random.Generator) -> np.ndarray:
    """Several espeak talkers reading random word strings at once (cafeteria-like)."""
    engine = espeak.engine()
    combos = _voice_names()
    vocabulary = list(WORDS) + "the a and of to in is it that was for with as at by".split()
    mix = np.zeros(n)
    for _ in range(6):
        voice = combos[rng.integers(len(combos))]
        pitch, rate = int(rng.integers(20, 80)), int(rng.integers(140, 220))
        parts, length = [], 0
        while length < n:
            phrase = " ".join(rng.choice(vocabulary, size=int(rng.integers(4, 10))))
            x = _to_16k(
                engine.synth(
                    phrase,
                    voice,
                    rate=rate,
                    pitch=pitch,
                    seed=int(rng.integers(2**31)),
                    fresh=False,  # reset once per task (see _run_task)
                ),
                engine.sample_rate,
            )
            parts += [x, np.zeros(int(rng.integers(800, 8000)))]
            length += x.size + parts[-1].size
        talker = np.concatenate(parts)[:n]
        mix += talker * 10.0 ** (rng.uniform(-6, 0) / 20.0) / (np.sqrt(np.mean(talker**2)) + 1e-12)
    return mix


def _background(name: str, rng: np.random.Generator) -> np.ndarray:
    n = _BACKGROUND_SECONDS * SAMPLE_RATE
    t = np.arange(n) / SAMPLE_RATE
    if name in ("white_noise", "pink_noise", "brown_noise"):
        exponent = {"white_noise": 0.0, "pink_noise": 1.0, "brown_noise": 2.0}[name]
        x = _colored_noise(n, rng, exponent)
    elif name == "electric_hum":
        mains = rng.choice([50.0, 60.0])
        wobble = 1.0 + 0.05 * np.sin(2 * np.pi * rng.uniform(0.1, 0.5) * t)
        x = sum(
            np.sin(2 * np.pi * mains * h * t + rng.uniform(0, 2 * np.pi)) / h**1.2
            for h in range(1, 12)
        )
        x = x * wobble + 0.05 * _colored_noise(n, rng, 1.0)
    elif name == "running_tap":
        hiss = signal.sosfilt(
            signal.butter(4, [700, 6000], "bandpass", fs=SAMPLE_RATE, output="sos"),
            rng.standard_normal(n),
        )
        # Slow random surging of the flow plus occasional droplet "plinks".
        surge = signal.sosfilt(
            signal.butter(2, 3.0, "lowpass", fs=SAMPLE_RATE, output="sos"), rng.standard_normal(n)
        )
        x = hiss * (1.0 + 2.0 * surge / (np.abs(surge).max() + 1e-12))
        drop_t = np.arange(int(0.03 * SAMPLE_RATE)) / SAMPLE_RATE
        for onset in rng.integers(0, n - drop_t.size, size=_BACKGROUND_SECONDS * 8):
            f = rng.uniform(800, 3000)
            x[onset : onset + drop_t.size] += (
                rng.uniform(1, 4) * np.sin(2 * np.pi * f * drop_t) * np.exp(-drop_t / 0.005)
            )
    elif name == "babble":
        x = _babble(n, rng)
    else:  # pragma: no cover - names come from _BACKGROUNDS
        raise ValueError(name)
    x = np.asarray(x, dtype=np.float64)
    return _fade(x * 10.0 ** (rng.uniform(-24, -16) / 20.0) / (np.sqrt(np.mean(x**2)) + 1e-12))


def _run_task(task: tuple) -> tuple[str, int]:
    """Pool entry point: ("speaker", _Speaker, out, seed) or ("background", name, out, seed)."""
    kind, item, out, seed = task
    # One espeak reset per task instead of per utterance (5x faster): a task's audio then
    # depends only on the task, not on which worker ran it or what that worker did before.
    espeak.engine().reset()
    if kind == "speaker":
        return _render_speaker(item, out, seed)
    index = _BACKGROUNDS.index(item)
    rng = np.random.default_rng([seed, _BACKGROUND_STREAM, index])
    layout.write_wav(out / _BACKGROUND_DIR / f"{item}.wav", _background(item, rng))
    return "background", 0


# --------------------------------------------------------------------------- driver


def _readme(seed: int, n_speakers: int, stats: dict) -> str:
    try:
        from importlib.metadata import version

        loader_version = version("espeakng-loader")
    except Exception:  # pragma: no cover - metadata missing in odd installs
        loader_version = "unknown"
    return (
        "SYNTHETIC stand-in for Google Speech Commands v0.02 -- not real speech.\n\n"
        "Generated by fedac.data.synth.speech_commands.generate() with espeak-ng\n"
        f"(espeakng-loader {loader_version}), format version {_FORMAT_VERSION}.\n"
        f"seed: {seed}\nspeakers: {n_speakers}\n"
        f"speakers per split: {json.dumps(stats['speakers_per_split'])}\n"
        f"clips per split: {json.dumps(stats['clips_per_split'])}\n\n"
        "Layout and file naming follow GSC v0.02 (16 kHz mono 16-bit, 1 s clips,\n"
        "validation_list.txt / testing_list.txt, _background_noise_/). Each speaker is an\n"
        "espeak-ng English accent x voice variant with its own pitch, rate, microphone\n"
        "colouring, room and noise floor; splits are speaker-disjoint.\n"
        "espeak-ng is GPL-3.0-or-later; the generated audio carries no third-party recordings.\n"
    )


def generate(
    out_dir: str | Path,
    speakers: int = 300,
    seed: int = 0,
    workers: int = 2,
    progress: bool = True,
) -> dict:
    """Generate (or reuse) a synthetic GSC v0.02 tree under ``out_dir``.

    If ``out_dir`` already holds a complete generation with the same ``seed`` and ``speakers``
    it is returned as is (``stats["cached"]`` is True). A partial generation (interrupted run)
    or one with other parameters is removed and regenerated; a directory that holds word
    folders but was not written by this function raises ``FileExistsError`` rather than being
    deleted. ``workers`` > 1 renders speakers in a process pool (fork on Linux, else spawn).

    Returns stats: ``speakers_per_split``, ``clips_per_split``, ``total_clips``, ``seconds``,
    ``cached``, plus ``seed``, ``speakers`` and ``out_dir``.
    """
    t0 = time.perf_counter()
    out = Path(out_dir)
    params = {"format_version": _FORMAT_VERSION, "seed": int(seed), "speakers": int(speakers)}

    done = layout.finished_stats(
        out, params, WORDS, what="contains word folders that were not written by fedac's generator"
    )
    if done is not None:
        stats = dict(done, seconds=time.perf_counter() - t0)
        return dict(stats, out_dir=str(out), seed=int(seed), speakers=int(speakers))

    plan = _plan(int(speakers), int(seed))  # validates arguments before touching the disk
    layout.start(out, params, _OWNED)
    for word in WORDS:
        (out / word).mkdir()
    (out / _BACKGROUND_DIR).mkdir()

    # Longest jobs first (babble, then the busiest speakers) so the pool finishes together.
    tasks: list[tuple[str, str | _Speaker, Path, int]]
    tasks = [("background", name, out, int(seed)) for name in reversed(_BACKGROUNDS)]
    tasks += [
        ("speaker", spk, out, int(seed))
        for spk in sorted(plan, key=lambda s: -sum(s.counts.values()))
    ]
    splits = ("train", "validation", "testing")
    clips = dict.fromkeys(splits, 0)
    for split, n in layout.run_tasks(
        _run_task, tasks, int(workers), "synth speech commands", progress
    ):
        clips[split] = clips.get(split, 0) + n
    clips.pop("background", None)

    for split, list_name in _LISTS.items():
        lines = sorted(
            f"{word}/{spk.speaker_id}_nohash_{n}.wav"
            for spk in plan
            if spk.split == split
            for word, count in spk.counts.items()
            for n in range(count)
        )
        (out / list_name).write_text("".join(line + "\n" for line in lines))

    stats = {
        "speakers_per_split": {s: sum(spk.split == s for spk in plan) for s in splits},
        "clips_per_split": {s: clips[s] for s in splits},
        "total_clips": sum(clips.values()),
    }
    (out / _README).write_text(_readme(int(seed), int(speakers), stats))
    layout.finish(out, params, stats)  # the marker goes last
    stats.update(
        cached=False,
        seconds=time.perf_counter() - t0,
        out_dir=str(out),
        seed=int(seed),
        speakers=int(speakers),
    )
    return stats
