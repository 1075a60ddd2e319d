"""A tiny IEMOCAP release-1.0 tree (tones, not speech) for loader tests.

Every session has two improvised dialogs (one led by each speaker) and one scripted dialog that
the loader must ignore. Labels cycle through the 4-class labels, `exc` (merged into hap) and labels
the task leaves out (fru, xxx, oth, sur), so every branch of the parser is exercised.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf

RATE = 16000
LABELS = ("neu", "hap", "exc", "sad", "ang", "fru", "xxx", "neu", "oth", "ang", "sad", "sur")
HEADER = "% [START_TIME - END_TIME] TURN_NAME EMOTION [V, A, D]\n\n"


def dialogs(session: int) -> list[str]:
    return [
        f"Ses{session:02d}F_impro01",
        f"Ses{session:02d}M_impro02",
        f"Ses{session:02d}F_script01_1",
    ]


def _block(start: float, utt: str, label: str) -> str:
    return (
        f"[{start:.4f} - {start + 1.5:.4f}]\t{utt}\t{label}\t[2.5000, 3.0000, 2.5000]\n"
        f"C-E1:\tNeutral;\t()\nC-E2:\tNeutral;\t()\n"
        f"A-E1:\tval 3; act 2; dom  2;\t()\n\n"
    )


def make_iemocap_tree(root: Path, per_dialog: int = 12, seed: int = 0) -> Path:
    """Sessions 1-5; each dialog alternates F and M turns with labels from LABELS."""
    rng = np.random.default_rng(seed)
    root = Path(root)
    for session in range(1, 6):
        base = root / f"Session{session}"
        (base / "dialog" / "EmoEvaluation" / "Categorical").mkdir(parents=True, exist_ok=True)
        for dialog in dialogs(session):
            wav_dir = base / "sentences" / "wav" / dialog
            wav_dir.mkdir(parents=True, exist_ok=True)
            text = HEADER
            for k in range(per_dialog):
                utt = f"{dialog}_{'FM'[k % 2]}{k // 2:03d}"
                text += _block(2.0 * k, utt, LABELS[k % len(LABELS)])
                tone = 0.2 * np.sin(2 * np.pi * (200 + 20 * k) * np.arange(RATE // 5) / RATE)
                sf.write(
                    wav_dir / f"{utt}.wav",
                    (tone + 0.01 * rng.standard_normal(tone.size)).astype(np.float32),
                    RATE,
                )
            (base / "dialog" / "EmoEvaluation" / f"{dialog}.txt").write_text(text)
    return root
