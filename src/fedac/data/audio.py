"""Audio I/O: any readable file -> mono float32 at the target rate, or a clear AudioError.

soundfile decodes, scipy resamples (polyphase, exact for integer rate ratios); stereo is averaged to
mono. Nothing is dropped silently: a file that cannot be read raises AudioError naming it.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import soundfile as sf
from scipy.signal import resample_poly

from fedac.errors import AudioError


def load_audio(
    path: str | Path,
    sample_rate: int = 16000,
    offset: float = 0.0,
    duration: float | None = None,
) -> np.ndarray:
    """Read `duration` seconds from `offset` of `path` as mono float32 at `sample_rate`."""
    path = Path(path)
    if path.is_symlink() and not path.exists():
        raise AudioError(f"audio file {path} is a broken link or a symlink loop; remove it or point it at the audio file")
    if not path.is_file():
        raise AudioError(f"audio file {path} does not exist; restore it or remove the metadata line that lists it")
    try:
        with sf.SoundFile(str(path)) as handle:
            native_rate = handle.samplerate
            start = int(round(offset * native_rate))
            frames = -1 if duration is None else int(round(duration * native_rate))
            if start:
                handle.seek(min(start, handle.frames))
            data = handle.read(frames, dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, ValueError) as exc:
        raise AudioError(f"cannot decode audio file {path}: {exc}. Replace it with a good copy (re-download), or delete it and any metadata line that lists it.") from None
    if data.shape[0] == 0:
        raise AudioError(f"audio file {path} holds no samples (offset {offset} s); replace it with a good copy, "
                         "or delete it and any metadata line that lists it")
    mono = data.mean(axis=1) if data.shape[1] > 1 else data[:, 0]
    if native_rate != sample_rate:
        ratio = Fraction(sample_rate, native_rate).limit_denominator(1000)
        mono = resample_poly(mono, ratio.numerator, ratio.denominator).astype(np.float32)
    if not np.isfinite(mono).all():
        raise AudioError(f"audio file {path} contains NaN or Inf samples; replace it with a good copy, "
                         "or delete it and any metadata line that lists it")
    return np.ascontiguousarray(mono, dtype=np.float32)


def fit_length(audio: np.ndarray, length: int) -> list[np.ndarray]:
    """Split audio into model-input windows of `length` samples.

    Shorter audio is zero-padded to one window. Longer audio becomes ceil(len / length) windows with
    equal hop, the last one ending at the end of the file, so every sample is seen and no window is
    mostly padding. Evaluation averages the logits of a clip's windows (see engine.evaluate).
    """
    if len(audio) <= length:
        return [np.pad(audio, (0, length - len(audio)))]
    count = -(-len(audio) // length)
    starts = np.linspace(0, len(audio) - length, count).round().astype(int)
    return [audio[s : s + length] for s in starts]
