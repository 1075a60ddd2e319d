"""Audio I/O: any readable file -> mono float32 at the target rate, or a clear AudioError.

soundfile decodes, scipy resamples (polyphase, exact for integer rate ratios); stereo is averaged to
mono. Nothing is dropped silently: a file that cannot be read raises AudioError naming it. That
includes a WAV file cut short (an interrupted download or copy): libsndfile clips the data chunk to
the bytes present and decodes the rest without a word, so its header is read here and a data chunk
that promises more frames than the file holds is an error too.
"""

from __future__ import annotations

import struct
from fractions import Fraction
from pathlib import Path

import numpy as np
import soundfile as sf
from scipy.signal import resample_poly

from fedac.errors import AudioError

#: What every decode error ends with: how to fix the file.
REMEDY = (
    "replace it with a good copy (re-download), or delete it and any metadata line that lists it"
)
#: libsndfile's names of the RIFF family, whose data chunk size `wav_frame_counts` reads.
_RIFF_FORMATS = ("WAV", "WAVEX", "RF64")
# a streaming writer's "until the end of the file" (and RF64's "see ds64")
_UNKNOWN_SIZE = 0xFFFFFFFF


def wav_frame_counts(path: str | Path) -> tuple[int, int] | None:
    """(frames the data chunk's header promises, whole frames the file holds) of a RIFF/RIFX/RF64
    WAV file, counted in blocks (nBlockAlign bytes: one frame of PCM or float); None when the header
    gives no size to check (no data chunk found, a streaming size, not a RIFF file)."""
    with open(path, "rb") as handle:
        head = handle.read(12)
        if len(head) < 12 or head[8:12] != b"WAVE" or head[:4] not in (b"RIFF", b"RIFX", b"RF64"):
            return None
        endian = ">" if head[:4] == b"RIFX" else "<"
        size_of_file = handle.seek(0, 2)
        position, block, ds64_data = 12, 0, None
        while position + 8 <= size_of_file:
            handle.seek(position)
            chunk, size = struct.unpack(endian + "4sI", handle.read(8))
            body = handle.read(min(size, 16))
            # RF64: the 64-bit sizes (riff, data, sample count)
            if chunk == b"ds64" and len(body) == 16:
                ds64_data = struct.unpack("<Q", body[8:16])[0]
            elif chunk == b"fmt " and len(body) >= 14:
                block = struct.unpack(endian + "H", body[12:14])[0]
            elif chunk == b"data":
                if size == _UNKNOWN_SIZE:
                    if ds64_data is None:
                        return None
                    size = ds64_data
                block = block or 1
                return size // block, (size_of_file - position - 8) // block
            position += 8 + size + (size & 1)  # chunks are padded to an even length
    return None


def load_audio(
    path: str | Path,
    sample_rate: int | None = 16000,
    offset: float = 0.0,
    duration: float | None = None,
) -> np.ndarray:
    """Read `duration` seconds from `offset` of `path` as mono float32 at `sample_rate` (None: the
    file's)."""
    path = Path(path)
    if path.is_symlink() and not path.exists():
        raise AudioError(
            f"audio file {path} is a broken link or a symlink loop; remove it or point it at the "
            "audio file"
        )
    if not path.is_file():
        raise AudioError(
            f"audio file {path} does not exist; restore it or remove the metadata line that lists "
            "it"
        )
    try:
        with sf.SoundFile(str(path)) as handle:
            native_rate = handle.samplerate
            start = int(round(offset * native_rate))
            frames = -1 if duration is None else int(round(duration * native_rate))
            if start:
                handle.seek(min(start, handle.frames))
            data = handle.read(frames, dtype="float32", always_2d=True)
            riff = handle.format in _RIFF_FORMATS
    except (sf.LibsndfileError, RuntimeError, ValueError) as exc:
        # libsndfile's own text may end in a full stop; ours follows after a semicolon either way
        reason = str(exc).strip().rstrip(".") or type(exc).__name__
        raise AudioError(f"cannot decode audio file {path}: {reason}; {REMEDY}") from None
    sizes = wav_frame_counts(path) if riff else None
    if sizes is not None and sizes[1] < sizes[0]:
        raise AudioError(
            f"audio file {path} is truncated: its header promises {sizes[0]} frames but the file "
            f"holds {sizes[1]}; {REMEDY}"
        )
    if data.shape[0] == 0:
        raise AudioError(f"audio file {path} holds no samples (offset {offset} s); {REMEDY}")
    mono = data.mean(axis=1) if data.shape[1] > 1 else data[:, 0]
    if sample_rate and native_rate != sample_rate:
        ratio = Fraction(sample_rate, native_rate).limit_denominator(1000)
        mono = resample_poly(mono, ratio.numerator, ratio.denominator).astype(np.float32)
    if not np.isfinite(mono).all():
        raise AudioError(f"audio file {path} contains NaN or Inf samples; {REMEDY}")
    return np.ascontiguousarray(mono, dtype=np.float32)


def fit_length(audio: np.ndarray, length: int) -> list[np.ndarray]:
    """Split audio into model-input windows of `length` samples.

    Shorter audio is zero-padded to one window. Longer audio becomes ceil(len / length) windows with
    equal hop, the last one ending at the end of the file, so every sample is seen and no window is
    mostly padding. Evaluation averages the logits of a clip's windows (see training.evaluate).
    """
    if len(audio) <= length:
        return [np.pad(audio, (0, length - len(audio)))]
    count = -(-len(audio) // length)
    starts = np.linspace(0, len(audio) - length, count).round().astype(int)
    return [audio[s : s + length] for s in starts]
