"""The deployed forms of a trained model: one module from the waveform to the logits, so that an
exported graph needs nothing but audio samples.

Why the feature front end is inside the graph (not a recipe beside it): a device then runs one file
with one input, the clip's samples at the sidecar's sample rate, and cannot get the features subtly
wrong (window, padding, mel scale, CMVN). The STFT exports as ONNX's standard STFT operator (opset
17 and later; onnxruntime runs it), the same FFT computation as torch.stft, so the file holds only
the window, the mel filterbank and the DCT basis (about 47 kB at the defaults) beside the network.

- `FeatureFrontEnd`: `data.features.FeatureExtractor` itself (torch.stft, centre reflect padding,
  the Hann window padded into n_fft, HTK mel, log or FedKWS-UI's dB, DCT-II) followed by the model
  input transform `training.types.model_input` (per-utterance CMVN, or none for
  `features.style=fedkws`). One difference, on purpose: the feature cache stores features in
  float16 before CMVN; the graph stays in float32 (a storage rounding, not part of the model).
  `fedac export` measures what it changes: the agreement of the exported model's test predictions
  with the run's own.
- `FeatureModel`: the front end, then a feature network (CRNN, KWS nets, the small CNNs).
- `SSLWaveformModel`: an SSL classifier from the waveform: per-utterance normalisation
  (data.waveform.load_waveform), the CNN feature encoder (the frozen one the run cached frames
  from, or the model's own), then the model's projection, encoder layers to its depth (its exit),
  statistics pooling and head. Every frame of the clip is valid (one clip per row, no padding).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fedac.config import FeatureConfig
from fedac.data.features import FeatureExtractor
from fedac.training.types import normalize


class FeatureFrontEnd(nn.Module):
    """(batch, samples) float32 waveform -> (batch, features, frames): what the models read."""

    def __init__(self, cfg: FeatureConfig):
        super().__init__()
        self.extractor = FeatureExtractor(cfg)
        self.cmvn = self.extractor.cfg.style != "fedkws"
        # buffers, so that the exporter stores them once as the graph's initialisers
        ex = self.extractor
        self.register_buffer("window", ex.window)
        self.register_buffer("mel", ex.mel)
        self.register_buffer("dct", ex.dct)

    def forward(self, waves: torch.Tensor) -> torch.Tensor:
        ex = self.extractor
        # (the module's buffers, so that the exporter sees them as the graph's constants)
        ex.window, ex.mel, ex.dct = self.get_buffer("window"), self.get_buffer("mel"), self.dct  # type: ignore[assignment]
        feats = ex(waves)
        return normalize(feats) if self.cmvn else feats


class FeatureModel(nn.Module):
    """Waveform -> logits of a feature network."""

    def __init__(self, front: FeatureFrontEnd, model: nn.Module):
        super().__init__()
        self.front, self.model = front, model

    def forward(self, waves: torch.Tensor) -> torch.Tensor:
        return self.model(self.front(waves))


class SSLWaveformModel(nn.Module):
    """Waveform -> logits of an SSL classifier (`models.ssl.SSLModel` or a `MultiExitSSL` at its
    selected exit)."""

    def __init__(self, model: nn.Module, cnn: nn.Module):
        super().__init__()
        self.cnn: nn.Module = cnn
        self.model: nn.Module = model
        self.depth = int(model.depth)  # type: ignore[arg-type]

    def forward(self, waves: torch.Tensor) -> torch.Tensor:
        from fedac.models.ssl import encoder_layers, stats_pool

        mean = waves.mean(dim=1, keepdim=True)
        std = (waves - mean).square().mean(dim=1, keepdim=True).sqrt()
        feats = self.cnn((waves - mean) / (std + 1e-7)).transpose(1, 2)
        m: Any = self.model  # (an SSLModel: projection, encoder, classify)
        hidden = m.projection(feats)
        hidden = hidden[0] if isinstance(hidden, tuple) else hidden
        mask = torch.ones(hidden.shape[:2], dtype=torch.bool, device=hidden.device)
        hidden = encoder_layers(m.encoder, hidden, mask, self.depth)
        return m.classify(stats_pool(hidden, mask))
