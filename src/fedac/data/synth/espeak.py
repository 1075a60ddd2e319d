"""Minimal ctypes binding to the espeak-ng shared library bundled by ``espeakng-loader``.

Only the calls needed to render short utterances into memory are wrapped: espeak-ng is
initialised in synchronous mode with a synth callback, so ``espeak_Synth`` returns only after
the whole text was rendered and every sample was handed to the callback.

espeak-ng keeps global state (current voice, parameters, callback and the waveform
generator's phase/flutter/noise state), so there is exactly one engine per process
(:func:`engine`); a lock serialises calls from threads and each worker process of a
multiprocessing pool gets its own engine.

The generator state carries over from one utterance to the next, so by default
:meth:`Espeak.synth` first reloads the library (:meth:`Espeak.reset`, ~5 ms): the samples then
depend only on the call's arguments, never on what the process rendered before, which is what
makes datasets built from it reproducible. Bulk generators can instead reset once per batch
(e.g. per speaker) and pass ``fresh=False``: the batch is then reproducible as a whole and
each utterance costs well under a millisecond. The engine loads a private copy of the library
so that reloading neither disturbs nor is defeated by other code in the process using
espeak-ng (phonemizers load the same wheel).
"""

from __future__ import annotations

import _ctypes
import ctypes
import ctypes.util
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "EspeakError",
    "Espeak",
    "engine",
    "data_path",
    "english_voices",
    "voice_variants",
]

# Constants from espeak-ng's speak_lib.h.
_AUDIO_OUTPUT_SYNCHRONOUS = 2  # render in the calling thread, deliver samples to the callback
_INITIALIZE_DONT_EXIT = 0x8000  # report errors instead of calling exit()
_CHARS_UTF8 = 1
_POS_CHARACTER = 1
_EE_OK = 0

_PARAM_RATE = 1  # words per minute, 80..450
_PARAM_VOLUME = 2  # 0..200, 100 = normal
_PARAM_PITCH = 3  # 0..100, 50 = the voice's own base pitch
_PARAM_RANGE = 4  # 0..100, intonation range

# Variants that are effects rather than plausible talkers, or whose names contain spaces.
_NOVELTY_VARIANTS = frozenset({"Demonic", "UniRobot", "anikaRobot", "Mr serious", "Tweaky"})

# int callback(short *wav, int numsamples, espeak_EVENT *events); non-zero aborts synthesis.
_SYNTH_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p
)

# (name, restype, argtypes) of every C function used; all are looked up when the library loads.
_FUNCTIONS: tuple[tuple[str, Any, list[Any]], ...] = (
    (
        "espeak_Initialize",
        ctypes.c_int,
        [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int],  # output, buflen, path, opts
    ),
    ("espeak_Terminate", ctypes.c_int, []),
    ("espeak_SetSynthCallback", None, [_SYNTH_CALLBACK]),
    ("espeak_SetVoiceByName", ctypes.c_int, [ctypes.c_char_p]),
    ("espeak_SetParameter", ctypes.c_int, [ctypes.c_int, ctypes.c_int, ctypes.c_int]),
    (
        "espeak_Synth",
        ctypes.c_int,
        [
            ctypes.c_void_p,  # text
            ctypes.c_size_t,  # size in bytes, including the terminating NUL
            ctypes.c_uint,  # position
            ctypes.c_int,  # position_type
            ctypes.c_uint,  # end_position
            ctypes.c_uint,  # flags
            ctypes.POINTER(ctypes.c_uint),  # unique_identifier
            ctypes.c_void_p,  # user_data
        ],
    ),
    ("espeak_Synchronize", ctypes.c_int, []),
    ("espeak_ng_SetRandSeed", None, [ctypes.c_long]),
)


class EspeakError(RuntimeError):
    """The espeak-ng library or its data could not be loaded, or a call into it failed."""


def _loader():
    try:
        import espeakng_loader
    except ImportError as exc:
        raise EspeakError(
            "espeakng-loader is not installed; `pip install espeakng-loader` provides espeak-ng"
        ) from exc
    return espeakng_loader


def data_path() -> Path:
    """Directory of the ``espeak-ng-data`` tree shipped inside the ``espeakng-loader`` wheel."""
    try:
        return Path(_loader().get_data_path())
    except RuntimeError as exc:
        raise EspeakError(f"espeak-ng data directory missing: {exc}") from exc


def english_voices() -> list[str]:
    """Names of the English accents in the bundled data, usable with ``espeak_SetVoiceByName``.

    These are the lower-cased file names under ``lang/gmw/en*`` (``en`` is British English,
    ``en-us``, ``en-gb-x-rp``, ...). The Shavian voice is left out: it expects text written in
    the Shavian alphabet.
    """
    folder = data_path() / "lang" / "gmw"
    voices = sorted(p.name.lower() for p in folder.glob("en*") if p.name.lower() != "en-shaw")
    if not voices:
        raise EspeakError(f"no English voices found under {folder}")
    return voices


def voice_variants() -> list[str]:
    """Names of the voice variants in ``voices/!v``, usable as ``<accent>+<variant>``."""
    folder = data_path() / "voices" / "!v"
    variants = sorted(
        p.name for p in folder.iterdir() if p.is_file() and p.name not in _NOVELTY_VARIANTS
    )
    if not variants:
        raise EspeakError(f"no voice variants found under {folder}")
    return variants


def _dlclose(handle: int) -> None:
    close = getattr(_ctypes, "dlclose", None) or getattr(_ctypes, "FreeLibrary", None)
    if close is None:  # pragma: no cover - every CPython build has one of the two
        raise EspeakError("cannot unload shared libraries on this platform")
    close(handle)


class Espeak:
    """One espeak-ng engine. Use :func:`engine` (one per process) rather than constructing it."""

    def __init__(self) -> None:
        self._source = Path(_loader().get_library_path())
        if not self._source.is_file():
            raise EspeakError(f"espeak-ng library missing at {self._source}")
        self._data = data_path()
        self._image = self._source.read_bytes()  # for the private copies made by _load
        libc_name = ctypes.util.find_library("c")
        # espeak-ng also draws from libc rand() for noise sources; we seed it per utterance.
        self._libc = ctypes.CDLL(libc_name) if libc_name else None
        self._chunks: list[np.ndarray] = []
        # Keep a reference: ctypes frees the C trampoline when the Python object dies.
        self._callback = _SYNTH_CALLBACK(self._collect)
        self._lock = threading.Lock()
        self._lib: ctypes.CDLL | None = None
        self.sample_rate: int = self._load()

    def _load(self) -> int:
        """Load the library fresh (all C statics at their initial values) and initialise it.

        Each load maps a new private copy of the file: only our handle references it, so the
        dlclose in :meth:`_reload` really unloads it. The copy is unlinked as soon as it is
        mapped, so nothing is left on disk even if the process is killed.
        """
        fd, path = tempfile.mkstemp(prefix="fedac-espeak-", suffix=self._source.suffix)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(self._image)
            lib = ctypes.CDLL(path)
        except OSError as exc:
            raise EspeakError(
                f"cannot load espeak-ng library {self._source} (private copy in "
                f"{tempfile.gettempdir()}; point TMPDIR at an exec-mountable directory): {exc}"
            ) from exc
        finally:
            try:
                os.unlink(path)
            except OSError:  # pragma: no cover - Windows cannot delete a loaded DLL
                pass
        for name, restype, argtypes in _FUNCTIONS:
            try:
                fn = getattr(lib, name)
            except AttributeError as exc:
                raise EspeakError(f"{self._source} lacks {name}; espeak-ng too old?") from exc
            fn.restype, fn.argtypes = restype, argtypes
        # The path argument is the *parent* of espeak-ng-data.
        rate = lib.espeak_Initialize(
            _AUDIO_OUTPUT_SYNCHRONOUS, 0, os.fsencode(self._data.parent), _INITIALIZE_DONT_EXIT
        )
        if rate <= 0:
            raise EspeakError(f"espeak_Initialize failed (code {rate}) with data at {self._data}")
        lib.espeak_SetSynthCallback(self._callback)
        self._lib = lib
        return rate

    def reset(self) -> None:
        """Reload the library: every C-level state (voice, parameters, generator) to its start."""
        with self._lock:
            self._reload()

    def _reload(self) -> None:
        lib, self._lib = self._lib, None
        assert lib is not None  # loaded by __init__; only this method unloads it, and reloads
        lib.espeak_Terminate()
        _dlclose(lib._handle)
        self._load()

    def _collect(self, wav, numsamples, _events) -> int:
        if wav and numsamples > 0:
            self._chunks.append(np.ctypeslib.as_array(wav, shape=(numsamples,)).copy())
        return 0  # 0 = continue synthesis

    def synth(
        self,
        text: str,
        voice: str = "en-us",
        *,
        rate: int = 175,
        pitch: int = 50,
        pitch_range: int = 50,
        volume: int = 100,
        seed: int = 0,
        fresh: bool = True,
    ) -> np.ndarray:
        """Render ``text`` with ``voice``: an accent, optionally ``+variant``
        (``"en-gb-x-rp+Andy"``).

        ``rate`` is in words per minute (80..450); ``pitch`` and ``pitch_range`` are 0..100 with 50
        the voice's default; ``volume`` is 0..200. ``seed`` drives espeak's noise generators.
        Returns float32 samples in [-1, 1] at :attr:`sample_rate`. With ``fresh`` (the default)
        the same arguments always give the same samples; ``fresh=False`` skips the reset and
        continues from the state the previous utterance left (see the module docstring).
        """
        encoded = text.encode("utf-8") + b"\0"
        with self._lock:
            if fresh:
                self._reload()
            lib = self._lib
            assert lib is not None  # loaded by __init__ and by _reload
            if lib.espeak_SetVoiceByName(voice.encode("utf-8")) != _EE_OK:
                raise EspeakError(f"espeak-ng has no voice {voice!r}")
            # Parameters after the voice: selecting a voice resets them.
            for param, value in (
                (_PARAM_RATE, rate),
                (_PARAM_PITCH, pitch),
                (_PARAM_RANGE, pitch_range),
                (_PARAM_VOLUME, volume),
            ):
                if lib.espeak_SetParameter(param, int(value), 0) != _EE_OK:
                    raise EspeakError(f"espeak_SetParameter({param}, {value}) failed")
            lib.espeak_ng_SetRandSeed(seed)
            if self._libc is not None:
                self._libc.srand(ctypes.c_uint(seed & 0xFFFFFFFF))
            self._chunks = []
            status = lib.espeak_Synth(
                encoded, len(encoded), 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None
            )
            lib.espeak_Synchronize()
            chunks, self._chunks = self._chunks, []
        if status != _EE_OK:
            raise EspeakError(f"espeak_Synth failed (code {status}) for {text!r} with {voice!r}")
        if not chunks:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate(chunks).astype(np.float32) / 32768.0


_ENGINE: Espeak | None = None
_ENGINE_PID: int | None = None
_ENGINE_LOCK = threading.Lock()


def engine() -> Espeak:
    """The process-wide engine, created on first use (and again in a forked child)."""
    global _ENGINE, _ENGINE_PID
    with _ENGINE_LOCK:
        if _ENGINE is None or _ENGINE_PID != os.getpid():
            _ENGINE = Espeak()
            _ENGINE_PID = os.getpid()
        return _ENGINE
