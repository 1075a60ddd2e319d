"""The four keyword-spotting networks of models/kws.py (DSCNN, MHAttRNN, ResNet15, KWT), and their
FedKWS-UI two-head form, written out for K clients at once, as models/stacked.py writes the CRNNs:
every client's parameters are one tensor with a leading client axis, and each layer is one call for
the whole stack instead of `torch.func.vmap` over a per-client module.

How each layer runs:
- convolutions: one grouped convolution over clients x channels. Activations are laid out (B, K * C,
  H, W), client-major channels, so a client's convolution is group k of `F.conv2d(groups=K)` and a
  depthwise one is `groups=K*C`; the weights are the stacked (K, C_out, C_in, kh, kw) tensor viewed
  as (K * C_out, C_in, kh, kw), no copy.
- pointwise (1x1) convolutions and linear layers: batched matrix products over the clients
  (`torch.matmul` / `baddbmm` with a (K, in, out) weight).
- BatchNorm: per client, exactly as the client's own `nn.BatchNorm2d` in training mode: batch
  statistics over its (B, H, W) for each of its channels (in the (B, K * C, H, W) layout a client's
  channel is one channel of `F.batch_norm`, so the op is the per-client module's own), its running
  mean and variance (the (K, C) buffers viewed flat) updated in place with the module's momentum
  and unbiased variance, and its batch count incremented. On a step that pads short clients (sample
  weight 0, training/stacking.py) the statistics are taken over each client's real samples only, as
  training/functional.py's masked BatchNorm does under vmap.
- MHAttRNN's Bi-GRU: models/stacked.py's `_GRULayer` (input projection plus the recurrence, the
  fused kernel of fedac/kernels where built, hand-written BPTT), layer by layer; its attention is
  the four heads as one batched product.
- KWT: patches as one unfold and a batched matmul; each encoder layer's attention batched over
  clients x batch with `F.scaled_dot_product_attention` (nn.MultiheadAttention's math: q / sqrt(d)
  k^T, softmax, v), LayerNorm per client (`F.layer_norm` then the client's affine), GELU
  feed-forward as batched matmuls; post-norm as `nn.TransformerEncoderLayer(norm_first=False)`.

The results equal the per-client modules' to float rounding (sums in another order),
tests/models/test_kws_stacked.py: forward, gradients and running statistics per network, on both the
plain and the two-head model, and a 2-round FedKWS-UI run against the sequential path. No layer of
these networks draws random numbers (no dropout), so the caller's dropout masks are never asked for.

`stacked_kws(model)` recognises a zoo KWS network or a model that wraps one as `encoder` with
FedKWS-UI's two heads (`global_proj`, `global_head`, `private_proj`, `private_head`) and returns its
stacked form, else None. The form serves the methods the stacked training loops call
(`forward`, `embed`, `head`, `global_logits`, `private_logits`); it always runs in training mode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from fedac.errors import ConfigError
from fedac.models.kws import DSCNN, KWT, KWSNet, MHAttRNN, ResBlock, ResNet15
from fedac.models.stacked import _GRULayer

Params = dict[str, torch.Tensor]
TWO_HEADS = ("global_proj", "global_head", "private_proj", "private_head")


class _Ctx:
    """One stacked forward's inputs beside the activations: the clients' entries, the sample
    weights (K, B) and whether the step pads (BatchNorm then masks)."""

    def __init__(self, params: Params, prefix: str, weight: torch.Tensor | None):
        self.params, self.prefix = params, prefix
        self.padded = weight is not None and bool((weight == 0).any())
        self.real = (weight > 0).to(torch.float32) if self.padded and weight is not None else None

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.params[self.prefix + name]

    def get(self, name: str) -> torch.Tensor | None:
        return self.params.get(self.prefix + name)


# --- layers on the (B, K * C, H, W) layout --------------------------------------------------------
def conv(h: torch.Tensor, ctx: _Ctx, name: str, depthwise: bool = False, **kwargs) -> torch.Tensor:
    """Every client's own Conv2d `name` as one grouped convolution."""
    weight = ctx[f"{name}.weight"]
    k = weight.shape[0]
    flat = weight.reshape(-1, *weight.shape[2:])
    bias = ctx.get(f"{name}.bias")
    groups = flat.shape[0] if depthwise else k
    return F.conv2d(h, flat, None if bias is None else bias.reshape(-1), groups=groups, **kwargs)


def pointwise(h: torch.Tensor, ctx: _Ctx, name: str) -> torch.Tensor:
    """A 1x1 convolution per client as a batched matmul: (B, K * C, H, W) -> (B, K * C_out, H, W),
    each client's (C_out, C) weight broadcast over the batch. (Laying the activations out as (K, C,
    B H W) for one large GEMM a client was measured too: the two copies cost more than it saved.)"""
    weight = ctx[f"{name}.weight"]  # (K, C_out, C_in, 1, 1)
    k, c_out, c_in = weight.shape[:3]
    b, _, height, width = h.shape
    x = h.reshape(b, k, c_in, height * width)
    out = torch.matmul(weight.reshape(1, k, c_out, c_in), x)  # (B, K, C_out, H W)
    bias = ctx.get(f"{name}.bias")
    if bias is not None:
        out = out + bias.reshape(1, k, c_out, 1)
    return out.reshape(b, k * c_out, height, width)


def batch_norm(h: torch.Tensor, ctx: _Ctx, name: str, momentum: float, eps: float) -> torch.Tensor:
    """Each client's BatchNorm2d `name` in training mode (see the module docstring)."""
    mean, var = ctx[f"{name}.running_mean"], ctx[f"{name}.running_var"]
    weight, bias = ctx.get(f"{name}.weight"), ctx.get(f"{name}.bias")
    flat_w = None if weight is None else weight.reshape(-1)
    flat_b = None if bias is None else bias.reshape(-1)
    ctx[f"{name}.num_batches_tracked"].add_(1)
    if ctx.real is None:
        # (K, C) buffers viewed flat: F.batch_norm updates the clients' rows in place
        return F.batch_norm(h, mean.view(-1), var.view(-1), flat_w, flat_b, True, momentum, eps)
    return _masked_batch_norm(h, ctx.real, mean, var, flat_w, flat_b, momentum, eps)


def _masked_batch_norm(h, real, running_mean, running_var, weight, bias, momentum, eps):
    """Batch norm with each client's statistics over its real samples only (`real` (K, B): 1 for a
    sample, 0 for padding)."""
    b, channels = h.shape[:2]
    k = real.shape[0]
    mask = real.t().repeat_interleave(channels // k, dim=1).view(b, channels, 1, 1).to(h.dtype)
    count = mask.sum((0, 2, 3)) * h.shape[2] * h.shape[3]  # (K * C,)
    mean = (h * mask).sum((0, 2, 3)) / count
    centred = h - mean.view(1, -1, 1, 1)
    var = (centred.pow(2) * mask).sum((0, 2, 3)) / count
    with torch.no_grad():
        running_mean.view(-1).mul_(1 - momentum).add_(mean.detach() * momentum)
        unbiased = var.detach() * (count / (count - 1))
        running_var.view(-1).mul_(1 - momentum).add_(unbiased * momentum)
    out = centred * torch.rsqrt(var + eps).view(1, -1, 1, 1)
    if weight is not None:
        out = out * weight.view(1, -1, 1, 1) + bias.view(1, -1, 1, 1)
    return out


def matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """(K, ..., in) times each client's (K, out, in...) weight (trailing dims flattened), plus its
    (K, out) bias: one batched matmul."""
    k, out = weight.shape[:2]
    w = weight.reshape(k, out, -1).transpose(1, 2)
    rows = x.reshape(k, -1, x.shape[-1])
    y = torch.bmm(rows, w) if bias is None else torch.baddbmm(bias.unsqueeze(1), rows, w)
    return y.view(*x.shape[:-1], out)


def linear(x: torch.Tensor, ctx: _Ctx, name: str) -> torch.Tensor:
    """Every client's Linear `name` on (K, ..., in) -> (K, ..., out)."""
    return matmul(x, ctx[f"{name}.weight"], ctx.get(f"{name}.bias"))


def _image(x: torch.Tensor) -> torch.Tensor:
    """(K, B, features, frames) -> (B, K, frames, features): each client's one-channel image."""
    return x.permute(1, 0, 3, 2).contiguous()


def _pooled(h: torch.Tensor, k: int) -> torch.Tensor:
    """(B, K * C, H, W) -> (K, B, C): the global average pool of each client's channels."""
    b = h.shape[0]
    return h.mean(dim=(2, 3)).view(b, k, -1).transpose(0, 1)


# --- the four encoders: (ctx, x (K, B, F, T)) -> (K, B, embedding) --------------------------------
def _bn_args(module: nn.Module, name: str) -> tuple[str, float, float]:
    bn = module.get_submodule(name)
    assert isinstance(bn, nn.BatchNorm2d)
    if bn.momentum is None or not bn.track_running_stats:
        raise ConfigError("the stacked KWS forms need BatchNorm with momentum and running stats")
    return name, float(bn.momentum), float(bn.eps)


def dscnn_embed(net: DSCNN) -> Callable[[_Ctx, torch.Tensor], torch.Tensor]:
    first = net.cnn[0]
    assert isinstance(first, nn.Conv2d)
    stride = first.stride
    blocks = (len(net.cnn) - 3) // 4
    bns = [_bn_args(net, f"cnn.{1 + 4 * i}") for i in range(blocks + 1)]

    def embed(ctx: _Ctx, x: torch.Tensor) -> torch.Tensor:
        k = x.shape[0]
        h = F.relu(batch_norm(conv(_image(x), ctx, "cnn.0", stride=stride), ctx, *bns[0]))
        for i in range(blocks):
            base = 3 + 4 * i
            h = conv(h, ctx, f"cnn.{base}", depthwise=True, padding=1)
            h = F.relu(batch_norm(pointwise(h, ctx, f"cnn.{base + 1}"), ctx, *bns[i + 1]))
        return _pooled(h, k)

    return embed


def resnet15_embed(net: ResNet15) -> Callable[[_Ctx, torch.Tensor], torch.Tensor]:
    blocks = [cast(ResBlock, block) for block in net.blocks]
    dilations = [(int(b.conv1.dilation[0]), int(b.conv2.dilation[0])) for b in blocks]
    last = int(net.last_conv.dilation[0])
    bn0 = _bn_args(net, "bn0")
    bns = [
        (_bn_args(net, f"blocks.{i}.bn1"), _bn_args(net, f"blocks.{i}.bn2"))
        for i in range(len(dilations))
    ]

    def embed(ctx: _Ctx, x: torch.Tensor) -> torch.Tensor:
        k = x.shape[0]
        h = F.relu(batch_norm(conv(_image(x), ctx, "conv0", padding=1), ctx, *bn0))
        for i, (d0, d1) in enumerate(dilations):
            y = conv(h, ctx, f"blocks.{i}.conv1", padding=d0, dilation=d0)
            y = F.relu(batch_norm(y, ctx, *bns[i][0]))
            y = batch_norm(
                conv(y, ctx, f"blocks.{i}.conv2", padding=d1, dilation=d1), ctx, *bns[i][1]
            )
            h = F.relu(y + h)
        return _pooled(conv(h, ctx, "last_conv", padding=last, dilation=last), k)

    return embed


def _gru(ctx: _Ctx, out: torch.Tensor, layers: int, directions: list[str]) -> torch.Tensor:
    """A stacked multi-layer (Bi-)GRU: (K, T, B, C) -> (K, T, B, H * directions), each layer's
    directions through models/stacked.py's `_GRULayer`."""
    k, t_len, b = out.shape[:3]
    for layer in range(layers):
        frames = out.reshape(k, t_len * b, out.shape[-1])
        outs = [
            _GRULayer.apply(
                frames,
                *(
                    ctx[f"rnn.{kind}_l{layer}{suffix}"]
                    for kind in ("weight_ih", "bias_ih", "weight_hh", "bias_hh")
                ),
                t_len,
                bool(suffix),
            )
            for suffix in directions
        ]
        out = torch.cat(outs, dim=3) if len(outs) > 1 else outs[0]
    return out


def mhattrnn_embed(net: MHAttRNN) -> Callable[[_Ctx, torch.Tensor], torch.Tensor]:
    bn1, bn2 = _bn_args(net, "cnn.1"), _bn_args(net, "cnn.4")
    layers, bidirectional = net.rnn.num_layers, net.rnn.bidirectional
    heads = len(net.keys)
    directions = ["", "_reverse"] if bidirectional else [""]

    def embed(ctx: _Ctx, x: torch.Tensor) -> torch.Tensor:
        k, b = x.shape[:2]
        h = F.relu(batch_norm(conv(_image(x), ctx, "cnn.0"), ctx, *bn1))
        h = F.relu(batch_norm(conv(h, ctx, "cnn.3"), ctx, *bn2))  # (B, K, T, F)
        t_len = h.shape[2]
        out = h.permute(1, 2, 0, 3)  # (K, T, B, F): time-major rows
        with torch.autocast(x.device.type, enabled=False):  # the GRU layer is written for fp32
            out = _gru(ctx, out if out.dtype == torch.float64 else out.float(), layers, directions)
        keys = torch.cat([ctx[f"keys.{i}.weight"] for i in range(heads)], 1)  # (K, heads * d, W)
        queries = torch.cat([ctx[f"queries.{i}.weight"] for i in range(heads)], 1)
        key = torch.bmm(out.reshape(k, t_len * b, -1), keys.transpose(1, 2))
        key = key.view(k, t_len, b, heads, -1)
        query = torch.bmm(out[:, t_len // 2], queries.transpose(1, 2)).view(k, b, heads, -1)
        attention = torch.einsum("ktbhd,kbhd->kbht", key, query).softmax(dim=3)
        return torch.einsum("kbht,ktbhd->kbhd", attention, key).reshape(k, b, -1)

    return embed


def kwt_embed(net: KWT) -> Callable[[_Ctx, torch.Tensor], torch.Tensor]:
    patch, stride = net.patch.kernel_size, net.patch.stride
    layers = list(net.encoder.layers)
    for layer in layers:
        if layer.norm_first or layer.activation_relu_or_gelu != 2:
            raise ConfigError("the stacked KWT is written for post-norm GELU encoder layers")
    heads = layers[0].self_attn.num_heads
    eps = [(float(lay.norm1.eps), float(lay.norm2.eps)) for lay in layers]

    def norm(h: torch.Tensor, ctx: _Ctx, name: str, eps_: float) -> torch.Tensor:
        k = h.shape[0]
        shape = (k, *[1] * (h.dim() - 2), h.shape[-1])
        out = F.layer_norm(h, h.shape[-1:], eps=eps_)
        return torch.addcmul(
            ctx[f"{name}.bias"].view(shape), out, ctx[f"{name}.weight"].view(shape)
        )

    def attention(h: torch.Tensor, ctx: _Ctx, name: str) -> torch.Tensor:
        k, b, length, dim = h.shape
        qkv = matmul(h, ctx[f"{name}.in_proj_weight"], ctx[f"{name}.in_proj_bias"])  # (.., 3 D)
        qkv = qkv.view(k * b, length, 3, heads, dim // heads).permute(2, 0, 3, 1, 4)
        mixed = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])  # (K B, heads, L, d)
        mixed = mixed.transpose(1, 2).reshape(k, b, length, dim)
        return linear(mixed, ctx, f"{name}.out_proj")

    def embed(ctx: _Ctx, x: torch.Tensor) -> torch.Tensor:
        k, b = x.shape[:2]
        if (x.shape[3], x.shape[2]) != (net.frames, net.num_features):
            raise ConfigError(
                f"kwt was built for {net.frames} frames x {net.num_features} features, got "
                f"{x.shape[3]} x {x.shape[2]}"
            )
        image = x.transpose(2, 3).reshape(k * b, 1, x.shape[3], x.shape[2])
        cols = F.unfold(image, patch, stride=stride)  # (K B, patch area, tokens)
        cols = cols.view(k, b, cols.shape[1], -1).transpose(2, 3)  # (K, B, tokens, area)
        tokens = linear(cols, ctx, "patch")  # the conv without bias: weight (K, D, 1, p, p)
        cls = ctx["cls_embedding"].expand(k, b, 1, -1)  # (K, 1, 1, D) per client
        h = torch.cat([cls, tokens], dim=2) + ctx["pos_embedding"]
        for i, (eps1, eps2) in enumerate(eps):
            name = f"encoder.layers.{i}"
            h = norm(h + attention(h, ctx, f"{name}.self_attn"), ctx, f"{name}.norm1", eps1)
            ff = linear(F.gelu(linear(h, ctx, f"{name}.linear1")), ctx, f"{name}.linear2")
            h = norm(h + ff, ctx, f"{name}.norm2", eps2)
        return h[:, :, 0]

    return embed


_EMBEDS: dict[type, Callable] = {
    DSCNN: dscnn_embed,
    ResNet15: resnet15_embed,
    MHAttRNN: mhattrnn_embed,
    KWT: kwt_embed,
}


class StackedKWS:
    """The stacked training-mode forward of a KWS network (or its two-head wrapper) for K clients:
    `form(state, x, masks, weight, method)` with `state` the (K, ...) parameters and buffers
    (BatchNorm's running statistics updated in place), `x` (K, B, features, frames), `weight`
    (K, B) the sample weights (0 on padding). The interface of training/functional.py's
    `StackedModule.__call__`."""

    def __init__(self, model: nn.Module, network: KWSNet, prefix: str, two_heads: bool):
        self.param_names = [name for name, _ in model.named_parameters()]
        self.buffer_names = [name for name, _ in model.named_buffers()]
        self.name = type(network).__name__
        self.prefix, self.two_heads = prefix, two_heads
        self._embed = _EMBEDS[type(network)](network)

    def __call__(
        self,
        state: Params,
        x: torch.Tensor,
        masks=None,
        weight: torch.Tensor | None = None,
        method: str = "forward",
        padded: bool | None = None,
    ) -> torch.Tensor:
        # under the caller's autocast (runtime.precision) as the per-client module runs, but
        # MHAttRNN's GRU, whose hand-written backward is fp32 (as the CRNN's)
        x = x if x.dtype == torch.float64 else x.float()
        if method == "embed":
            return self.embed(state, x, weight)
        if method == "forward":
            return self.head(state, self.embed(state, x, weight))
        if method == "head" and not self.two_heads:
            return self.head(state, x)
        if method in ("global_logits", "private_logits") and self.two_heads:
            return self._two_head(state, x, method.split("_")[0])
        raise ConfigError(
            f"the stacked {self.name} has no method {method!r}: set runtime.execution=sequential"
        )

    def embed(self, state: Params, x: torch.Tensor, weight: torch.Tensor | None = None):
        """(K, B, embedding_dim): each client's `embed`, BatchNorm in training mode."""
        return self._embed(_Ctx(state, self.prefix, weight), x)

    def head(self, state: Params, z: torch.Tensor) -> torch.Tensor:
        """(K, B, classes): the classifier (the two-head model's global one)."""
        if self.two_heads:
            return self._two_head(state, z, "global")
        return linear(z, _Ctx(state, "", None), "head")

    def _two_head(self, state: Params, z: torch.Tensor, which: str) -> torch.Tensor:
        ctx = _Ctx(state, "", None)
        return linear(F.relu(linear(z, ctx, f"{which}_proj")), ctx, f"{which}_head")

    def map(self, *args, **kwargs):
        raise ConfigError(
            f"the stacked {self.name} serves the training loops' forward calls, not a local "
            "objective's map: such methods train it through vmap"
        )


def stacked_kws(model: nn.Module) -> StackedKWS | None:
    """The hand-written stacked form of `model` (a zoo KWS network, or FedKWS-UI's two-head model
    around one: an `encoder` plus `global_proj`, `global_head`, `private_proj`, `private_head`),
    or None."""
    if type(model) in _EMBEDS:
        return StackedKWS(model, model, "", False)  # type: ignore[arg-type]
    encoder = getattr(model, "encoder", None)
    if type(encoder) in _EMBEDS and all(hasattr(model, name) for name in TWO_HEADS):
        if any(n.startswith("encoder.head.") for n, _ in model.named_parameters()):
            return None  # the wrapper replaces the network's own head
        return StackedKWS(model, encoder, "encoder.", True)  # type: ignore[arg-type]
    return None
