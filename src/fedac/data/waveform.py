"""Variable-length sequences kept resident as one padded tensor plus their lengths.

`Padded` is what the waveform data path stores where the feature path stores a fixed-size tensor:
clients' waveforms (or their cached CNN features) and CTC target sequences. It supports what the
training loop and the evaluation do with a tensor of samples (`len`, `x[idx]`, `.split(n)`,
`.shape[0]`), so `training.local` batches it unchanged; a batch is trimmed to its longest member.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fedac.data.audio import load_audio
from fedac.data.corrupt import add_white_noise
from fedac.data.manifest import Clip


@dataclass
class Padded:
    values: torch.Tensor
    """(N, T, ...) right-padded with zeros."""
    lengths: torch.Tensor
    """(N,) valid length of each row along T."""

    @classmethod
    def stack(
        cls, rows: Sequence[torch.Tensor], empty_shape: tuple[int, ...] = (), dtype=torch.float32
    ) -> Padded:
        """Rows of shape (T_i, ...) -> one padded batch; no rows gives an empty batch of
        `empty_shape`."""
        if not rows:
            return cls(
                torch.zeros((0, 0, *empty_shape), dtype=dtype), torch.zeros(0, dtype=torch.long)
            )
        lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
        values = torch.nn.utils.rnn.pad_sequence(list(rows), batch_first=True)
        return cls(values, lengths)

    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def shape(self) -> torch.Size:
        return self.values.shape

    def __getitem__(self, index) -> Padded:
        lengths = self.lengths[index]
        longest = int(lengths.max()) if lengths.numel() else 0
        return Padded(self.values[index][:, :longest], lengths)

    def split(self, size: int) -> Iterator[Padded]:
        """Batches of `size` rows, as views (slices, no copies), so a batch scored twice is the
        same memory (models/early_exit.py remembers an evaluated batch by it)."""
        for start in range(0, len(self), size):
            yield self[start : start + size]

    def mask(self) -> torch.Tensor:
        """(N, T) True on valid positions."""
        return (
            torch.arange(self.values.shape[1], device=self.lengths.device) < self.lengths[:, None]
        )

    def rows(self) -> list[torch.Tensor]:
        return [self.values[i, : int(n)] for i, n in enumerate(self.lengths)]


def load_waveform(
    clip: Clip | str, sample_rate: int = 16000, snr_db: float = 100.0, noise_seed: int = 0
) -> np.ndarray:
    """A clip as float32 at `sample_rate`, SNR noise as the feature path adds it (same per-file
    draw), then normalised to zero mean and unit variance per utterance (wav2vec 2.0's
    `do_normalize`)."""
    clip = clip if isinstance(clip, Clip) else Clip(str(clip), 0, "", "")
    audio = load_audio(clip.path, sample_rate, clip.offset, clip.duration)
    if snr_db < 100:
        audio = add_white_noise(audio, snr_db, noise_seed, f"{clip.path}@{clip.offset}")
    return ((audio - audio.mean()) / (audio.std() + 1e-7)).astype(np.float32)
