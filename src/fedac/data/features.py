"""Log-Mel and MFCC features computed in batches with torch and cached on disk.

Defaults follow fedkws-ui.md: 40 coefficients, 30 ms window, 10 ms hop, 16 kHz (a 1 s clip gives
40 x 101). The cache key covers the dataset identity, every file's size and mtime, the feature
settings and the noise setting, so a second run reads the cache and a changed file is recomputed.

torchaudio has no CPU build on our target machines and librosa would add numba/llvmlite for one
filterbank, so the HTK mel filterbank is written here (tested against its defining properties);
the DCT-II basis comes from scipy.

`features.style=fedkws` is FedKWS-UI's official pipeline (torchaudio's MFCC with the code's
arguments, re-derived here): audio at 8 kHz, n_fft = window = 240 with hop 80 (101 frames a second),
HTK mel filters over 0-4 kHz, power -> 10 log10(max(p, 1e-10)) floored at the clip's peak - 80 dB
(torchaudio's AmplitudeToDB(top_db=80), one clip at a time), orthonormal DCT-II to 40 coefficients,
then / 500 and no CMVN (engine/data.py's `model_input`). Resampling uses scipy's polyphase filter,
not torchaudio's sinc interpolation, so the features match the code's to the resampler's difference,
not bit for bit.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
from scipy.fft import dct

from fedac.config import Config, FeatureConfig
from fedac.data.audio import fit_length, load_audio
from fedac.data.augment import noise_bank, shift_and_noise
from fedac.data.corrupt import add_white_noise
from fedac.data.manifest import Manifest
from fedac.errors import AudioError, ConfigError
from fedac.progress import bar as progress_bar
from fedac.seeding import torch_generator

#: 2: truncated WAV files are rejected; a version-1 cache may hold the features of a cut file.
CACHE_VERSION = 2
#: Version of the decode verdicts of `undecodable`: bump it whenever `load_audio` rejects more
#: files.
VERDICT_VERSION = 1


def hz_to_mel(hz: np.ndarray | float) -> np.ndarray:
    return 2595.0 * np.log10(1.0 + np.asarray(hz, dtype=np.float64) / 700.0)


def mel_to_hz(mel: np.ndarray | float) -> np.ndarray:
    return 700.0 * (10.0 ** (np.asarray(mel, dtype=np.float64) / 2595.0) - 1.0)


def mel_filterbank(
    n_mels: int, n_fft: int, sample_rate: int, f_min: float = 20.0, f_max: float | None = None
) -> np.ndarray:
    """HTK-style triangular filters, shape (n_mels, n_fft // 2 + 1), each peaking at 1 on its
    centre."""
    f_max = f_max or sample_rate / 2
    fft_freqs = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)
    edges = mel_to_hz(np.linspace(hz_to_mel(f_min), hz_to_mel(f_max), n_mels + 2))
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (fft_freqs[None, :] - lower) / (centre - lower)
    falling = (upper - fft_freqs[None, :]) / (upper - centre)
    return np.clip(np.minimum(rising, falling), 0.0, None).astype(np.float32)


#: FedKWS-UI's feature constants (preprocess.py of the official code): dB floor under the peak,
#: divisor.
FEDKWS_TOP_DB, FEDKWS_SCALE = 80.0, 500.0


def resolve_features(cfg: FeatureConfig) -> FeatureConfig:
    """The settings a style actually uses: `fedkws` fixes 8 kHz, 30 / 10 ms, 40 mels, 40 MFCCs."""
    if cfg.style == "fedac":
        return cfg
    if cfg.style != "fedkws":
        raise ConfigError(f"features.style must be fedac or fedkws, got {cfg.style!r}")
    return replace(
        cfg, kind="mfcc", sample_rate=8000, win_ms=30.0, hop_ms=10.0, n_mels=40, n_mfcc=40
    )


class FeatureExtractor:
    """Batched STFT -> mel -> log (-> DCT) on torch tensors of equal-length waveforms."""

    def __init__(self, cfg: FeatureConfig):
        cfg = resolve_features(cfg)
        if cfg.kind not in ("mfcc", "logmel"):
            raise ValueError(f"features.kind must be 'mfcc' or 'logmel', got {cfg.kind!r}")
        self.cfg = cfg
        self.fedkws = cfg.style == "fedkws"
        self.win_length = int(round(cfg.sample_rate * cfg.win_ms / 1000))
        self.hop_length = int(round(cfg.sample_rate * cfg.hop_ms / 1000))
        # fedkws: torchaudio's n_fft = window (240); fedac pads the window to a power of two
        self.n_fft = self.win_length if self.fedkws else 2 ** math.ceil(math.log2(self.win_length))
        self.window = torch.hann_window(self.win_length)
        self.mel = torch.from_numpy(
            mel_filterbank(cfg.n_mels, self.n_fft, cfg.sample_rate, 0.0 if self.fedkws else 20.0)
        )
        self.dct = None
        if cfg.kind == "mfcc":
            if cfg.n_mfcc > cfg.n_mels:
                raise ValueError("features.n_mfcc cannot exceed features.n_mels")
            basis = dct(np.eye(cfg.n_mels), type=2, norm="ortho", axis=0)[: cfg.n_mfcc]
            self.dct = torch.from_numpy(basis.astype(np.float32))

    def to(self, device: torch.device | str) -> FeatureExtractor:
        """This extractor with its window, mel and DCT matrices on `device` (itself when already
        there)."""
        if self.window.device == torch.device(device):
            return self
        moved = copy.copy(self)
        moved.window, moved.mel = self.window.to(device), self.mel.to(device)
        moved.dct = None if self.dct is None else self.dct.to(device)
        return moved

    @property
    def num_features(self) -> int:
        return self.cfg.n_mfcc if self.cfg.kind == "mfcc" else self.cfg.n_mels

    def __call__(self, waves: torch.Tensor) -> torch.Tensor:
        """(batch, samples) float32 -> (batch, features, frames)."""
        spec = torch.stft(
            waves,
            self.n_fft,
            self.hop_length,
            self.win_length,
            self.window,
            center=True,
            return_complex=True,
        )
        power = spec.real.square() + spec.imag.square()
        if self.fedkws:
            db = 10.0 * torch.log10(torch.clamp(torch.matmul(self.mel, power), min=1e-10))
            db = torch.maximum(db, db.amax(dim=(1, 2), keepdim=True) - FEDKWS_TOP_DB)
            assert self.dct is not None  # resolve_features sets kind=mfcc for the fedkws style
            return torch.matmul(self.dct, db) / FEDKWS_SCALE
        logmel = torch.log(torch.matmul(self.mel, power) + 1e-6)
        return logmel if self.dct is None else torch.matmul(self.dct, logmel)


@dataclass
class FeatureSet:
    """Features of every model-input window of a manifest; `clip_index` maps a window to its
    clip."""

    features: torch.Tensor
    clip_index: torch.Tensor

    def __len__(self) -> int:
        return int(self.features.shape[0])


def cache_root(cache_dir: str | None) -> Path:
    base = cache_dir or os.environ.get("FEDAC_HOME") or Path.home() / ".cache" / "fedac"
    return Path(base)


def undecodable(paths, cache_dir: str | None, progress: bool = False) -> dict[str, str]:
    """path -> why `load_audio` rejects it, for each of `paths` that cannot be decoded: the one
    verdict that data.on_bad_file=skip and device folders act on. Each file is decoded whole at its
    own rate (the errors do not depend on the rate); the verdicts are cached under the feature
    cache, keyed by every file's path, size and mtime, so an unchanged dataset is checked once."""
    paths = sorted({str(p) for p in paths})
    keys = [f"v{VERDICT_VERSION}"]
    for path in paths:
        try:
            stat = os.stat(path)
            keys.append(f"{Path(path).resolve()}|{stat.st_size}|{stat.st_mtime_ns}")
        except OSError:  # missing or a link loop: load_audio says which
            keys.append(f"{path}|missing")
    digest = hashlib.sha256("\n".join(keys).encode()).hexdigest()[:24]
    cached = cache_root(cache_dir) / "checked" / f"audio-{digest}.json"
    if cached.is_file():
        return json.loads(cached.read_text())

    def verdict(path: str) -> str | None:
        try:
            load_audio(path, sample_rate=None)
        except AudioError as exc:
            return str(exc)
        return None

    with ThreadPoolExecutor(max_workers=4) as pool:
        verdicts = list(
            progress_bar(
                pool.map(verdict, paths),
                total=len(paths),
                desc="checking audio",
                unit="file",
                disable=not progress,
            )
        )
    bad = {path: reason for path, reason in zip(paths, verdicts) if reason is not None}
    cached.parent.mkdir(parents=True, exist_ok=True)
    # Flower ClientApp processes may race
    tmp = cached.with_name(f".{cached.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(bad))
    os.replace(tmp, cached)
    return bad


ON_BAD_FILE = ("error", "skip")


def screen_manifest(
    manifest: Manifest, on_bad_file: str, cache_dir: str | None, progress: bool = False
) -> tuple[Manifest, dict[str, str]]:
    """data.on_bad_file: `error` returns the manifest as it is (its first bad file stops the run
    where it is decoded, at no cost to a good dataset); `skip` returns it without the clips whose
    file cannot be decoded (and the verification trials naming one), with path -> reason of those
    files. Both the features and their cache key then see only the good clips, so a skipped file
    never enters a cache that a run with on_bad_file=error would reuse."""
    if on_bad_file not in ON_BAD_FILE:
        raise ConfigError(
            f"data.on_bad_file must be one of {', '.join(ON_BAD_FILE)}, got {on_bad_file!r}"
        )
    if on_bad_file == "error":
        return manifest, {}
    # duration 0: a zeroed waveform, never read
    decoded = [c.path for c in manifest.clips if c.duration != 0]
    bad = undecodable(
        decoded + [p for a, b, _ in manifest.trials for p in (a, b)], cache_dir, progress
    )
    if not bad:
        return manifest, {}
    clips = [c for c in manifest.clips if c.duration == 0 or c.path not in bad]
    trials = [t for t in manifest.trials if t[0] not in bad and t[1] not in bad]
    return replace(manifest, clips=clips, trials=trials), bad


def _fingerprint(
    manifest: Manifest,
    cfg: FeatureConfig,
    snr_db: float,
    noise_seed: int,
    device: torch.device | str = "cpu",
) -> str:
    digest = hashlib.sha256()
    settings = asdict(cfg)
    settings.pop("augment")  # training augmentation happens per batch, never in the cache
    # the keys of caches written before them
    for key, default in (("style", "fedac"), ("test_augment", False)):
        if settings[key] == default:
            settings.pop(key)
    if cfg.test_augment:
        settings["test_augment_seed"] = noise_seed
    head = {
        "v": CACHE_VERSION,
        "name": manifest.name,
        "root": str(Path(manifest.root).resolve()),
        "features": settings,
        "snr_db": snr_db,
        "noise_seed": noise_seed if snr_db < 100 else None,
    }
    # a GPU's STFT differs from the CPU's by float rounding: its own
    if torch.device(device).type != "cpu":
        # cache, so a CPU run never reads a GPU's features
        head["computed_on"] = torch.device(device).type
    digest.update(json.dumps(head, sort_keys=True).encode())
    for clip in manifest.clips:
        stat = os.stat(clip.path)
        digest.update(
            f"{clip.path}|{clip.offset}|{clip.duration}|{stat.st_size}|{stat.st_mtime_ns}\n".encode()
        )
    return digest.hexdigest()[:24]


def _clip_windows(
    manifest: Manifest,
    index: int,
    cfg: FeatureConfig,
    snr_db: float,
    noise_seed: int,
    audio_hook=None,
) -> list[np.ndarray]:
    clip = manifest.clips[index]
    # duration 0: a zeroed waveform (FedKWS-UI's _silence_, data.gsc12=fedkws), padded to one window
    # below
    audio = (
        np.zeros(0, np.float32)
        if clip.duration == 0
        else load_audio(clip.path, cfg.sample_rate, clip.offset, clip.duration)
    )
    if snr_db < 100:
        audio = add_white_noise(audio, snr_db, noise_seed, f"{clip.path}@{clip.offset}")
    if audio_hook is not None:  # e.g. attacks.py's backdoor trigger, mixed in before windowing
        audio = audio_hook(audio, index)
    windows = fit_length(audio, int(round(cfg.clip_seconds * cfg.sample_rate)))
    # fixed per (seed, clip): the same noisy test set every time
    if cfg.test_augment and clip.split in ("val", "test"):
        gen = torch_generator(noise_seed, "test-augment", clip.path, clip.offset)
        noise = noise_bank(manifest.root, cfg.sample_rate)
        windows = [
            shift_and_noise(torch.from_numpy(w)[None], noise, cfg.sample_rate, gen)[0].numpy()
            for w in windows
        ]
    return windows


def clip_waveforms(
    manifest: Manifest, index: int, cfg: FeatureConfig, snr_db: float = 100.0, noise_seed: int = 0
) -> list[np.ndarray]:
    """The model-input windows of one clip as waveforms at the style's sample rate (what the cache's
    features are computed from), for features.augment's per-batch features."""
    return _clip_windows(manifest, index, resolve_features(cfg), snr_db, noise_seed)


def compute_features(
    manifest: Manifest,
    cfg: FeatureConfig,
    snr_db: float = 100.0,
    noise_seed: int = 0,
    batch_size: int = 256,
    progress: bool = True,
    audio_hook=None,
    device: torch.device | str = "cpu",
) -> FeatureSet:
    """Features for every clip of `manifest` (no cache). Audio decoding runs on a small thread pool;
    the STFT, mel and DCT of each batch of windows run on `device` (a run's `runtime.device`), and
    the features come back to the host. `audio_hook(audio, clip_index)`, when given, transforms each
    clip's audio before windowing."""
    device = torch.device(device)
    extractor = FeatureExtractor(cfg).to(device)
    cfg = extractor.cfg  # the style's settings (sample rate of the decoded audio)
    chunks, owners = [], []
    indices = range(len(manifest.clips))
    bar = progress_bar(
        total=len(manifest.clips),
        desc=f"features {manifest.name}",
        unit="clip",
        disable=not progress,
    )
    with ThreadPoolExecutor(max_workers=4) as pool:
        for start in range(0, len(manifest.clips), batch_size):
            batch = indices[start : start + batch_size]
            windows = pool.map(
                lambda i: _clip_windows(manifest, i, cfg, snr_db, noise_seed, audio_hook), batch
            )
            waves, owner = [], []
            for clip_id, clip_windows in zip(batch, windows):
                waves.extend(clip_windows)
                owner.extend([clip_id] * len(clip_windows))
            with torch.no_grad():
                batch_waves = torch.from_numpy(np.stack(waves))
                if device.type == "cuda":
                    batch_waves = batch_waves.pin_memory()
                chunks.append(
                    extractor(batch_waves.to(device, non_blocking=True)).to("cpu", torch.float16)
                )
            owners.append(torch.tensor(owner, dtype=torch.long))
            bar.update(len(batch))
    bar.close()
    if not chunks:
        return FeatureSet(
            torch.empty(0, extractor.num_features, 0), torch.empty(0, dtype=torch.long)
        )
    return FeatureSet(torch.cat(chunks), torch.cat(owners))


def features_of(
    manifest: Manifest,
    cfg: Config,
    progress: bool = True,
    device: torch.device | str = "cpu",
    features: FeatureConfig | None = None,
) -> FeatureSet:
    """`load_features` of `manifest` as run `cfg` sets it up (its features, or `features` in their
    place; its cache folder, noise level and seed)."""
    return load_features(
        manifest,
        cfg.features if features is None else features,
        cfg.data.cache_dir,
        cfg.data.snr_db,
        cfg.seed,
        progress,
        device,
    )


def load_features(
    manifest: Manifest,
    cfg: FeatureConfig,
    cache_dir: str | None = None,
    snr_db: float = 100.0,
    noise_seed: int = 0,
    progress: bool = True,
    device: torch.device | str = "cpu",
) -> FeatureSet:
    """Cached `compute_features` (on `device`): the cache file is written atomically and keyed by
    `_fingerprint`, which names a GPU when one computed it."""
    key = _fingerprint(manifest, cfg, snr_db, noise_seed, device)
    path = cache_root(cache_dir) / "features" / f"{manifest.name}-{cfg.kind}-{key}.pt"
    if path.is_file():
        stored = torch.load(path, weights_only=True)
        return FeatureSet(stored["features"], stored["clip_index"])
    feats = compute_features(manifest, cfg, snr_db, noise_seed, progress=progress, device=device)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save({"features": feats.features, "clip_index": feats.clip_index}, tmp)
    os.replace(tmp, path)
    return feats
