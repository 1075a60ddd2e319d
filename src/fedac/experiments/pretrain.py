"""`fedac pretrain`: a small wav2vec 2.0-style encoder pretrained by fedac on synthetic espeak
speech.

Corpus: the train-clean-100 part of a synthetic LibriSpeech tree (data/synth/librispeech.py)
generated with seed 1000 + `--seed`, cached under $FEDAC_HOME/synthetic. Its speakers are drawn from
that seed's own random stream, so they are other speakers than those of every downstream stand-in
(drawn with seed 0), test splits included; none of their clips is used downstream. (espeak-ng has a
finite set of accent x voice variants: two speakers can share one while differing in pitch, rate,
colouring and room.)

Objectives:
- `hubert` (default): HuBERT-style masked prediction (Hsu et al. 2021, first iteration). Targets are
  k-means clusters (`--clusters`, 100; scikit-learn MiniBatchKMeans) of per-utterance-normalised
  MFCCs (13 coefficients + deltas + delta-deltas, 25 ms window, 20 ms hop: one per CNN frame,
  aligned by truncation). Spans of the projected CNN features are replaced by the learned mask
  embedding (mask_prob 0.65, span 10, transformers' `_compute_mask_indices`), and a linear layer on
  the transformer output predicts the cluster of every masked frame (cross-entropy on masked frames
  only, HuBERT's alpha = 1). Simplification: a linear classifier instead of HuBERT's cosine scoring
  against projected codeword embeddings.
- `contrastive`: wav2vec 2.0's objective through transformers' Wav2Vec2ForPreTraining with its mask
  and negative samplers (`_compute_mask_indices`, `_sample_negative_indices`): contrastive loss +
  0.1 x diversity loss, divided by the number of masked frames (transformers sums over them).

Training: random crops of `--crop-seconds` (2 s; shorter clips are padded and masked), AdamW with a
linear warm-up over the first 10% of steps then linear decay. Every random choice of step s (crops,
masks, negatives, dropout) derives from (seed, s), and `state.pt` (model, optimizer, schedule, loss
curve) is written atomically every `--checkpoint-every` steps, so a killed run started again with
the same command continues and ends with the weights of an uninterrupted run.

Output folder (default $FEDAC_HOME/encoders/<model>-<objective>-s<seed>-<steps>): the encoder in the
Hugging Face format (config.json + model.safetensors; `--set model.encoder_path=DIR` loads it),
`loss.csv` (step, loss), and `pretrain.json` (settings, command line, wall time, SHA-256 of the
weights). A finished folder is reused as it is.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fedac.config import FeatureConfig
from fedac.data.features import FeatureExtractor, cache_root
from fedac.data.librispeech import load_manifest as load_librispeech
from fedac.data.waveform import load_waveform
from fedac.experiments.pretrain_settings import PretrainSettings
from fedac.models.ssl import HFModule, frame_lengths, size_config
from fedac.progress import bar as progress_bar
from fedac.seeding import derive_seed, numpy_rng
from fedac.training.types import normalize

CORPUS_SEED_OFFSET = 1000
SAMPLE_RATE = 16000


def default_out(s: PretrainSettings, cache_dir: str | None = None) -> Path:
    return cache_root(cache_dir) / "encoders" / f"{s.model}-{s.objective}-s{s.seed}-{s.steps}"


def corpus(
    s: PretrainSettings, cache_dir: str | None = None, progress: bool = True
) -> list[np.ndarray]:
    """Normalised waveforms of the pretraining corpus (see the module docstring)."""
    # lazy: start-up time (the synthesiser, only for a missing corpus)
    from fedac.data.synth.librispeech import generate

    seed = CORPUS_SEED_OFFSET + s.seed
    root = (
        cache_root(cache_dir)
        / "synthetic"
        / f"pretrain-speakers{s.speakers}-utterances{s.utterances}-seed{seed}"
    )
    generate(
        root,
        speakers=s.speakers,
        utterances=s.utterances,
        eval_speakers=1,
        eval_utterances=1,
        seed=seed,
        progress=progress,
    )
    clips = [c for c in load_librispeech(root).clips if c.split == "train"]
    return [
        load_waveform(c)
        for c in progress_bar(clips, desc="pretraining corpus", unit="clip", disable=not progress)
    ]


def mfcc_frames(waves: torch.Tensor) -> torch.Tensor:
    """(B, S) -> (B, T, 39): 13 MFCCs + deltas + delta-deltas, 25 ms / 20 ms, per-utterance
    normalised."""
    extractor = FeatureExtractor(
        FeatureConfig(kind="mfcc", n_mels=40, n_mfcc=13, win_ms=25.0, hop_ms=20.0)
    )
    base = extractor(waves)
    delta = torch.gradient(base, dim=2)[0]
    feats = torch.cat([base, delta, torch.gradient(delta, dim=2)[0]], dim=1)
    return normalize(feats).transpose(1, 2)


def fit_clusters(waves: list[np.ndarray], s: PretrainSettings) -> torch.Tensor:
    """k-means centres (clusters, 39) of the corpus' MFCC frames (at most 200 clips)."""
    from sklearn.cluster import MiniBatchKMeans

    pick = numpy_rng(s.seed, "pretrain-kmeans").permutation(len(waves))[:200]
    frames = torch.cat([mfcc_frames(torch.from_numpy(waves[i])[None])[0] for i in pick]).numpy()
    km = MiniBatchKMeans(
        n_clusters=min(s.clusters, len(frames)),
        random_state=derive_seed(s.seed, "kmeans") % 2**31,
        n_init=3,
        batch_size=4096,
    ).fit(frames)
    return torch.from_numpy(km.cluster_centers_).float()


def batch(
    waves: list[np.ndarray], s: PretrainSettings, step: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step `step`'s crops (B, S) and their sample mask (B, S)."""
    rng = numpy_rng(s.seed, "pretrain-batch", step)
    crop = int(s.crop_seconds * SAMPLE_RATE)
    x, mask = torch.zeros(s.batch_size, crop), torch.zeros(s.batch_size, crop, dtype=torch.long)
    for row, i in enumerate(rng.integers(len(waves), size=s.batch_size)):
        wave = waves[i]
        start = int(rng.integers(len(wave) - crop + 1)) if len(wave) > crop else 0
        piece = torch.from_numpy(wave[start : start + crop])
        x[row, : len(piece)], mask[row, : len(piece)] = piece, 1
    return x, mask


def build(s: PretrainSettings) -> tuple[HFModule, nn.Module | None]:
    """(model, cluster head): a Wav2Vec2Model and a linear head (hubert), or
    Wav2Vec2ForPreTraining."""
    from transformers import Wav2Vec2ForPreTraining, Wav2Vec2Model

    config = size_config(s.model)
    config.apply_spec_augment, config.mask_time_prob, config.mask_time_length = (
        True,
        s.mask_prob,
        s.mask_length,
    )
    torch.manual_seed(derive_seed(s.seed, "pretrain-init"))
    if s.objective == "contrastive":
        return Wav2Vec2ForPreTraining(config), None
    return Wav2Vec2Model(config), nn.Linear(config.hidden_size, s.clusters)


def step_loss(
    model: HFModule,
    head: nn.Module | None,
    centres: torch.Tensor | None,
    x: torch.Tensor,
    sample_mask: torch.Tensor,
    s: PretrainSettings,
) -> torch.Tensor:
    from transformers.models.wav2vec2.modeling_wav2vec2 import (
        _compute_mask_indices,
        _sample_negative_indices,
    )

    frames = frame_lengths(model.config, sample_mask.sum(1))
    total = int(frame_lengths(model.config, torch.tensor([x.shape[1]]))[0])
    valid = (torch.arange(total) < frames[:, None]).long()
    masked = torch.from_numpy(
        _compute_mask_indices((x.shape[0], total), s.mask_prob, s.mask_length, valid, min_masks=2)
    )
    masked &= valid.bool()
    if head is None:  # wav2vec 2.0 contrastive
        negatives = _sample_negative_indices(
            (x.shape[0], total), model.config.num_negatives, masked.numpy()
        )
        out = model(
            x,
            attention_mask=sample_mask,
            mask_time_indices=masked,
            sampled_negative_indices=torch.from_numpy(negatives).long(),
        )
        return out.loss / masked.sum().clamp(min=1)
    assert centres is not None  # the cluster objective's head comes with its k-means centres
    with torch.no_grad():
        targets = torch.cdist(mfcc_frames(x)[:, :total], centres).argmin(-1)
    hidden = model(x, attention_mask=sample_mask, mask_time_indices=masked).last_hidden_state
    return nn.functional.cross_entropy(head(hidden[masked]), targets[masked])


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _optimizer(s: PretrainSettings, params: list) -> tuple:
    """AdamW at `s.lr` with a linear warm-up over the first tenth of the steps, then a linear decay
    to zero."""
    optimizer = torch.optim.AdamW(params, lr=s.lr)
    warmup = max(1, s.steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda k: min((k + 1) / warmup, max(0.0, (s.steps - k) / max(1, s.steps - warmup))),
    )
    return optimizer, schedule


def _resume(state_path: Path, s: PretrainSettings, model, head, optimizer, schedule) -> tuple:
    """Load the checkpoint at `state_path` into the model, head, optimizer and schedule when it was
    written with the same settings; returns (step, losses, wall seconds, cluster centres), which
    are (0, [], 0.0, None) for a fresh start."""
    if not state_path.is_file():
        return 0, [], 0.0, None
    saved = torch.load(state_path, weights_only=False)
    if saved["settings"] != asdict(s):
        return 0, [], 0.0, None
    model.load_state_dict(saved["model"])
    if head is not None:
        head.load_state_dict(saved["head"])
    optimizer.load_state_dict(saved["optimizer"])
    schedule.load_state_dict(saved["schedule"])
    return saved["step"], saved["losses"], saved["wall"], saved["centres"]


def _write_outputs(
    out: Path,
    s: PretrainSettings,
    model,
    losses: list[float],
    clips: int,
    started: float,
    argv: list[str] | None,
) -> None:
    """The finished encoder (save_pretrained), loss.csv (one row per step) and pretrain.json (the
    settings, command, wall time, final loss, corpus size and the weights' SHA-256)."""
    model.save_pretrained(out)
    with open(out / "loss.csv", "w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["step", "loss"])
        writer.writerows((k + 1, f"{v:.6f}") for k, v in enumerate(losses))
    weights = out / "model.safetensors"
    summary = {
        "settings": asdict(s),
        "command": "fedac " + " ".join(argv or []),
        "wall_seconds": time.perf_counter() - started,
        "final_loss_mean_last_100": float(np.mean(losses[-100:])),
        "corpus_clips": clips,
        "sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    (out / "pretrain.json").write_text(json.dumps(summary, indent=2) + "\n")


def pretrain(
    s: PretrainSettings,
    out: Path,
    cache_dir: str | None = None,
    progress: bool = True,
    stop_after: int | None = None,
    argv: list[str] | None = None,
) -> Path | None:
    """Pretrain (or resume, or reuse) into `out`; returns `out`, or None when stopped by
    `stop_after`."""
    from transformers.utils import logging as hf_logging

    s.check()
    hf_logging.disable_progress_bar()
    out.mkdir(parents=True, exist_ok=True)
    record = out / "pretrain.json"
    if record.is_file() and json.loads(record.read_text()).get("settings") == asdict(s):
        return out
    waves = corpus(s, cache_dir, progress)
    model, head = build(s)
    params = list(model.parameters()) + (list(head.parameters()) if head is not None else [])
    optimizer, schedule = _optimizer(s, params)
    state_path = out / "state.pt"
    step, losses, wall, centres = _resume(state_path, s, model, head, optimizer, schedule)
    if head is not None and centres is None:
        centres = fit_clusters(waves, s)
    started = time.perf_counter() - wall
    model.train()
    bar = progress_bar(
        total=s.steps,
        initial=step,
        desc=f"pretrain {s.model} ({s.objective})",
        unit="step",
        disable=not progress,
    )
    while step < s.steps:
        torch.manual_seed(derive_seed(s.seed, "pretrain-step", step))  # dropout, Gumbel noise
        # transformers' mask / negative samplers
        np.random.seed(derive_seed(s.seed, "pretrain-mask", step) % 2**32)
        loss = step_loss(model, head, centres, *batch(waves, s, step), s)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(params, 10.0)
        optimizer.step()
        schedule.step()
        step += 1
        losses.append(float(loss.detach()))
        bar.update(1)
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
        if step % s.checkpoint_every == 0 or step == s.steps:
            _atomic_save(
                {
                    "settings": asdict(s),
                    "model": model.state_dict(),
                    "head": head.state_dict() if head else None,
                    "optimizer": optimizer.state_dict(),
                    "schedule": schedule.state_dict(),
                    "step": step,
                    "losses": losses,
                    "wall": time.perf_counter() - started,
                    "centres": centres,
                },
                state_path,
            )
        if stop_after is not None and step >= stop_after and step < s.steps:
            bar.close()
            return None
    bar.close()
    _write_outputs(out, s, model, losses, len(waves), started, argv)
    state_path.unlink()
    return out
