"""K same-architecture models as one stacked computation: the forward pass of the CRNN zoo written
as a function of parameters stacked along a leading client axis (`stack_params`), for cohort
training.

Why not `torch.func` (stack_module_state + functional_call + vmap(grad)): its dropout cannot replay
the masks a client draws when it trains alone (so the stacked path would not give the sequential
numbers), and it is slower: one SGD step of 10 clients took about 0.8x the time of a per-client
loop, against about 0.6x for this module (benchmarks/README.md, part `vmap`).
This module therefore writes the CRNN out once more, the same function as `models/crnn.py` (equal to
float rounding: convolutions are matmuls here, the GRU follows torch's CPU GRU step for step), with
the GRU as batched matmuls over clients (forward and a hand-written backward) and dropout masks
supplied by the caller. `tests/training/test_cohort.py` checks it against `nn.Module` outputs and
gradients.

Layouts: inputs (K, B, features, frames); logits (K, B, classes); activations channels-last (K, B,
T, C). Every op runs once for the whole stack: convolutions as one batched im2col matmul
(`_Conv1d`), ReLU + pooling, dropout, the GRU (its recurrence fused in fedac/kernels when built),
the head.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from fedac.kernels import recurrence_kernel
from fedac.models.crnn import CRNN_SPECS, CRNNSpec

Params = dict[str, torch.Tensor]
MaskFn = Callable[[tuple[int, ...], float], "torch.Tensor | None"]
"""Called once per dropout layer, in forward order, with the per-client activation shape (C, T) and
the dropout probability; returns a (K, B, C, T) multiplier (already scaled by 1 / (1 - p)) or
None."""


def stack_params(states: Sequence[Params]) -> Params:
    """[client state dicts] -> one dict of (K, ...) tensors (the analogue of
    torch.func.stack_module_state)."""
    return {name: torch.stack([s[name] for s in states]) for name in states[0]}


def unstack_params(stacked: Params, count: int) -> list[Params]:
    """(K, ...) tensors -> K independent state dicts (clones, so no client pins the cohort's
    storage)."""
    return [{name: value[k].clone() for name, value in stacked.items()} for k in range(count)]


# fused grad * (1 - y^2) and grad * y * (1 - y), written into a given buffer (the ops autograd
# itself uses)
_tanh_backward = torch.ops.aten.tanh_backward.grad_input
_sigmoid_backward = torch.ops.aten.sigmoid_backward.grad_input


def _recurrence_forward(gi, w_t, b_hh, reverse: bool):
    """The pure-torch recurrence (the reference for, and fallback of, kernels/gru.cpp's `forward`).

    gi (K, T, B, 3H): input gates; w_t (K, H, 3H) = W_hh^T; returns out (K, T, B, H) hidden states,
    gates (T, K, B, 3H) holding the activated r, z and W_hh h + b_hh's n part, and news (K, T, B,
    H).
    """
    k, t_len, b, h3 = gi.shape
    hidden = h3 // 3
    out = gi.new_empty(k, t_len, b, hidden)
    gates = gi.new_empty(t_len, k, b, h3)  # per step: r, z (activated) and g_n
    news = gi.new_empty(k, t_len, b, hidden)
    bias = b_hh.unsqueeze(1)
    h = gi.new_zeros(k, b, hidden)
    for step in range(t_len - 1, -1, -1) if reverse else range(t_len):
        g, i = gates[step], gi[:, step]
        torch.baddbmm(bias, h, w_t, out=g)
        rz = g[..., : 2 * hidden]
        rz.add_(i[..., : 2 * hidden]).sigmoid_()
        n = news[:, step]
        torch.mul(g[..., 2 * hidden :], rz[..., :hidden], out=n)
        n.add_(i[..., 2 * hidden :]).tanh_()
        h_new = out[:, step]
        torch.sub(h, n, out=h_new)
        h_new.mul_(rz[..., hidden:]).add_(n)
        h = h_new
    return out, gates, news


def _recurrence_backward(grad_out, out, gates, news, w_hh, reverse: bool):
    """Backpropagation through `_recurrence_forward` (the reference for kernels/gru.cpp's
    `backward`): returns grad_gates (K, T, B, 3H), the gradient of W_hh h + b_hh, and grad_n (K, T,
    B, H), that of the input gate of n (the input gates of r and z share grad_gates')."""
    k, t_len, b, hidden = out.shape
    h2 = 2 * hidden
    grad_gates = out.new_empty(k, t_len, b, 3 * hidden)
    grad_n = torch.empty_like(news)
    zeros = out.new_zeros(k, b, hidden)
    dh = zeros
    for step in range(t_len) if reverse else range(t_len - 1, -1, -1):
        prev = step + 1 if reverse else step - 1
        h_prev = out[:, prev] if 0 <= prev < t_len else zeros
        dh = dh + grad_out[:, step]
        g, n = gates[step], news[:, step]
        r, z, g_n = g[..., :hidden], g[..., hidden:h2], g[..., h2:]
        dg, da_n = grad_gates[:, step], grad_n[:, step]
        # h' = (h - n) z + n:  dz = dh (h - n),  dn = dh (1 - z)
        # n = tanh(a_n):  da_n = dn (1 - n^2)
        _tanh_backward(dh * (1 - z), n, grad_input=da_n)
        torch.mul(da_n, r, out=dg[..., h2:])  # a_n = i_n + r g_n
        # r = sigmoid(r_pre): dr (r (1 - r))
        _sigmoid_backward(da_n * g_n, r, grad_input=dg[..., :hidden])
        _sigmoid_backward(dh * (h_prev - n), z, grad_input=dg[..., hidden:h2])
        dh = torch.bmm(dg, w_hh).addcmul_(dh, z)
    return grad_gates, grad_n


def _recurrence(device: torch.device, dtype: torch.dtype = torch.float32):
    """(forward, backward) of the recurrence: the kernel `runtime.gru_kernel` picks for this device
    (fedac/ kernels: the fused C++ one on the CPU, the Triton one on a GPU), else torch's (the
    reference, and the one for float64 tensors: the kernels are float32)."""
    kernel = recurrence_kernel(device.type) if dtype == torch.float32 else None
    if kernel is None:
        return _recurrence_forward, _recurrence_backward
    return kernel.forward, kernel.backward


class _GRULayer(torch.autograd.Function):
    """One GRU direction for K clients at once, input projection included, with hand-written BPTT.

    Forward, per step, exactly torch's CPU GRU (input gates for all steps first, then `gru_cell`,
    the same operations in the same order, so the pure-torch recurrence's outputs are bit-identical
    to nn.GRU's; the fused kernels do the same math per element and equal it to float rounding per
    step, not bit for bit, so a long run's metrics move slightly with `runtime.gru_kernel`:
    fedac/kernels):
        i = W_ih x + b_ih;  g = W_hh h + b_hh;  r = sigmoid(g_r + i_r);  z = sigmoid(g_z + i_z)
        n = tanh(i_n + r * g_n);  h' = (h - n) * z + n
    Backward: the chain rule through those equations step by step; the weight gradients (W_hh, W_ih)
    are each one batched matmul over all steps (contraction over T * B rows) instead of one small
    matmul per step as autograd would do. Hidden states and gradients are laid out (K, T, B, .), so
    the all-steps matrices of the weight gradients are views; the gates are (T, K, B, 3H) because a
    batched matmul writing into a non-contiguous `out` falls back to one small matmul per client.
    """

    @staticmethod
    def forward(ctx, frames, w_ih, b_ih, w_hh, b_hh, t_len: int, reverse: bool):
        # frames: (K, T * B, C), rows time-major; returns (K, T, B, H) hidden states in time order
        k, rows, _ = frames.shape
        b, hidden = rows // t_len, w_hh.shape[2]
        gi = torch.baddbmm(b_ih.unsqueeze(1), frames, w_ih.transpose(1, 2)).view(
            k, t_len, b, 3 * hidden
        )
        forward, ctx.recur_backward = _recurrence(frames.device, frames.dtype)
        out, gates, news = forward(
            gi, w_hh.transpose(1, 2).contiguous(), b_hh.contiguous(), reverse
        )
        ctx.save_for_backward(frames, w_ih, w_hh, out, gates, news)
        ctx.reverse = reverse
        return out

    @staticmethod
    def backward(ctx, grad_out):
        frames, w_ih, w_hh, out, gates, news = ctx.saved_tensors
        k, t_len, b, hidden = out.shape
        h2 = 2 * hidden
        grad_gates, grad_n = ctx.recur_backward(
            grad_out.contiguous(), out, gates, news, w_hh.contiguous(), ctx.reverse
        )
        rows = t_len * b
        flat_g, flat_n = grad_gates.view(k, rows, 3 * hidden), grad_n.view(k, rows, hidden)
        # W_hh: every step that had a previous hidden state (the first step's was zero)
        later, earlier = slice(1, t_len), slice(0, t_len - 1)
        if ctx.reverse:
            later, earlier = earlier, later
        g_part = grad_gates[:, later].reshape(k, rows - b, 3 * hidden)
        h_part = out[:, earlier].reshape(k, rows - b, hidden)
        grad_w_hh = torch.bmm(g_part.transpose(1, 2), h_part)
        grad_b_hh = flat_g.sum(1)
        # input projection: gradient of (r_pre, z_pre) is shared with the hidden side, n's is grad_n
        grad_rz = flat_g[..., :h2]
        grad_w_ih = torch.cat(
            [torch.bmm(grad_rz.transpose(1, 2), frames), torch.bmm(flat_n.transpose(1, 2), frames)],
            1,
        )
        grad_b_ih = torch.cat([grad_rz.sum(1), flat_n.sum(1)], 1)
        grad_frames = torch.baddbmm(torch.bmm(grad_rz, w_ih[:, :h2]), flat_n, w_ih[:, h2:])
        return grad_frames, grad_w_ih, grad_b_ih, grad_w_hh, grad_b_hh, None, None


class _Conv1d(torch.autograd.Function):
    """Every client's own Conv1d (odd kernel, "same" zero padding) as one batched matmul over im2col
    rows.

    Input (K, B, T, C) channels-last, or (K, B, C, T) as the data comes (`time_last`); output (K, B,
    T, C_out). The rows are the B * T windows of `kernel` frames, so the matmul is (B * T, C *
    kernel) x (C * kernel, C_out) per client: one call for the whole chunk, where one `conv1d` per
    client (oneDNN at a batch of 16 clips) ran 1.1-1.5x slower, and a grouped convolution slower
    still. The backward is three batched matmuls and `kernel` shifted adds (col2im); the input
    gradient is skipped where nothing needs it (the first layer's input is data).
    """

    @staticmethod
    def forward(ctx, x, weight, bias, time_last: bool):
        k, b = x.shape[:2]
        c_out, c_in, kernel = weight.shape[1:]
        pad = kernel // 2
        # rows of (kernel, C): each window offset is a contiguous run of C values, so building the
        # columns is a copy of runs (C-minor columns read with stride C were 3x slower)
        padded = F.pad(x.transpose(2, 3) if time_last else x, (0, 0, pad, pad))
        t_len = padded.shape[2] - 2 * pad
        cols = padded.unfold(2, kernel, 1).transpose(3, 4).reshape(k, b * t_len, kernel * c_in)
        w = weight.transpose(2, 3).reshape(k, c_out, kernel * c_in)
        out = torch.baddbmm(bias.unsqueeze(1), cols, w.transpose(1, 2))
        ctx.save_for_backward(cols, w)
        ctx.time_last, ctx.shape = time_last, (c_in, kernel)
        return out.view(k, b, t_len, c_out)

    @staticmethod
    def backward(ctx, grad):
        cols, w = ctx.saved_tensors
        k, b, t_len, c_out = grad.shape
        c_in, kernel = ctx.shape
        g = grad.reshape(k, b * t_len, c_out)
        grad_w = torch.bmm(g.transpose(1, 2), cols).view(k, c_out, kernel, c_in).transpose(2, 3)
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_cols = torch.bmm(g, w).view(k, b, t_len, kernel, c_in)
            pad = kernel // 2
            padded = grad.new_zeros(k, b, t_len + 2 * pad, c_in)
            for j in range(kernel):  # col2im: window offset j read frame t + j of the padded input
                padded[:, :, j : j + t_len] += grad_cols[:, :, :, j]
            grad_x = padded[:, :, pad : pad + t_len]
            if ctx.time_last:
                grad_x = grad_x.transpose(2, 3)
        return grad_x, grad_w, g.sum(1), None


class _ReluMaxPool2(torch.autograd.Function):
    """ReLU then max-pooling by 2 over time (ceil mode), as one op on channels-last (..., T, C).

    relu(max(a, b)) == max(relu(a), relu(b)), so the max is taken first, on the raw pairs; the
    gradient goes to the first maximum of each pair (max_pool's rule) where the output is positive
    (relu's rule, whose derivative at 0 is 0), so values and gradients equal nn.ReLU +
    nn.MaxPool1d(2, ceil_mode=True) exactly. It replaces max_pool's index-tracking kernel, which
    took 7 % of a FedMLAC cohort round, and the full-size ReLU and its backward.
    """

    @staticmethod
    def forward(ctx, x):
        t_len = x.shape[-2]
        if t_len % 2:  # ceil mode: the last window holds one frame
            x = F.pad(x, (0, 0, 0, 1), value=float("-inf"))
        first, second = x[..., 0::2, :], x[..., 1::2, :]
        # 0: the first of the pair (also on ties)
        winner = torch.lt(first, second).long().unsqueeze(-2)
        # maximum and clamp keep NaNs, as max_pool and relu do
        out = torch.maximum(first, second).clamp_min_(0)
        ctx.save_for_backward(winner, out)
        ctx.t_len = t_len
        return out

    @staticmethod
    def backward(ctx, grad):
        winner, out = ctx.saved_tensors
        pairs = grad.new_zeros(*grad.shape[:-1], 2, grad.shape[-1])
        pairs.scatter_(-2, winner, (grad * (out > 0)).unsqueeze(-2))
        return pairs.flatten(-3, -2)[..., : ctx.t_len, :]


class StackedCRNN:
    """The forward pass of `models.crnn.CRNN(spec)` for K clients at once."""

    def __init__(self, spec: CRNNSpec, dropout: float, kernel: int = 5):
        self.spec = spec
        self.dropout = dropout
        self.kernel = kernel

    def __call__(
        self, params: Params, x: torch.Tensor, masks: MaskFn | None = None
    ) -> torch.Tensor:
        return self.head(params, self.embed(params, x, masks))

    def embed(self, params: Params, x: torch.Tensor, masks: MaskFn | None = None) -> torch.Tensor:
        """(K, B, embedding_dim): `CRNN.embed` of K clients."""
        # fp32 whatever runtime.precision says: the hand-written backward passes below (and the
        # fused GRU kernel) are written for fp32 tensors, so autocast is switched off for the
        # stacked model.
        with torch.autocast(x.device.type, enabled=False):
            return self._embed(params, x.float(), masks)

    def head(self, params: Params, embedding: torch.Tensor) -> torch.Tensor:
        """(K, B, classes): `CRNN.head` of K clients' embeddings."""
        with torch.autocast(embedding.device.type, enabled=False):
            return torch.baddbmm(
                params["head.bias"].unsqueeze(1), embedding, params["head.weight"].transpose(1, 2)
            )

    def _embed(self, params: Params, x: torch.Tensor, masks: MaskFn | None) -> torch.Tensor:
        k = x.shape[0]
        # (K, B, features, frames); activations are channels-last (K, B, T, C) from the first conv
        # on
        h = x
        for layer, _ in enumerate(self.spec.conv_channels):
            h = _Conv1d.apply(
                h, params[f"conv.{4 * layer}.weight"], params[f"conv.{4 * layer}.bias"], layer == 0
            )
            h = _ReluMaxPool2.apply(h)
            # masks come as nn.Dropout draws them on a client's (B, C, T) activations
            mask = masks((h.shape[3], h.shape[2]), self.dropout) if masks is not None else None
            if mask is not None:
                h = h * mask.transpose(2, 3)
        # (K, B, T, C) -> (K, T * B, C): time-major rows, so each step's input gates are one
        # contiguous block
        b, t, c = h.shape[1:]
        frames = h.transpose(1, 2).reshape(k, t * b, c)
        directions = ["", "_reverse"] if self.spec.bidirectional else [""]
        outs = [
            _GRULayer.apply(
                frames,
                *(
                    params[f"rnn.{kind}_l0{suffix}"]
                    for kind in ("weight_ih", "bias_ih", "weight_hh", "bias_hh")
                ),
                t,
                bool(suffix),
            )
            for suffix in directions
        ]
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=3)  # (K, T, B, H * directions)
        return out.mean(dim=1)


def stacked_model(name: str, dropout: float) -> StackedCRNN | None:
    """The stacked forward of a zoo model, or None when the architecture has none (trained one by
    one)."""
    spec = CRNN_SPECS.get(name)
    return StackedCRNN(spec, dropout) if spec is not None else None
