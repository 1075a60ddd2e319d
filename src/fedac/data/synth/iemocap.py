"""Synthetic acted dialogs in the IEMOCAP release-1.0 layout, rendered offline with espeak-ng.

:func:`generate` writes what `fedac.data.iemocap` reads::

    <out>/Session<n>/sentences/wav/<dialog>/<utterance>.wav     16 kHz mono int16, about 1-4 s
    <out>/Session<n>/dialog/EmoEvaluation/<dialog>.txt           summary + annotator lines per turn
    <out>/SYNTHETIC.txt                                          provenance
    <out>/.fedac_complete                                        JSON marker, written last

As in IEMOCAP, each of the 5 sessions has one female and one male actor (10 speakers). Each
improvised scenario is recorded twice, once led by each actor (``Ses01F_impro03`` and
``Ses01M_impro03``), and both actors speak in every dialog, taking turns (utterance ids
``<dialog>_F000``, ``<dialog>_M000``, ...). A scripted dialog per session (``Ses01F_script01_1``)
is written too; the improvised-only task must leave it out.

Labels follow IEMOCAP's categories: the 4-class task's neu, hap, exc (merged into hap), sad and ang,
plus fru, sur, oth and xxx (no agreement), which it drops. A scenario has a theme emotion that most
of its turns share, so labels are correlated within a dialog and unevenly spread over speakers, as
in the real corpus. Emotions are acted with the prosody and voice-quality model of the CREMA-D
stand-in (`synth.emotions.perform`); exc is an intense hap, fru is acted with the disgust prosody,
sur with the fear prosody, and xxx turns are weakly acted with a random emotion (annotators
disagreed).

Deterministic: every random draw derives from (seed, purpose, dialog[, turn]), so the files do not
depend on the number of workers.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedac.data import layout
from fedac.data.synth import emotions
from fedac.seeding import numpy_rng

__all__ = ["DEFAULT_SCENARIOS", "LABELS", "generate", "plan_dialogs"]

DEFAULT_SCENARIOS = 8  # per session; each recorded twice (F- and M-led): 16 improvised dialogs
DEFAULT_TURNS = 36  # turns per improvised dialog
SESSIONS = 5
_FORMAT_VERSION = 1
_README = "SYNTHETIC.txt"
_OWNED = [f"Session{s}" for s in range(1, SESSIONS + 1)] + [_README]

#: IEMOCAP label -> (prosody of the CREMA-D stand-in, intensity factor); xxx draws its own.
ACTING = {
    "neu": ("NEU", 1.0),
    "hap": ("HAP", 1.0),
    "exc": ("HAP", 1.5),
    "sad": ("SAD", 1.0),
    "ang": ("ANG", 1.0),
    "fru": ("DIS", 1.2),
    "sur": ("FEA", 1.0),
    "oth": ("NEU", 1.0),
}
#: Base rates of a turn's label outside its scenario's theme (close to IEMOCAP's improvised
#: sessions).
BASE_RATES = {
    "neu": 0.33,
    "hap": 0.08,
    "exc": 0.11,
    "sad": 0.11,
    "ang": 0.05,
    "fru": 0.14,
    "sur": 0.03,
    "oth": 0.02,
    "xxx": 0.13,
}
LABELS = tuple(BASE_RATES)
THEMES = ("neu", "hap", "sad", "ang", "exc", "fru")
THEME_SHARE = 0.5  # probability that a turn carries its scenario's theme
VAD = {
    "neu": (2.5, 2.5, 2.5),
    "hap": (4.0, 3.0, 3.0),
    "exc": (4.0, 4.0, 3.5),
    "sad": (1.5, 2.0, 2.0),
    "ang": (1.5, 4.0, 4.0),
    "fru": (2.0, 3.5, 3.0),
    "sur": (3.5, 4.0, 2.5),
    "oth": (2.5, 2.5, 2.5),
    "xxx": (2.5, 3.0, 3.0),
}
LINES = (
    "I can't believe you did that",
    "Where were you last night",
    "We have to talk about the apartment",
    "I got the job, they called this morning",
    "You never listen to me",
    "It doesn't matter anymore",
    "My flight was cancelled again",
    "They said it would take another three weeks",
    "Do you remember the summer at the lake",
    "I'm not sure what to tell you",
    "That's the best news I've heard all year",
    "He's gone, he left this morning",
    "Why would you say something like that",
    "I've been waiting in this line for an hour",
    "Let's just go home",
    "Are you serious right now",
    "I miss the way things used to be",
    "We're getting married in the spring",
    "Nobody told me anything about it",
    "Can you please just tell me the truth",
    "I don't know what I'm going to do",
    "This is exactly what I wanted",
    "You could have called me",
    "It's fine, really, I'm fine",
    "I'm so proud of you",
    "The form says I need another signature",
    "We should celebrate tonight",
    "I lost my wallet on the train",
    "Just give me a minute",
    "It was the worst day of my life",
    "I'll be there as soon as I can",
    "Please don't go",
)


@dataclass(frozen=True)
class Turn:
    utterance: str
    speaker: str  # "F" or "M"
    label: str
    line: str


@dataclass(frozen=True)
class Dialog:
    session: int
    name: str
    turns: tuple[Turn, ...]


def _dialog(seed: int, session: int, name: str, theme: str | None, turns: int) -> Dialog:
    """Turns of one dialog: mostly alternating speakers; labels from the theme or the base rates."""
    rng = numpy_rng(seed, "iemocap-dialog", name)
    rates = np.array(list(BASE_RATES.values()))
    speaker, counts, out = name[5], {"F": 0, "M": 0}, []
    for _ in range(turns):
        if theme is not None and rng.random() < THEME_SHARE:
            label = theme
        else:
            label = LABELS[rng.choice(len(LABELS), p=rates / rates.sum())]
        out.append(
            Turn(
                f"{name}_{speaker}{counts[speaker]:03d}",
                speaker,
                label,
                LINES[rng.integers(len(LINES))],
            )
        )
        counts[speaker] += 1
        if rng.random() < 0.8:
            speaker = "M" if speaker == "F" else "F"
    return Dialog(session, name, tuple(out))


def plan_dialogs(scenarios: int, seed: int, turns: int = DEFAULT_TURNS) -> list[Dialog]:
    """Every dialog of the corpus: per session, `scenarios` improvised scenarios (themes cycling
    through THEMES in a seeded order) x both leads, plus one short scripted dialog."""
    dialogs = []
    for session in range(1, SESSIONS + 1):
        order = numpy_rng(seed, "iemocap-themes", session).permutation(len(THEMES))
        for k in range(scenarios):
            theme = THEMES[order[k % len(THEMES)]]
            for lead in "FM":
                dialogs.append(
                    _dialog(seed, session, f"Ses{session:02d}{lead}_impro{k + 1:02d}", theme, turns)
                )
        dialogs.append(_dialog(seed, session, f"Ses{session:02d}F_script01_1", None, 4))
    return dialogs


def _actors(seed: int) -> dict[tuple[int, str], emotions._Actor]:
    """One female (higher pitch) and one male (lower pitch) actor per session."""
    planned = emotions.plan_actors(2 * SESSIONS, seed, purpose="iemocap-actors")
    actors = {}
    for i, actor in enumerate(planned):
        session, gender = i // 2 + 1, "FM"[i % 2]
        low, high = (55, 85) if gender == "F" else (15, 45)
        actors[session, gender] = dataclasses.replace(
            actor, pitch=low + (high - low) * (actor.pitch - 25) / 50
        )
    return actors


def _summary(start: float, end: float, turn: Turn) -> str:
    v, a, d = VAD[turn.label]
    return (
        f"[{start:.4f} - {end:.4f}]\t{turn.utterance}\t{turn.label}\t[{v:.4f}, {a:.4f}, {d:.4f}]\n"
        f"C-E1:\t{turn.label.capitalize()};\t()\nC-E2:\t{turn.label.capitalize()};\t()\n"
        f"A-E1:\tval {round(v)}; act {round(a)}; dom  {round(d)};\t()\n\n"
    )


def _render_dialog(task: tuple) -> int:
    dialog, actors, out, seed = task
    base = out / f"Session{dialog.session}"
    wav_dir = base / "sentences" / "wav" / dialog.name
    wav_dir.mkdir(parents=True, exist_ok=True)
    text, clock = "% [START_TIME - END_TIME] TURN_NAME EMOTION [V, A, D]\n\n", 1.0
    for turn in dialog.turns:
        rng = numpy_rng(seed, "iemocap-turn", turn.utterance)
        actor = actors[dialog.session, turn.speaker]
        if turn.label == "xxx":
            emotion, factor = emotions.EMOTIONS[rng.integers(len(emotions.EMOTIONS))], 0.4
        else:
            emotion, factor = ACTING[turn.label]
        s = factor * actor.expressiveness * float(np.exp(rng.normal(0, 0.35)))
        if rng.random() < 0.12:  # a flat delivery
            s *= 0.25
        x = emotions.perform(
            actor, turn.line + ("!" if turn.label in ("ang", "exc") else "."), emotion, s, rng
        )
        layout.write_wav(wav_dir / f"{turn.utterance}.wav", x)
        duration = len(x) / layout.SAMPLE_RATE
        text += _summary(clock, clock + duration, turn)
        clock += duration + float(rng.uniform(0.2, 1.5))
    (base / "dialog" / "EmoEvaluation" / f"{dialog.name}.txt").write_text(text)
    return len(dialog.turns)


def generate(
    out_dir: str | Path,
    scenarios: int = DEFAULT_SCENARIOS,
    seed: int = 0,
    progress: bool = True,
    workers: int = 2,
    turns: int = DEFAULT_TURNS,
) -> dict:
    """Generate (or reuse) a synthetic IEMOCAP tree under `out_dir`; returns its stats.

    A complete generation with the same seed and size is returned as is (stats["cached"] True); an
    interrupted or differently-sized one is replaced; Session folders that fedac did not write raise
    FileExistsError.
    """
    start = time.perf_counter()
    out = Path(out_dir)
    params = {
        "generator": "iemocap",
        "format_version": _FORMAT_VERSION,
        "seed": int(seed),
        "scenarios": int(scenarios),
        "turns": int(turns),
    }
    if int(scenarios) < 1 or int(turns) < 2:  # validate before touching the disk
        raise ValueError(
            f"need at least one scenario per session and two turns per dialog, got {scenarios} and "
            f"{turns}"
        )
    cached = layout.cached_stats(out, params, _OWNED)
    if cached is not None:
        return dict(cached, seconds=round(time.perf_counter() - start, 3), out_dir=str(out))
    dialogs = plan_dialogs(int(scenarios), int(seed), int(turns))
    for session in range(1, SESSIONS + 1):
        (out / f"Session{session}" / "dialog" / "EmoEvaluation" / "Categorical").mkdir(parents=True)
    actors = _actors(int(seed))
    counts = layout.run_tasks(
        _render_dialog,
        [(d, actors, out, int(seed)) for d in dialogs],
        workers,
        "synth iemocap",
        progress,
    )
    improvised = [t for d in dialogs if "impro" in d.name for t in d.turns]
    stats = {
        "dialogs": len(dialogs),
        "files": int(sum(counts)),
        "kept_files": sum(t.label in ("neu", "hap", "exc", "sad", "ang") for t in improvised),
    }
    (out / _README).write_text(
        "SYNTHETIC stand-in for IEMOCAP -- not real speech, no motion capture, audio only.\n"
        "Generated by fedac.data.synth.iemocap.generate() with espeak-ng, format version "
        f"{_FORMAT_VERSION}.\nseed: {seed}\nscenarios per session: {scenarios} (each led once by "
        f"each actor)\nfiles: {stats['files']}\nespeak-ng is GPL-3.0-or-later; the audio contains "
        "no third-party recordings.\n"
    )
    layout.finish(out, params, stats)
    return dict(
        stats, cached=False, seconds=round(time.perf_counter() - start, 3), out_dir=str(out)
    )
