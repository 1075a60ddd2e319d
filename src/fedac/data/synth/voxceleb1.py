"""Synthetic VoxCeleb1, rendered offline with espeak-ng (sentences.py), in the official layout::

    <out>/wav/idNNNNN/<video>/NNNNN.wav     16 kHz mono, one read sentence (2-4 s) each
    <out>/iden_split.txt                    "<1|2|3> idNNNNN/<video>/NNNNN.wav" (train / val / test)
    <out>/veri_test2.txt                    "<1|0> <path a> <path b>" verification trials
    <out>/SYNTHETIC.txt   <out>/.fedac_complete (JSON marker, written last)

`speakers` identification speakers, and `trial_speakers` more whose clips only the trial list uses,
so verification speakers are disjoint from SID training speakers (the real list's speakers are also
in the identification split). A speaker's utterances spread over 3 "videos", each with its own room
and noise floor (a recording session); about 10% of each speaker's utterances go to validation and
10% to test. Trials: half target (two clips of one trial speaker), half non-target.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from fedac.data import layout
from fedac.data.synth import espeak
from fedac.data.synth.sentences import render, sentence, talkers
from fedac.data.synth.speech_commands import _random_room

_FORMAT_VERSION = 1
_OWNED = ("wav", "iden_split.txt", "veri_test2.txt", "SYNTHETIC.txt")
_VIDEOS = 3


def _video_id(rng: np.random.Generator) -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"
    return "".join(alphabet[i] for i in rng.integers(len(alphabet), size=11))


def _render_speaker(task: tuple) -> list[str]:
    """Write one speaker's clips; returns their paths relative to wav/."""
    talker, speaker, utterances, out, seed = task
    espeak.engine().reset()
    rng = np.random.default_rng([seed, 2, talker.index])
    sessions = [
        (
            _video_id(rng),
            replace(talker, room=_random_room(rng), noise_db=talker.noise_db + rng.normal(0, 4)),
        )
        for _ in range(_VIDEOS)
    ]
    paths = []
    for u in range(utterances):
        video, session = sessions[u % _VIDEOS]
        relative = f"{speaker}/{video}/{u // _VIDEOS + 1:05d}.wav"
        (out / "wav" / speaker / video).mkdir(parents=True, exist_ok=True)
        layout.write_wav(out / "wav" / relative, render(sentence(rng), session, rng))
        paths.append(relative)
    return paths


def generate(
    out_dir: str | Path,
    speakers: int = 200,
    seed: int = 0,
    utterances: int = 24,
    trial_speakers: int = 40,
    trials: int = 4000,
    workers: int = 2,
    progress: bool = True,
) -> dict:
    """Write (or reuse) the stand-in (see the module docstring)."""
    t0 = time.perf_counter()
    out = Path(out_dir)
    if speakers < 2 or trial_speakers < 2 or utterances < 3 or trials < 2:
        raise ValueError(
            "need at least 2 speakers, 2 trial speakers, 3 utterances per speaker and 2 trials"
        )
    params = {
        "format_version": _FORMAT_VERSION,
        "seed": int(seed),
        "speakers": int(speakers),
        "utterances": int(utterances),
        "trial_speakers": int(trial_speakers),
        "trials": int(trials),
    }
    done = layout.cached_stats(out, params, _OWNED)
    if done is not None:
        return dict(done, seconds=time.perf_counter() - t0, out_dir=str(out))
    rng = np.random.default_rng([seed, 1])
    everyone = talkers(rng, speakers + trial_speakers)
    names = [f"id{10001 + i:05d}" for i in range(speakers + trial_speakers)]
    tasks = [(t, name, utterances, out, int(seed)) for t, name in zip(everyone, names)]
    rendered = layout.run_tasks(_render_speaker, tasks, int(workers), "synth voxceleb1", progress)
    lines = []
    for paths in rendered[:speakers]:
        codes = np.ones(len(paths), dtype=int)
        held = rng.permutation(len(paths))
        n = max(1, round(0.1 * len(paths)))
        codes[held[:n]], codes[held[n : 2 * n]] = 2, 3
        lines += [f"{code} {path}\n" for code, path in zip(codes, paths)]
    (out / "iden_split.txt").write_text("".join(lines))
    pool = rendered[speakers:]
    trial_lines = []
    for k in range(trials):
        a_spk = int(rng.integers(len(pool)))
        if k % 2 == 0:  # target: two different clips of one speaker
            i, j = rng.choice(len(pool[a_spk]), 2, replace=False)
            pair, target = (pool[a_spk][i], pool[a_spk][j]), 1
        else:
            b_spk = (a_spk + 1 + int(rng.integers(len(pool) - 1))) % len(pool)
            pair, target = (
                (
                    pool[a_spk][rng.integers(len(pool[a_spk]))],
                    pool[b_spk][rng.integers(len(pool[b_spk]))],
                ),
                0,
            )
        trial_lines.append(f"{target} {pair[0]} {pair[1]}\n")
    (out / "veri_test2.txt").write_text("".join(trial_lines))
    stats = {
        "sid_speakers": speakers,
        "trial_speakers": trial_speakers,
        "clips": (speakers + trial_speakers) * utterances,
        "trials": trials,
    }
    (out / "SYNTHETIC.txt").write_text(
        f"Synthetic VoxCeleb1 written by fedac (seed {seed}) with espeak-ng: {stats}.\n"
    )
    layout.finish(out, params, stats)
    return dict(stats, cached=False, seconds=time.perf_counter() - t0, out_dir=str(out))
