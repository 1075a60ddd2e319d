"""Synthetic LibriSpeech, rendered offline with espeak-ng (sentences.py), in the official layout::

    <out>/train-clean-100/<spk>/<chapter>/<spk>-<chapter>-<utt>.flac   + <spk>-<chapter>.trans.txt
    <out>/dev-clean/...  <out>/test-clean/...  <out>/test-other/...
    <out>/SYNTHETIC.txt   <out>/.fedac_complete (JSON marker, written last)

Every split has its own speakers (train, dev and both test sets are speaker-disjoint, as in
LibriSpeech). test-other is harder than test-clean: unseen speakers whose speech is 30-45% faster,
with noise at 10-20 dB SNR and strong reverberation (`sentences.harder`). Transcripts are upper case
without punctuation. Everything derives from `seed`; workers do not change the output.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import soundfile as sf

from fedac.data import layout
from fedac.data.synth import espeak
from fedac.data.synth.sentences import SAMPLE_RATE, Talker, harder, render, sentence, talkers

_FORMAT_VERSION = 1
SUBSETS = ("train-clean-100", "dev-clean", "test-clean", "test-other")
_README = "SYNTHETIC.txt"
_CHAPTERS = 2


def _render_speaker(task: tuple) -> tuple[str, int]:
    subset, talker, utterances, out, seed = task
    espeak.engine().reset()  # once per task: the audio depends only on the task
    rng = np.random.default_rng([seed, 2, SUBSETS.index(subset), talker.index])
    if subset == "test-other":
        talker = harder(talker, rng)
    speaker = str(1000 + talker.index)
    for c in range(_CHAPTERS):
        chapter = str(100 * (talker.index + 1) + c)
        folder = out / subset / speaker / chapter
        folder.mkdir(parents=True)
        lines = []
        for u in range(c, utterances, _CHAPTERS):
            utt = f"{speaker}-{chapter}-{u:04d}"
            text = sentence(rng)
            sf.write(
                str(folder / f"{utt}.flac"),
                render(text, talker, rng),
                SAMPLE_RATE,
                format="FLAC",
                subtype="PCM_16",
            )
            lines.append(f"{utt} {text}\n")
        (folder / f"{speaker}-{chapter}.trans.txt").write_text("".join(lines))
    return subset, utterances


def generate(
    out_dir: str | Path,
    speakers: int = 100,
    seed: int = 0,
    utterances: int = 30,
    eval_speakers: int = 10,
    eval_utterances: int = 10,
    workers: int = 2,
    progress: bool = True,
) -> dict:
    """Write (or reuse) the stand-in: `speakers` training speakers x `utterances` sentences, and
    `eval_speakers` x `eval_utterances` for each of dev-clean, test-clean and test-other."""
    t0 = time.perf_counter()
    out = Path(out_dir)
    if min(speakers, utterances, eval_speakers, eval_utterances) < 1:
        raise ValueError(
            "speakers, utterances, eval_speakers and eval_utterances must be at least 1"
        )
    params = {
        "format_version": _FORMAT_VERSION,
        "seed": int(seed),
        "speakers": int(speakers),
        "utterances": int(utterances),
        "eval_speakers": int(eval_speakers),
        "eval_utterances": int(eval_utterances),
    }
    done = layout.cached_stats(out, params, (*SUBSETS, _README))
    if done is not None:
        return dict(done, seconds=time.perf_counter() - t0, out_dir=str(out))
    counts = {
        "train-clean-100": speakers,
        "dev-clean": eval_speakers,
        "test-clean": eval_speakers,
        "test-other": eval_speakers,
    }
    everyone: list[Talker] = talkers(np.random.default_rng([seed, 1]), sum(counts.values()))
    tasks, start = [], 0
    for subset in SUBSETS:
        n_utt = utterances if subset.startswith("train") else eval_utterances
        tasks += [
            (subset, t, n_utt, out, int(seed)) for t in everyone[start : start + counts[subset]]
        ]
        start += counts[subset]
    clips = dict.fromkeys(SUBSETS, 0)
    for subset, n in layout.run_tasks(
        _render_speaker, tasks, int(workers), "synth librispeech", progress
    ):
        clips[subset] += n
    stats = {"speakers_per_subset": counts, "utterances_per_subset": clips}
    (out / _README).write_text(
        f"Synthetic LibriSpeech written by fedac (seed {seed}): espeak-ng read sentences in the "
        f"official layout.\nSpeakers per subset {counts}; utterances {clips}. test-other: faster "
        "speech, 10-20 dB noise, reverb.\n"
    )
    layout.finish(out, params, stats)
    return dict(stats, cached=False, seconds=time.perf_counter() - t0, out_dir=str(out))
