"""Self-supervised speech encoders (wav2vec 2.0 / HuBERT through `transformers`) with task heads.

Encoders come from two places, both offline:

- `model.encoder_path=DIR`: any Hugging Face wav2vec 2.0 or HuBERT checkpoint folder (config.json +
  weights), loaded with `from_pretrained(DIR, local_files_only=True)` into the bare encoder, so a
  pretraining checkpoint (Wav2Vec2ForPreTraining: the quantizer and projections are dropped) and a
  CTC checkpoint (its lm_head is dropped) both load. The folder is checked first: transformers
  reports a missing path as a malformed hub repository id. `HF_HUB_OFFLINE=1` is set before
  transformers is imported, so nothing ever contacts a hub.
- a named size (`SIZES`: w2v2_tiny, w2v2_s, w2v2_m, w2v2_base); w2v2_base is the wav2vec 2.0 Base
  configuration for users who bring its weights through `model.encoder_path`.
- the encoder shipped inside the package (`SHIPPED`: w2v2_s, pretrained by `fedac pretrain`; the
  folder models/pretrained/<size>/ holds its HF checkpoint and a README with the command, seed and
  checksum). `resolve_encoder_path` reads `model.encoder_path`: unset (the default) loads the
  shipped encoder of a size that has one and random weights otherwise; `random` asks for random
  weights whatever the size; any other value is a checkpoint folder.

Fine-tuning settings follow the early-exit paper's SpeechBrain recipe: layerdrop 0, no SpecAugment
(`apply_spec_augment=False`), the CNN feature encoder frozen (`model.freeze_cnn`, default true).
With a frozen CNN the model holds only the feature projection, the transformer and the head; the CNN
runs once per clip when the data is built (engine/waveform.py caches its outputs): on small encoders
the CNN's forward and backward pass dominate a training step's CPU time. Inputs are
`data.waveform.Padded` batches: cached CNN frames (N, T, C) with frame lengths, or waveforms (N, S)
with sample lengths when the CNN trains.

Heads (`kind`):
- classification (KWS, ER, SID): statistics pooling over the valid frames, [mean; std] (2H), then
  Linear(2H, C); `embed` returns the pooled vector, which speaker verification scores by cosine.
- ctc (ASR): a 2-layer BiLSTM (`model.ctc_hidden` per direction; 0 = the encoder width H for small
  encoders, where SUPERB's recipe for Base uses 1024) -> Linear -> log-softmax over
  `data.text.VOCAB` (blank = 0), CTC loss, greedy (best-path) decoding without a language model.

`encoder_layers(hidden, mask, depth)` runs `encoder.layers[:depth]` with the encoder's own
positional convolution and layer norms: the exit point early-exit training needs.
`model.encoder_depth` (0 = all) fixes the depth of a run.

Parameter-efficient fine-tuning (`model.peft`, `adapted_encoder`): Hugging Face peft injects LoRA or
IA3 modules into the encoder in place (`inject_adapter_in_model`), which freezes every weight the
encoder had; `head` freezes them with no adapter (only the task head trains). Module paths keep
their names (an adapter of layer l is `encoder.layers.<l>.…`, so early exits group it with its
layer). Those frozen weights are the pre-trained encoder every client
holds already: `SSLModel` leaves them out of its state dict and accepts state dicts without them, so
everything that moves or stores a model's state (broadcasts, uploads, aggregation, checkpoints)
carries the adapters and the head only.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported anywhere

import torch
from torch import nn

from fedac.data.text import greedy_ctc
from fedac.data.waveform import Padded
from fedac.errors import EncoderError

# torch-free: the CLI names the sizes without loading torch
from fedac.models.ssl_sizes import SIZES

ENCODER_TYPES = ("wav2vec2", "hubert")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
KINDS = ("classification", "ctc")
#: transformers' models and their parts (encoder, feature extractor): mypy reads transformers as
#: untyped (pyproject.toml), and their submodules differ per architecture.
HFModule = Any


#: Encoders shipped with fedac (package data): size -> HF checkpoint folder, the default of
#: `model.encoder_path` for that size. `model.encoder_path=random` asks for random weights instead.
PRETRAINED_DIR = Path(__file__).parent / "pretrained"
SHIPPED: dict[str, Path] = {"w2v2_s": PRETRAINED_DIR / "w2v2_s"}
SHIPPED_WEIGHTS = "model.safetensors"
RANDOM_INIT = "random"

#: Fine-tuning overrides applied to every encoder config, loaded or named.
FINETUNE = {"layerdrop": 0.0, "apply_spec_augment": False}


def is_ssl_model(name: str) -> bool:
    return name in SIZES


def size_config(name: str, dropout: float = 0.1):
    """The transformers Wav2Vec2Config of a named size."""
    from transformers import Wav2Vec2Config

    s = SIZES[name]
    return Wav2Vec2Config(
        hidden_size=s.hidden,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        intermediate_size=s.ffn,
        conv_dim=(s.conv,) * 7,
        num_conv_pos_embeddings=s.pos_kernel,
        num_conv_pos_embedding_groups=s.pos_groups,
        hidden_dropout=dropout,
        attention_dropout=dropout,
        activation_dropout=0.0,
        feat_proj_dropout=dropout,
        vocab_size=32,
        **FINETUNE,
    )


def check_encoder_dir(path: str | Path) -> Path:
    """The checkpoint folder, or an EncoderError saying what is missing and how to get a valid
    one."""
    directory = Path(path).expanduser()
    fix = (
        "Point model.encoder_path at a local Hugging Face wav2vec 2.0 / HuBERT checkpoint folder "
        "(config.json + model.safetensors), e.g. one written by `fedac pretrain` or by "
        "save_pretrained()."
    )
    if not directory.is_dir():
        raise EncoderError(f"model.encoder_path={path}: folder {directory} does not exist. {fix}")
    if not (directory / "config.json").is_file():
        raise EncoderError(f"model.encoder_path={path}: {directory} holds no config.json. {fix}")
    try:
        config = json.loads((directory / "config.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EncoderError(
            f"model.encoder_path={path}: {directory / 'config.json'} is not valid JSON ({exc}). "
            f"{fix}"
        ) from None
    if not isinstance(config, dict) or config.get("model_type") not in ENCODER_TYPES:
        kind = config.get("model_type") if isinstance(config, dict) else None
        raise EncoderError(
            f"model.encoder_path={path}: {directory / 'config.json'} has model_type {kind!r}; "
            f"fedac loads {', '.join(ENCODER_TYPES)} encoders. {fix}"
        )
    if not any((directory / name).is_file() for name in WEIGHT_FILES):
        raise EncoderError(
            f"model.encoder_path={path}: {directory} holds no weights "
            f"({' or '.join(WEIGHT_FILES)}). {fix}"
        )
    return directory


def load_encoder(path: str | Path, dropout: float | None = None) -> HFModule:
    """The bare encoder (Wav2Vec2Model / HubertModel) of a local checkpoint folder, never a hub
    download."""
    from transformers import HubertModel, Wav2Vec2Model
    from transformers.utils import logging as hf_logging

    directory = check_encoder_dir(path)
    # its load report lists the pretraining heads dropped on purpose
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model_type = json.loads((directory / "config.json").read_text())["model_type"]
    cls = Wav2Vec2Model if model_type == "wav2vec2" else HubertModel
    overrides = dict(FINETUNE)
    if dropout is not None:
        overrides.update(
            hidden_dropout=dropout, attention_dropout=dropout, feat_proj_dropout=dropout
        )
    try:
        return cls.from_pretrained(str(directory), local_files_only=True, **overrides)
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        raise EncoderError(
            f"model.encoder_path={path}: transformers cannot load {directory}: {exc}. "
            "Check that config.json and the weights come from the same save_pretrained call."
        ) from None


def resolve_encoder_path(name: str, encoder_path: str | None) -> str | Path | None:
    """The checkpoint folder `model.encoder_path` asks for, or None for random weights (module
    docstring)."""
    if encoder_path == RANDOM_INIT:
        return None
    if encoder_path:
        return encoder_path
    if name not in SHIPPED:
        return None
    folder = SHIPPED[name]
    if not (folder / SHIPPED_WEIGHTS).is_file():
        raise EncoderError(
            f"model.name={name}: the shipped pretrained encoder {folder / SHIPPED_WEIGHTS} is "
            "missing from this installation. Reinstall fedac, set model.encoder_path=DIR to your "
            f"own checkpoint, or model.encoder_path={RANDOM_INIT} for random weights."
        )
    return folder


def build_encoder(name: str, encoder_path: str | None, dropout: float = 0.1) -> HFModule:
    """The checkpoint `resolve_encoder_path` names (its config defines the size), else the named
    size with random weights drawn from the current torch RNG."""
    path = resolve_encoder_path(name, encoder_path)
    if path:
        return load_encoder(path, dropout)
    if name not in SIZES:
        raise EncoderError(f"unknown SSL model '{name}'. Known sizes: {', '.join(SIZES)}")
    from transformers import Wav2Vec2Model

    return Wav2Vec2Model(size_config(name, dropout))


#: Where a frozen encoder with random weights is drawn (model.peft with no pretrained checkpoint):
#: its weights never travel, so every model instance in every process must draw the same ones.
FROZEN_BASE_SEED = 0
PEFT_EXTRA = "pip install -e '.[peft]' (scripts/setup.sh installs it)"


def peft_config(options):
    """The peft config of `model.peft` (lora or ia3) with the module's default targets (settings/
    models.py `peft_targets`)."""
    try:
        import peft
    except ImportError:
        raise EncoderError(
            f"model.peft={options.peft} needs Hugging Face peft, fedac's `peft` extra: {PEFT_EXTRA}"
        ) from None
    if options.peft == "lora":
        return peft.LoraConfig(
            r=options.peft_rank,
            lora_alpha=options.peft_alpha,
            lora_dropout=options.peft_dropout,
            target_modules=list(options.peft_targets or ("q_proj", "v_proj")),
        )
    targets = list(options.peft_targets or ("k_proj", "v_proj", "output_dense"))
    # IA3 scales a feed-forward layer's input, an attention projection's output
    return peft.IA3Config(
        target_modules=targets,
        feedforward_modules=[t for t in targets if t in ("output_dense", "intermediate_dense")],
    )


def adapted_encoder(
    name: str, encoder_path: str | None, dropout: float, peft_options=None, freeze_cnn: bool = True
) -> HFModule:
    """`build_encoder` with the adapters of `peft_options.peft` injected (the `model` settings;
    None or peft none: the encoder as built; head: the encoder with every weight frozen and no
    adapter). A random frozen encoder is drawn from FROZEN_BASE_SEED, leaving the global RNG as it
    was."""
    method = getattr(peft_options, "peft", "none")
    if method == "none":
        return build_encoder(name, encoder_path, dropout)
    if not freeze_cnn:
        raise EncoderError(
            f"model.peft={method} freezes the whole encoder, its CNN included: "
            "model.freeze_cnn=false would run the frozen CNN at every step; leave it true"
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(FROZEN_BASE_SEED)
        backbone = build_encoder(name, encoder_path, dropout)
    if method == "head":  # no adapter: every encoder weight frozen, only the head(s) train
        return backbone.requires_grad_(False)
    config = peft_config(peft_options)
    import peft

    try:
        return peft.inject_adapter_in_model(config, backbone)
    except ValueError as exc:  # no module matches the targets
        raise EncoderError(
            f"model.peft_targets={peft_options.peft_targets}: {exc}. Name modules of the encoder's "
            "layers, e.g. q_proj, k_proj, v_proj, out_proj, intermediate_dense, output_dense"
        ) from None


def frame_lengths(config, samples: torch.Tensor) -> torch.Tensor:
    """CNN output frames for waveforms of `samples` samples (the conv stack without padding)."""
    frames = samples.clone()
    for kernel, stride in zip(config.conv_kernel, config.conv_stride):
        frames = torch.div(frames - kernel, stride, rounding_mode="floor") + 1
    return frames.clamp(min=0)


def cnn_fingerprint(cnn: nn.Module) -> str:
    """Hash of the CNN's weights: the key of its cached outputs."""
    digest = hashlib.sha256()
    for name, tensor in sorted(cnn.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().float().numpy().tobytes())
    return digest.hexdigest()[:24]


@torch.no_grad()
def cnn_frames(cnn: nn.Module, waveform: torch.Tensor) -> torch.Tensor:
    """(S,) or (B, S) equal-length waveforms -> (T, C) or (B, T, C) CNN features."""
    cnn.eval()
    batched = waveform.dim() == 2
    out = cnn(waveform if batched else waveform[None]).transpose(1, 2)
    return out if batched else out[0]


class EncoderRun:
    """`encoder.forward` of transformers' Wav2Vec2Encoder / ...StableLayerNorm / Hubert encoders,
    advanced layer by layer: `to(depth)` runs `encoder.layers` up to `depth`, continuing from where
    the previous call stopped, and returns the frames there (stable-layer-norm encoders end with
    their final LayerNorm). Evaluating every exit of a batch shallow to deep thus costs one encoder
    pass."""

    def __init__(self, encoder: HFModule, hidden: torch.Tensor, mask: torch.Tensor):
        from transformers.masking_utils import create_bidirectional_mask

        self.encoder, self.mask, self.depth = encoder, mask, 0
        hidden = hidden.masked_fill(~mask[..., None], 0.0)
        self.attention = create_bidirectional_mask(
            config=encoder.config, inputs_embeds=hidden, attention_mask=mask
        )
        hidden = hidden + encoder.pos_conv_embed(hidden)
        self.stable = bool(getattr(encoder.config, "do_stable_layer_norm", False))
        self.hidden = encoder.dropout(hidden if self.stable else encoder.layer_norm(hidden))

    def to(self, depth: int | None = None) -> torch.Tensor:
        depth = len(self.encoder.layers) if depth is None else depth
        if depth < self.depth:
            raise ValueError(
                f"the encoder already ran {self.depth} layers; it cannot stop at {depth}"
            )
        for layer in self.encoder.layers[self.depth : depth]:
            self.hidden = layer(self.hidden, attention_mask=self.attention)
        self.depth = depth
        return self.encoder.layer_norm(self.hidden) if self.stable else self.hidden


def encoder_layers(
    encoder: HFModule, hidden: torch.Tensor, mask: torch.Tensor, depth: int | None = None
) -> torch.Tensor:
    """The encoder's forward pass running only `encoder.layers[:depth]` (None: all)."""
    return EncoderRun(encoder, hidden, mask).to(depth)


def stats_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[mean; std] over the valid frames: (N, T, H) -> (N, 2H)."""
    weight = mask[..., None].to(hidden.dtype)
    count = weight.sum(1).clamp(min=1.0)
    mean = (hidden * weight).sum(1) / count
    var = (((hidden - mean[:, None]) ** 2) * weight).sum(1) / count
    return torch.cat([mean, (var + 1e-5).sqrt()], dim=-1)


class PooledNorm(nn.BatchNorm1d):
    """`model.head_norm`: a BatchNorm1d over the pooled vector, each dimension standardised before
    the linear head. A training batch of one clip (a client's last, short batch) is normalised with
    the running statistics instead of failing as BatchNorm1d does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and x.shape[0] == 1:
            return nn.functional.batch_norm(
                x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps
            )
        return super().forward(x)


class SSLModel(nn.Module):
    """An SSL encoder (without its CNN when frozen) and one task head. See the module docstring."""

    def __init__(
        self,
        backbone: HFModule,
        kind: str,
        num_classes: int,
        freeze_cnn: bool = True,
        depth: int = 0,
        ctc_hidden: int = 0,
        head_norm: bool = False,
    ):
        super().__init__()
        if kind not in KINDS:
            raise EncoderError(f"SSL models have heads for {', '.join(KINDS)} tasks, not {kind!r}")
        self.kind = kind
        self.config = backbone.config
        layers = len(backbone.encoder.layers)
        if not 0 <= depth <= layers:
            raise EncoderError(
                f"model.encoder_depth={depth} must lie in 0..{layers} (0 = all {layers} layers)"
            )
        self.depth = depth or layers
        self.cnn = None if freeze_cnn else backbone.feature_extractor
        self.projection = backbone.feature_projection
        self.encoder = backbone.encoder
        hidden = self.config.hidden_size
        if kind == "ctc":
            width = ctc_hidden or hidden
            self.lstm = nn.LSTM(hidden, width, num_layers=2, bidirectional=True, batch_first=True)
            self.head = nn.Linear(2 * width, num_classes)
        else:
            self.head = nn.Linear(2 * hidden, num_classes)
        if head_norm and kind == "ctc":
            raise EncoderError(
                "model.head_norm standardises the pooled vector of classification heads; "
                "a CTC head has none (leave model.head_norm=false for ASR)"
            )
        self.norm = PooledNorm(2 * hidden) if head_norm else nn.Identity()
        #: The encoder weights the backbone arrived with frozen (model.peft): out of the state dict.
        self.frozen = frozenset(n for n, p in self.named_parameters() if not p.requires_grad)
        if self.frozen:
            self.register_state_dict_post_hook(_drop_frozen)
            self.register_load_state_dict_post_hook(_frozen_not_missing)

    def frames(self, x: Padded) -> tuple[torch.Tensor, torch.Tensor]:
        """Transformer input (N, T, H) and its frame mask (N, T)."""
        if self.cnn is not None:  # waveforms (N, S)
            feats = self.cnn(x.values.float()).transpose(1, 2)
            lengths = frame_lengths(self.config, x.lengths)
        else:  # cached CNN frames (N, T, C)
            feats, lengths = x.values.float(), x.lengths
        mask = torch.arange(feats.shape[1], device=feats.device) < lengths[:, None]
        hidden = self.projection(feats)
        # wav2vec2 also returns the normed input
        hidden = hidden[0] if isinstance(hidden, tuple) else hidden
        return hidden, mask

    def hidden(self, x: Padded, depth: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, mask = self.frames(x)
        return encoder_layers(self.encoder, hidden, mask, depth or self.depth), mask

    def embed(self, x: Padded) -> torch.Tensor:
        """The pooled utterance vector (N, 2H) of a classification model (speaker embeddings for
        ASV)."""
        return stats_pool(*self.hidden(x))

    def _ctc_log_probs(self, x: Padded) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, mask = self.hidden(x)
        lengths = mask.sum(1)
        packed = nn.utils.rnn.pack_padded_sequence(
            hidden, lengths.clamp(min=1), batch_first=True, enforce_sorted=False
        )
        out, _ = self.lstm(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(
            out, batch_first=True, total_length=hidden.shape[1]
        )
        return self.head(out).log_softmax(-1), lengths

    def forward(self, x: Padded) -> torch.Tensor:
        """Class logits (N, C), or per-frame CTC log-probabilities (N, T, V)."""
        if self.kind == "ctc":
            return self._ctc_log_probs(x)[0]
        return self.classify(self.embed(x))

    def classify(self, h: torch.Tensor) -> torch.Tensor:
        """Class logits of pooled vectors (`embed`), the head norm included
        (models/base.py `classify`)."""
        return self.head(self.norm(h))

    def task_loss(self, x: Padded, y) -> torch.Tensor:
        """Cross-entropy on labels, or the batch-mean CTC loss on `Padded` character targets."""
        if self.kind != "ctc":
            return nn.functional.cross_entropy(self(x), y)
        log_probs, lengths = self._ctc_log_probs(x)
        # zero_infinity: a target longer than its frames has no alignment; it adds no gradient
        # instead of an infinite loss.
        return nn.functional.ctc_loss(
            log_probs.transpose(0, 1),
            y.values,
            lengths,
            y.lengths,
            blank=0,
            reduction="mean",
            zero_infinity=True,
        )

    @torch.no_grad()
    def transcribe(self, x: Padded) -> list[str]:
        """Greedy CTC decoding of each utterance's valid frames."""
        log_probs, lengths = self._ctc_log_probs(x)
        best = log_probs.argmax(-1)
        return [greedy_ctc(best[i, : int(n)].tolist()) for i, n in enumerate(lengths)]


def _drop_frozen(model: SSLModel, state: dict, prefix: str, _metadata) -> None:
    for name in model.frozen:
        state.pop(prefix + name, None)


def _frozen_not_missing(model: SSLModel, incompatible) -> None:
    # (in place: torch's strict check reads the list after the hooks)
    incompatible.missing_keys[:] = [k for k in incompatible.missing_keys if k not in model.frozen]


def build_ssl_model(
    name: str,
    kind: str,
    num_classes: int,
    encoder_path: str | None = None,
    freeze_cnn: bool = True,
    depth: int = 0,
    ctc_hidden: int = 0,
    dropout: float = 0.1,
    head_norm: bool = False,
    peft_options=None,
) -> SSLModel:
    """`peft_options`: the `model` settings whose peft* fields add adapters (`adapted_encoder`)."""
    return SSLModel(
        adapted_encoder(name, encoder_path, dropout, peft_options, freeze_cnn),
        kind,
        num_classes,
        freeze_cnn,
        depth,
        ctc_hidden,
        head_norm,
    )


def measure_counts(name: str) -> dict[str, int]:
    """What `fedac models` shows of SSL size `name`, measured on a real build (random weights, one
    class): the parameters of the model a client holds without its head (`params`: projection and
    transformer; the frozen CNN runs once per clip when the data is built and is no part of it),
    the CNN's own parameters (`cnn`), the forward FLOPs of one 1 s clip (49 CNN frames) without
    the head (`flops`, torch's FlopCounterMode) and each model.peft method's trainable parameters
    without the head (`lora`, `ia3`; `head`: none). ssl_sizes.COUNTS holds them for every size
    (tests/models/test_ssl_counts.py checks it against this)."""
    from torch.utils.flop_counter import FlopCounterMode

    from fedac.config import ModelConfig

    def build(peft: str = "none") -> SSLModel:
        options = ModelConfig(name=name, encoder_path=RANDOM_INIT, peft=peft)
        return build_ssl_model(name, "classification", 1, RANDOM_INIT, peft_options=options)

    def without_head(model: SSLModel, trainable: bool) -> int:
        return sum(
            p.numel()
            for n, p in model.named_parameters()
            if not n.startswith("head.") and (not trainable or n not in model.frozen)
        )

    model = build().eval()
    frames = Padded(torch.zeros(1, 49, SIZES[name].conv), torch.tensor([49]))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(frames)
    hidden = SIZES[name].hidden
    out = {
        "params": without_head(model, False),
        "cnn": sum(
            p.numel() for p in build_encoder(name, RANDOM_INIT).feature_extractor.parameters()
        ),
        "flops": int(counter.get_total_flops()) - 2 * 2 * hidden,
    }
    for method in ("lora", "ia3"):
        out[method] = without_head(build(method), True)
    return out
