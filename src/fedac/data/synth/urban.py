"""Synthetic urban sounds in the UrbanSound8K layout, generated procedurally (espeak-ng for voices).

:func:`generate` writes what `fedac.data.urbansound8k` reads::

    <out>/audio/fold1..fold10/<fsID>-<classID>-<occurrence>-<slice>.wav   16 kHz mono int16, <= 4 s
    <out>/metadata/UrbanSound8K.csv      slice_file_name,fsID,start,end,salience,fold,classID,class
    <out>/SYNTHETIC.txt                  provenance
    <out>/.fedac_complete                JSON marker, written last

Like the real corpus, a *recording* (fsID) of one class holds one or more occurrences of the
sound; each occurrence is cut into consecutive 4 s slices, the last one shorter, so short files
exist and padding is exercised. Every slice of a recording lies in one fold, and recordings of each
class are dealt evenly over the 10 folds. Salience 1 (foreground) recordings get their noise bed at
0-20 dB SNR, salience 2 (background) ones at -6-3 dB; half of the recordings also hold a quieter
sound of another class (-15 to -3 dB), as real street scenes do, and every recording has its own
microphone / distance colouring (band limits and two EQ bands).

Occurrences are shorter than in the real corpus (1.5-6 s, events 0.5-4 s: about 1.8 slices per
fsID against 6.7): the default 800 recordings then give ~1470 slices from enough distinct fsIDs
for the protocol's grouped Dirichlet split over 50 clients (at alpha 0.3-1.0 with the default
minimum client size; alpha 0.1 needs data.min_client_size of about 2 at this size).

Each class has a procedural source whose parameters are drawn per recording (so slices of one
recording resemble each other more than slices of two recordings, which is why the protocol groups
by fsID): air conditioner (mains-like hum, fan modulation, filtered noise), car horn (one or two
harmonic tones in honks), children playing (espeak-ng child-like voices plus shrieks), dog bark
(formant-filtered harmonic bursts), drilling (motor whine with spin-up/down), engine idling (firing
pulses and rumble), gun shot (impulses with decay and reverb tail), jackhammer (fast impact
trains), siren (wail / yelp / hi-lo sweeps), street music (chords, melody and drums). Related
classes (air conditioner vs engine idling, drilling vs jackhammer) are confusable on purpose.

Deterministic: every draw derives from (seed, purpose, fsID), so files do not depend on workers.
"""

from __future__ import annotations

import csv
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy import signal
from scipy.fft import next_fast_len
from scipy.ndimage import uniform_filter1d

from fedac.data import layout
from fedac.data.synth import espeak
from fedac.data.urbansound8k import CLASSES, COLUMNS, METADATA
from fedac.seeding import numpy_rng

__all__ = ["DEFAULT_RECORDINGS", "SAMPLE_RATE", "generate"]

SAMPLE_RATE = layout.SAMPLE_RATE
SR = SAMPLE_RATE
DEFAULT_RECORDINGS = 800
SLICE_SECONDS = 4.0
_MIN_TAIL = 0.3  # seconds; shorter remainders of an occurrence are not written as slices
_FORMAT_VERSION = 1
_README = "SYNTHETIC.txt"
# Event classes come in short occurrences (fewer, shorter slices), as in the real corpus.
_EVENTS = frozenset({"car_horn", "gun_shot"})


@dataclass
class _Recording:
    fs_id: int
    class_id: int
    fold: int
    salience: int
    snr_db: float  # foreground over the noise bed
    interferer: int | None = None  # classID of a quieter sound of another class in the scene
    interferer_db: float = 0.0  # its level relative to the foreground
    # (start, duration) seconds
    occurrences: list[tuple[float, float]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return CLASSES[self.class_id]

    def slices(self) -> list[tuple[int, int, float, float]]:
        """(occurrence, slice, start, end) of every slice file; a tail under _MIN_TAIL s is not
        cut."""
        out = []
        for occ, (start, duration) in enumerate(self.occurrences):
            cuts = [
                a
                for a in np.arange(0.0, duration, SLICE_SECONDS)
                if a == 0 or duration - a >= _MIN_TAIL
            ]
            for k, a in enumerate(cuts):
                out.append((occ, k, start + a, start + min(a + SLICE_SECONDS, duration)))
        return out


# --------------------------------------------------------------------------- planning


def _plan(recordings: int, seed: int) -> list[_Recording]:
    if recordings < len(CLASSES):
        raise ValueError(
            f"need at least {len(CLASSES)} recordings (one per class), got {recordings}"
        )
    rng = numpy_rng(seed, "urban-plan")
    fs_ids = rng.choice(np.arange(1000, 200000), size=recordings, replace=False)
    classes = np.arange(recordings) % len(CLASSES)
    plan = []
    deal = int(rng.integers(10))  # one round-robin over all classes: every fold gets recordings
    for c in range(len(CLASSES)):
        event = CLASSES[c] in _EVENTS
        for i in rng.permutation(np.flatnonzero(classes == c)):
            salience = 1 if rng.random() < 0.6 else 2
            rec = _Recording(
                fs_id=int(fs_ids[i]),
                class_id=c,
                fold=deal % 10 + 1,
                salience=salience,
                snr_db=float(rng.uniform(0, 20) if salience == 1 else rng.uniform(-6, 3)),
            )
            if rng.random() < 0.5:  # street scenes mix sources: the label is the salient one
                rec.interferer = int((c + rng.integers(1, len(CLASSES))) % len(CLASSES))
                rec.interferer_db = float(rng.uniform(-15, -3))
            at = 0.0
            for _ in range(1 if rng.random() < 0.7 else int(rng.integers(2, 4))):
                at += float(rng.uniform(0, 20))
                duration = float(rng.uniform(0.5, 4.0) if event else rng.uniform(1.5, 6.0))
                rec.occurrences.append((round(at, 4), round(duration, 4)))
                at += duration
            plan.append(rec)
            deal += 1
    return sorted(plan, key=lambda r: r.fs_id)


# --------------------------------------------------------------------------- DSP helpers


def _noise(n: int, rng: np.random.Generator, exponent: float = 0.0) -> np.ndarray:
    """Unit-RMS noise with power ~ 1/f**exponent (0 white, 1 pink, 2 brown)."""
    size = next_fast_len(n, real=True)  # odd or prime lengths make the FFT slow
    spectrum = np.fft.rfft(rng.standard_normal(size))
    spectrum *= np.maximum(np.fft.rfftfreq(size, 1.0 / SR), 20.0) ** (-exponent / 2.0)
    x = np.fft.irfft(spectrum, size)[:n]
    return x / (np.sqrt(np.mean(x**2)) + 1e-12)


def _filt(x: np.ndarray, kind: str, freq, order: int = 2) -> np.ndarray:
    return signal.sosfilt(signal.butter(order, freq, kind, fs=SR, output="sos"), x)


def _tone(
    freq: np.ndarray | float, n: int, harmonics: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Harmonic tone following an instantaneous frequency track (phase = running integral)."""
    track = np.broadcast_to(np.asarray(freq, dtype=float), (n,))
    phase = 2 * np.pi * np.cumsum(track) / SR
    out = np.zeros(n)
    for h, amp in enumerate(harmonics, start=1):
        alias = h * track < SR / 2 - 200
        out += amp * np.sin(h * phase + rng.uniform(0, 2 * np.pi)) * alias
    return out


def _gate(
    n: int,
    rng: np.random.Generator,
    on: tuple[float, float],
    off: tuple[float, float],
    ramp: float = 0.01,
) -> np.ndarray:
    """0/1 envelope of random on/off segments with short ramps."""
    env = np.zeros(n)
    t = int(rng.uniform(0, off[1]) * SR)
    while t < n:
        length = int(rng.uniform(*on) * SR)
        env[t : t + length] = 1.0
        t += length + int(rng.uniform(*off) * SR)
    return uniform_filter1d(env, max(int(ramp * SR), 1), mode="constant")


def _decay(n: int, tau: float) -> np.ndarray:
    return np.exp(-np.arange(n) / (tau * SR))


def _place(out: np.ndarray, event: np.ndarray, at: int) -> None:
    end = min(len(out), at + len(event))
    if at < end:
        out[at:end] += event[: end - at]


def _resonate(x: np.ndarray, freqs: list[float], q: float) -> np.ndarray:
    """Sum of band-pass resonators: crude formants / body modes."""
    return np.asarray(
        sum(_filt(x, "bandpass", [f / (1 + 0.5 / q), f * (1 + 0.5 / q)]) for f in freqs)
    )


# --------------------------------------------------------------------------- class sources
# Each source: (n samples, per-recording params rng, per-occurrence rng) -> signal.
# Params come from `p` (the recording's rng, drawn first, identical for every occurrence).


def _air_conditioner(n, p, r):
    f0, rolloff = p.uniform(45, 130), p.uniform(0.8, 2.0)
    cutoff, fan_rate, fan_depth, hum_share = (
        p.uniform(400, 2500),
        p.uniform(2, 15),
        p.uniform(0, 0.25),
        p.uniform(0.1, 0.6),
    )
    t = np.arange(n) / SR
    hum = _tone(
        f0 * (1 + 0.002 * np.sin(2 * np.pi * 0.1 * t)), n, 1 / np.arange(1, 9) ** rolloff, r
    )
    air = _filt(_noise(n, r, 0.5), "lowpass", cutoff, 4)
    x = hum_share * hum / np.std(hum) + (1 - hum_share) * air
    return x * (1 + fan_depth * np.sin(2 * np.pi * fan_rate * t))


def _car_horn(n, p, r):
    f1 = p.uniform(300, 520)
    freqs = [f1, f1 * p.choice([1.19, 1.25, 1.33])] if p.random() < 0.6 else [f1]
    harmonics = 1 / np.arange(1, p.integers(8, 20)) ** p.uniform(0.6, 1.2)
    honk_on, honk_off = (p.uniform(0.15, 0.4), p.uniform(0.5, 1.5)), (0.1, p.uniform(0.2, 1.2))
    x = sum(_tone(f * (1 + r.normal(0, 0.003)), n, harmonics, r) for f in freqs)
    x = np.tanh(1.5 * x / (np.abs(x).max() + 1e-12))
    return x * _gate(n, r, honk_on, honk_off, ramp=0.015)


def _children_playing(n, p, r):
    eng = espeak.engine()
    variants = [
        f"{a}+{v}"
        for a in ("en-us", "en", "en-gb-scotland")
        for v in ("f1", "f2", "f3", "f4", "f5", "Annie", "linda", "belinda")
    ]
    voices = [
        variants[i] for i in p.choice(len(variants), size=int(p.integers(3, 6)), replace=False)
    ]
    words = (
        "play ball catch me run here come on my turn look no yes again throw it wow hey stop tag "
        "you're it"
    ).split()
    x = np.zeros(n)
    for voice in voices:
        track, at = np.zeros(n), int(r.uniform(0, 0.8) * SR)
        while at < n:
            phrase = " ".join(r.choice(words, size=int(r.integers(2, 6)))) + r.choice(
                ["!", "?", "."]
            )
            speech = eng.synth(
                phrase,
                voice,
                rate=int(r.uniform(170, 260)),
                pitch=int(r.uniform(75, 100)),
                pitch_range=int(r.uniform(60, 100)),
                seed=int(r.integers(2**31)),
            )
            g = np.gcd(SR, eng.sample_rate)
            speech = signal.resample_poly(speech, SR // g, eng.sample_rate // g)
            _place(track, speech * 10 ** (r.uniform(-12, 0) / 20), at)
            at += len(speech) + int(r.uniform(0.1, 1.5) * SR)
        x += track
    for _ in range(int(r.poisson(n / SR * 0.3))):  # shrieks and squeals
        m = int(r.uniform(0.2, 0.6) * SR)
        sweep = np.linspace(r.uniform(900, 1400), r.uniform(1400, 2200), m)
        _place(
            x,
            0.6 * _tone(sweep, m, np.array([1, 0.4, 0.2]), r) * np.hanning(m),
            int(r.integers(0, n)),
        )
    return x


def _dog_bark(n, p, r):
    f0, formants = (
        p.uniform(350, 900),
        [p.uniform(500, 1000), p.uniform(1200, 2500), p.uniform(2600, 3800)],
    )
    length, grit = p.uniform(0.08, 0.25), p.uniform(0.1, 0.5)
    x, at = np.zeros(n), int(r.uniform(0, 0.5) * SR)
    while at < n:
        for _ in range(int(r.integers(1, 5))):  # a volley of barks
            m = int(length * r.uniform(0.8, 1.25) * SR)
            u = np.linspace(0, 1, m)
            contour = f0 * r.uniform(0.9, 1.1) * (1 + 0.35 * np.sin(np.pi * u) - 0.2 * u)
            src = _tone(contour, m, 1 / np.arange(1, 12), r) + grit * r.standard_normal(m)
            bark = _resonate(src, formants, 4.0) * np.minimum(u / 0.08, 1) * np.exp(-3 * u)
            _place(x, bark, at)
            at += m + int(r.uniform(0.08, 0.3) * SR)
        at += int(r.uniform(0.4, 2.5) * SR)
    return x


def _drilling(n, p, r):
    f_motor, brightness, band = p.uniform(150, 500), p.uniform(0.3, 0.9), p.uniform(2000, 5000)
    t = np.arange(n) / SR
    # spin up / down
    gate = _gate(n, r, (p.uniform(0.8, 2), p.uniform(2.5, 6)), (0.2, 1.0), ramp=0.25)
    freq = f_motor * (0.4 + 0.6 * gate) * (1 + 0.01 * np.sin(2 * np.pi * r.uniform(3, 9) * t))
    whine = _tone(freq, n, brightness ** np.arange(12), r)
    grind = _filt(r.standard_normal(n), "bandpass", [band * 0.7, min(band * 1.4, 7800)], 2)
    return (whine / np.std(whine) + 0.4 * grind) * (0.05 + gate)


def _engine_idling(n, p, r):
    firing, cutoff, rumble = p.uniform(20, 45), p.uniform(150, 600), p.uniform(0.2, 0.7)
    t = np.arange(n) / SR
    wobble = _filt(r.standard_normal(n), "lowpass", 1.0, 1)
    freq = firing * (1 + 0.03 * wobble / (np.std(wobble) + 1e-12))
    phase = np.cumsum(freq) / SR
    pulses = (np.diff(np.floor(phase), prepend=0) > 0).astype(float)
    body = _filt(signal.oaconvolve(pulses, _decay(int(0.02 * SR), 0.004))[:n], "lowpass", cutoff, 4)
    x = body / (np.std(body) + 1e-12) + rumble * _filt(_noise(n, r, 2.0), "lowpass", 300, 2)
    return x * (1 + 0.05 * np.sin(2 * np.pi * firing / 4 * t))


def _gun_shot(n, p, r):
    tau, boom, tail, automatic = (
        p.uniform(0.02, 0.15),
        p.uniform(60, 120),
        p.uniform(0.3, 0.8),
        p.random() < 0.2,
    )
    x, at = np.zeros(n), int(r.uniform(0.0, 0.3) * SR)
    while at < n:
        shots = int(r.integers(4, 10)) if automatic else 1
        for _ in range(shots):
            m = int(min(tail * 3, 2.0) * SR)
            crack = r.standard_normal(m) * _decay(m, tau * r.uniform(0.8, 1.2))
            low = np.sin(2 * np.pi * boom * np.arange(m) / SR) * _decay(m, tau * 2)
            reverb = 0.15 * _filt(r.standard_normal(m), "lowpass", 3000) * _decay(m, tail)
            _place(x, r.uniform(0.6, 1.0) * (crack + 0.8 * low + reverb), at)
            at += int(r.uniform(0.08, 0.12) * SR) if automatic else 0
        at += int(r.uniform(0.6, 3.0) * SR)
    return x


def _jackhammer(n, p, r):
    rate, modes, ring = (
        p.uniform(12, 25),
        [p.uniform(800, 1600), p.uniform(1800, 3200)],
        p.uniform(0.01, 0.03),
    )
    gate = _gate(n, r, (p.uniform(1, 3), p.uniform(3.5, 7)), (0.2, 1.0), ramp=0.05)
    strikes, m = np.zeros(n), int(0.01 * SR)
    for at in np.cumsum(
        SR / (rate * r.uniform(0.95, 1.05, size=int(n / SR * rate * 1.1) + 1))
    ).astype(int):
        if at < n and gate[at] > 0.5:
            _place(strikes, r.uniform(0.7, 1.0) * r.standard_normal(m) * _decay(m, 0.002), at)
    # The tool body rings after each strike: resonators with a decay of `ring` seconds.
    body = _resonate(strikes, modes, q=np.pi * modes[0] * ring)
    x = body / (np.std(body) + 1e-12) + 0.5 * strikes / (np.std(strikes) + 1e-12)
    return x + 0.05 * _filt(_noise(n, r, 1.0), "lowpass", 2000)


def _siren(n, p, r):
    lo, hi = p.uniform(500, 800), p.uniform(1200, 1800)
    mode, harmonics = p.choice(["wail", "yelp", "hilo"]), 1 / np.arange(1, p.integers(3, 7)) ** 1.5
    t = np.arange(n) / SR + r.uniform(0, 10)
    if mode == "wail":
        freq = lo + (hi - lo) * 0.5 * (1 - np.cos(2 * np.pi * t / p.uniform(3, 6)))
    elif mode == "yelp":
        freq = lo + (hi - lo) * 0.5 * (1 - np.cos(2 * np.pi * t / p.uniform(0.15, 0.4)))
    else:
        freq = np.where(np.floor(t / p.uniform(0.5, 0.7)) % 2 == 0, lo, hi)
    doppler = 1 + 0.02 * np.sin(2 * np.pi * t / 20)
    return _tone(freq * doppler, n, harmonics, r) * (
        0.6 + 0.4 * np.sin(np.pi * np.linspace(0, 1, n))
    )


def _street_music(n, p, r):
    beat, root = 60 / p.uniform(80, 140), p.uniform(110, 220)
    pluck = p.uniform(0.2, 0.8)
    chords = [[0, 4, 7], [5, 9, 12], [7, 11, 14], [-3, 0, 4]]  # I IV V vi in semitones
    scale = np.array([0, 2, 4, 7, 9, 12, 14])
    x, step = np.zeros(n), int(beat * SR)

    def note(semitone: float, m: int) -> np.ndarray:
        f = root * 2 ** (semitone / 12)
        return _tone(f, m, 0.6 ** np.arange(8), r) * _decay(m, pluck)

    for k, at in enumerate(range(int(r.integers(0, step)), n, step)):
        if k % 2 == 0:
            chord = chords[int(r.integers(len(chords)))]
            for s in chord:
                _place(x, 0.3 * note(s, 2 * step), at)
        _place(x, 0.4 * note(12 + float(r.choice(scale)), step), at)
        kick = np.sin(2 * np.pi * np.cumsum(np.linspace(120, 45, step // 2)) / SR) * _decay(
            step // 2, 0.05
        )
        _place(x, 0.8 * kick, at)
        hat = int(0.04 * SR)
        _place(
            x,
            0.2 * _filt(r.standard_normal(hat), "highpass", 6000) * _decay(hat, 0.01),
            at + step // 2,
        )
    return x


_SOURCES = [
    _air_conditioner,
    _car_horn,
    _children_playing,
    _dog_bark,
    _drilling,
    _engine_idling,
    _gun_shot,
    _jackhammer,
    _siren,
    _street_music,
]  # index = classID


# --------------------------------------------------------------------------- rendering


def _peaking(freq: float, gain_db: float, q: float) -> np.ndarray:
    """One peaking-EQ biquad as a second-order section (RBJ audio-EQ-cookbook design)."""
    a, w0 = 10 ** (gain_db / 40), 2 * np.pi * freq / SR
    alpha = np.sin(w0) / (2 * q)
    b = [1 + alpha * a, -2 * np.cos(w0), 1 - alpha * a]
    den = [1 + alpha / a, -2 * np.cos(w0), 1 - alpha / a]
    return np.array([[*(np.array(b) / den[0]), *(np.array(den) / den[0])]])


def _channel(rng: np.random.Generator) -> np.ndarray:
    """A recording's microphone and distance colouring: band limits plus two random EQ bands."""
    sections = [
        signal.butter(2, rng.uniform(20, 300), "highpass", fs=SR, output="sos"),
        signal.butter(
            2,
            float(np.exp(rng.uniform(np.log(1500), np.log(7800)))),
            "lowpass",
            fs=SR,
            output="sos",
        ),
    ]
    for _ in range(2):
        freq = float(np.exp(rng.uniform(np.log(100), np.log(6000))))
        sections.append(_peaking(freq, float(rng.uniform(-12, 12)), float(rng.uniform(0.5, 2.0))))
    return np.concatenate(sections)


def _render_recording(task: tuple) -> list[dict]:
    rec, out, seed = task
    background = numpy_rng(seed, "urban-background", rec.fs_id)
    exponent, rumble = background.uniform(0.5, 2.0), background.uniform(0.0, 0.6)
    level_db = background.uniform(-26, -14)
    channel = _channel(background)
    rows = []
    for occ, (start, duration) in enumerate(rec.occurrences):
        r = numpy_rng(seed, "urban-occurrence", rec.fs_id, occ)
        n = int(round(duration * SR))
        # A fresh parameter stream per occurrence: all occurrences of a recording share the
        # parameters.
        fg = _SOURCES[rec.class_id](n, numpy_rng(seed, "urban-source", rec.fs_id), r)
        fg = fg * 10 ** (level_db / 20) / (np.sqrt(np.mean(fg**2)) + 1e-12)
        if rec.interferer is not None:
            other = _SOURCES[rec.interferer](n, numpy_rng(seed, "urban-interferer", rec.fs_id), r)
            fg = fg + other * 10 ** ((level_db + rec.interferer_db) / 20) / (
                np.sqrt(np.mean(other**2)) + 1e-12
            )
        bg = _noise(n, r, exponent) + rumble * _filt(_noise(n, r, 2.0), "lowpass", 150)
        fg_power = np.mean(fg**2)
        x = fg + bg * np.sqrt(fg_power * 10 ** (-rec.snr_db / 10) / (np.mean(bg**2) + 1e-12))
        x = signal.sosfilt(channel, x)
        x *= 10 ** (level_db / 20) / (np.sqrt(np.mean(x**2)) + 1e-12)
        for occ_id, k, a, b in rec.slices():
            if occ_id != occ:
                continue
            piece = x[int(round((a - start) * SR)) : int(round((b - start) * SR))]
            peak = np.abs(piece).max()
            piece = piece * (0.97 / peak) if peak > 0.97 else piece
            name = f"{rec.fs_id}-{rec.class_id}-{occ}-{k}.wav"
            layout.write_wav(out / "audio" / f"fold{rec.fold}" / name, piece)
            rows.append(
                {
                    "slice_file_name": name,
                    "fsID": rec.fs_id,
                    "start": f"{a:.6f}",
                    "end": f"{b:.6f}",
                    "salience": rec.salience,
                    "fold": rec.fold,
                    "classID": rec.class_id,
                    "class": rec.name,
                }
            )
    return rows


def generate(
    out_dir: str | Path,
    recordings: int = DEFAULT_RECORDINGS,
    seed: int = 0,
    progress: bool = True,
    workers: int = 2,
) -> dict:
    """Generate (or reuse) a synthetic UrbanSound8K tree under `out_dir`; returns its stats.

    A complete generation with the same seed and recordings is returned as is (stats["cached"]
    True); an interrupted or differently-sized one is replaced; a folder holding audio/ or
    metadata/ that fedac did not write raises FileExistsError.
    """
    start = time.perf_counter()
    out = Path(out_dir)
    params = {
        "generator": "urbansound8k",
        "format_version": _FORMAT_VERSION,
        "seed": int(seed),
        "recordings": int(recordings),
    }
    if int(recordings) < len(CLASSES):  # validate before touching the disk
        raise ValueError(
            f"need at least {len(CLASSES)} recordings (one per class), got {recordings}"
        )
    cached = layout.cached_stats(out, params, ["audio", "metadata", _README])
    if cached is not None:
        return dict(cached, seconds=round(time.perf_counter() - start, 3), out_dir=str(out))
    plan = _plan(int(recordings), int(seed))
    for fold in range(1, 11):
        (out / "audio" / f"fold{fold}").mkdir(parents=True)
    (out / METADATA).parent.mkdir(parents=True)
    # Longest recordings first so the pool's workers finish together.
    tasks = sorted(plan, key=lambda rec: -sum(d for _, d in rec.occurrences))
    results = layout.run_tasks(
        _render_recording,
        [(rec, out, int(seed)) for rec in tasks],
        workers,
        "synth urbansound8k",
        progress,
    )
    rows = sorted((row for rows in results for row in rows), key=lambda row: row["slice_file_name"])
    with (out / METADATA).open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    stats = {
        "recordings": len(plan),
        "slices": len(rows),
        "slices_per_class": {name: sum(row["class"] == name for row in rows) for name in CLASSES},
        "slices_per_fold": {str(k): sum(row["fold"] == k for row in rows) for k in range(1, 11)},
    }
    (out / _README).write_text(
        "SYNTHETIC stand-in for UrbanSound8K -- not real recordings.\n"
        f"Generated by fedac.data.synth.urban.generate(), format version {_FORMAT_VERSION}.\n"
        f"seed: {seed}\nrecordings (fsIDs): {len(plan)}\nslices: {len(rows)}\n"
        "Procedural sources per class; children's voices by espeak-ng (GPL-3.0-or-later).\n"
    )
    layout.finish(out, params, stats)
    return dict(
        stats, cached=False, seconds=round(time.perf_counter() - start, 3), out_dir=str(out)
    )
