"""FedKWS-UI's data augmentation (the official code's speech_commands_data.py, spec section 4), on
batches.

Waveform, per clip (train and, with `features.test_augment`, validation and test):
- time shift: pad round(0.1 sr) zeros on each side and crop a window at a uniform random offset
  (+-100 ms);
- background noise: with probability 0.8 add u * 0.1 * (a uniform random 1 s segment of a uniform
  random file of the dataset's `_background_noise_` folder), u ~ U(0, 1).
Features, training only (`features.augment`): SpecAugment as torchaudio's FrequencyMasking(5) and
TimeMasking(10) draw it: w = U(0, 1) * max, a = U(0, 1) * (size - w), entries [int(a), int(a + w))
set to 0 (so up to 5 coefficients and 10 frames).

Training draws come from the global torch RNG, which the engine seeds per (seed, round, client)
before every client update (as for dropout), so runs are deterministic per seed and resume exactly.
The stacked path (training/stacking.py) draws each client's batch with `AugmentedWindows.draw`
from a CPU generator seeded the same way, so a stacked client gets the windows it gets training
alone. The test-time augmentation is fixed: each clip's draws come from (seed, clip), so every
evaluation sees the same noisy test set, and the clean one is reported beside it (`clean_*`
results). Choice: the code calls its noise volume "0.1" of the file's own scale; fedac's noise files
are used as stored (float in [-1, 1]), as the code reads them.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from fedac.data.audio import load_audio
from fedac.errors import DatasetError

NOISE_DIR = "_background_noise_"
SHIFT_SECONDS, NOISE_PROB, NOISE_VOLUME = 0.1, 0.8, 0.1
FREQ_MASK, TIME_MASK = 5, 10


@lru_cache(maxsize=4)
def noise_bank(root: str, sample_rate: int) -> tuple[np.ndarray, ...]:
    """Every background-noise file of the dataset at `root`, at `sample_rate` (read once per
    process)."""
    folder = Path(root) / NOISE_DIR
    files = sorted(folder.glob("*.wav")) if folder.is_dir() else []
    if not files:
        raise DatasetError(
            f"augmentation mixes in background noise, but {folder} holds no .wav files; "
            "add the dataset's noise files or set features.augment=false and "
            "features.test_augment=false"
        )
    return tuple(load_audio(f, sample_rate) for f in files)


def shift_and_noise(
    wave: torch.Tensor,
    noise: tuple[np.ndarray, ...],
    sample_rate: int,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """(batch, samples) -> the same shape, each clip shifted and (with p = 0.8) mixed with noise."""
    batch, length = wave.shape
    pad = int(round(SHIFT_SECONDS * sample_rate))
    padded = torch.nn.functional.pad(wave, (pad, pad))
    # Host-side draws (explicitly on the CPU, like the waveforms): the CPU RNG stream fixes them.
    starts = torch.randint(0, 2 * pad + 1, (batch,), generator=generator, device="cpu")
    out = torch.stack([padded[i, s : s + length] for i, s in enumerate(starts.tolist())])
    mix = torch.rand(batch, generator=generator, device="cpu") < NOISE_PROB
    volume = torch.rand(batch, generator=generator, device="cpu") * NOISE_VOLUME
    files = torch.randint(0, len(noise), (batch,), generator=generator, device="cpu")
    for i in torch.nonzero(mix).flatten().tolist():
        source = noise[int(files[i])]
        if len(source) < length:  # a short noise file: repeated to one window
            source = np.tile(source, -(-length // len(source)))
        start = int(
            torch.randint(0, len(source) - length + 1, (1,), generator=generator, device="cpu")
        )
        out[i] += float(volume[i]) * torch.from_numpy(source[start : start + length])
    return out


def spec_augment(features: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One frequency mask (<= 5 coefficients) and one time mask (<= 10 frames) per (features,
    frames) item."""
    out = features.clone()
    for axis, most in ((1, FREQ_MASK), (2, TIME_MASK)):
        size = out.shape[axis]
        for i in range(out.shape[0]):
            width = float(torch.rand(1, generator=generator, device="cpu")) * most
            start = float(torch.rand(1, generator=generator, device="cpu")) * (size - width)
            lo, hi = int(start), int(start + width)
            if axis == 1:
                out[i, lo:hi, :] = 0.0
            else:
                out[i, :, lo:hi] = 0.0
    return out


class AugmentedWindows:
    """A client's training windows kept as waveforms; indexing returns freshly augmented model
    inputs.

    Stands in for ClientData.x on the sequential path: `x[idx]` is shift + noise -> features (the
    run's extractor) -> `finish` (CMVN or FedKWS-UI's scaling) -> SpecAugment, drawn from the global
    RNG. The waveforms and the augmentation stay on the CPU (its RNG stream fixes the draws); each
    batch is then moved to `device` (`.to`, as the engine moves every client's data)."""

    def __init__(
        self,
        waves: torch.Tensor,
        extractor,
        finish,
        noise: tuple[np.ndarray, ...],
        device: torch.device | str = "cpu",
    ):
        self.waves, self.extractor, self.finish, self.noise = waves, extractor, finish, noise
        self.device = torch.device(device)
        frames = extractor(torch.zeros(1, waves.shape[1], device="cpu")).shape[-1]
        self.shape = torch.Size((waves.shape[0], extractor.num_features, frames))

    def __len__(self) -> int:
        return int(self.waves.shape[0])

    def to(self, device: torch.device | str) -> AugmentedWindows:
        return AugmentedWindows(self.waves, self.extractor, self.finish, self.noise, device)

    def __getitem__(self, idx: torch.Tensor) -> torch.Tensor:
        return self.draw(idx)

    def draw(self, idx: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """The windows `idx`, augmented with draws from `generator` (None: the global CPU RNG)."""
        wave = shift_and_noise(
            self.waves[idx.cpu()], self.noise, self.extractor.cfg.sample_rate, generator
        )
        with torch.no_grad():
            return spec_augment(self.finish(self.extractor(wave)), generator).to(
                self.device, non_blocking=True
            )
