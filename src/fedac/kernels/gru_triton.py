"""The stacked GRU recurrence for GPUs, in Triton: one kernel a step in place of torch's eight.

models/stacked.py's pure-torch recurrence (the reference) spends each time step on one batched
matmul (W_hh h for every client at once) and seven elementwise kernels (two sigmoids, a product, a
tanh, the mix of h and n, ...), and its backward on nine more. On a GPU, where a packed chunk's step
is small work, those launches are the cost. Here the matmul stays cuBLAS (`torch.baddbmm`) and
everything elementwise of a step is one Triton kernel, forward and backward, each thread block a run
of hidden units of one (client, sample) row. Same equations, same saved tensors, same layouts as the
reference, so `_GRULayer` takes either; the results agree to float rounding (tanh is 2 sigmoid(2x) -
1, which every Triton version compiles).

Imported only when used (Triton ships with CUDA builds of torch). With TRITON_INTERPRET=1 set before
the import, Triton interprets the kernels on CPU tensors: how tests/models/test_gru_kernel.py checks
them against the reference on machines without a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _step_forward(
    g_ptr,
    i_ptr,
    h_ptr,
    n_ptr,
    out_ptr,
    rows_per_client,
    hidden,
    g_sk,
    i_sk,
    h_sk,
    n_sk,
    out_sk,
    BLOCK: tl.constexpr,
):
    """One step for row (client k, sample b): g (W_hh h + b_hh) gets the activated r and z in place,
    n and the new h are written: r = s(g_r + i_r), z = s(g_z + i_z), n = tanh(i_n + r g_n), h' = (h
    - n) z + n."""
    # 64-bit offsets: a packed chunk's tensors pass 2**31 elements
    row = tl.program_id(0).to(tl.int64)
    k, b = row // rows_per_client, row % rows_per_client
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = j < hidden
    g = g_ptr + k * g_sk + b * 3 * hidden + j
    i = i_ptr + k * i_sk + b * 3 * hidden + j
    r = _sigmoid(tl.load(g, mask=mask) + tl.load(i, mask=mask))
    z = _sigmoid(tl.load(g + hidden, mask=mask) + tl.load(i + hidden, mask=mask))
    n = (
        2.0
        * _sigmoid(
            2.0 * (tl.load(g + 2 * hidden, mask=mask) * r + tl.load(i + 2 * hidden, mask=mask))
        )
        - 1.0
    )
    h = tl.load(h_ptr + k * h_sk + b * hidden + j, mask=mask)
    tl.store(g, r, mask=mask)
    tl.store(g + hidden, z, mask=mask)
    tl.store(n_ptr + k * n_sk + b * hidden + j, n, mask=mask)
    tl.store(out_ptr + k * out_sk + b * hidden + j, (h - n) * z + n, mask=mask)


@triton.jit
def _step_backward(
    dh_ptr,
    go_ptr,
    g_ptr,
    n_ptr,
    hp_ptr,
    dg_ptr,
    dn_ptr,
    dhz_ptr,
    rows_per_client,
    hidden,
    go_sk,
    g_sk,
    n_sk,
    hp_sk,
    dg_sk,
    dn_sk,
    BLOCK: tl.constexpr,
):
    """The chain rule through `_step_forward` for one row: dh = carried dh + grad_out; writes the
    gradient of (r_pre, z_pre, g_n) to dg, that of n's input gate to dn, and dh z (the part of the
    previous step's dh that skips W_hh) to dhz."""
    # 64-bit offsets: a packed chunk's tensors pass 2**31 elements
    row = tl.program_id(0).to(tl.int64)
    k, b = row // rows_per_client, row % rows_per_client
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = j < hidden
    dh = tl.load(dh_ptr + row * hidden + j, mask=mask) + tl.load(
        go_ptr + k * go_sk + b * hidden + j, mask=mask
    )
    g = g_ptr + k * g_sk + b * 3 * hidden + j
    r, z, g_n = (
        tl.load(g, mask=mask),
        tl.load(g + hidden, mask=mask),
        tl.load(g + 2 * hidden, mask=mask),
    )
    n = tl.load(n_ptr + k * n_sk + b * hidden + j, mask=mask)
    h_prev = tl.load(hp_ptr + k * hp_sk + b * hidden + j, mask=mask)
    da_n = dh * (1.0 - z) * (1.0 - n * n)
    dg = dg_ptr + k * dg_sk + b * 3 * hidden + j
    tl.store(dg, da_n * g_n * r * (1.0 - r), mask=mask)
    tl.store(dg + hidden, dh * (h_prev - n) * z * (1.0 - z), mask=mask)
    tl.store(dg + 2 * hidden, da_n * r, mask=mask)
    tl.store(dn_ptr + k * dn_sk + b * hidden + j, da_n, mask=mask)
    tl.store(dhz_ptr + row * hidden + j, dh * z, mask=mask)


def _grid(k: int, b: int, hidden: int) -> tuple[tuple[int, int], int]:
    block = min(triton.next_power_of_2(hidden), 256)
    return (k * b, triton.cdiv(hidden, block)), block


def forward(gi, w_t, b_hh, reverse: bool):
    """models/stacked.py's `_recurrence_forward`, its elementwise part one kernel a step."""
    k, t_len, b, h3 = gi.shape
    hidden = h3 // 3
    out = gi.new_empty(k, t_len, b, hidden)
    gates = gi.new_empty(t_len, k, b, h3)
    news = gi.new_empty(k, t_len, b, hidden)
    bias = b_hh.unsqueeze(1)
    h = gi.new_zeros(k, b, hidden)
    grid, block = _grid(k, b, hidden)
    for step in range(t_len - 1, -1, -1) if reverse else range(t_len):
        g = gates[step]
        torch.baddbmm(bias, h, w_t, out=g)
        _step_forward[grid](
            g,
            gi[:, step],
            h,
            news[:, step],
            out[:, step],
            b,
            hidden,
            g.stride(0),
            gi.stride(0),
            h.stride(0),
            news.stride(0),
            out.stride(0),
            BLOCK=block,
        )
        h = out[:, step]
    return out, gates, news


def backward(grad_out, out, gates, news, w_hh, reverse: bool):
    """models/stacked.py's `_recurrence_backward`, its elementwise part one kernel a step."""
    k, t_len, b, hidden = out.shape
    grad_gates = out.new_empty(k, t_len, b, 3 * hidden)
    grad_n = torch.empty_like(news)
    zeros = out.new_zeros(k, b, hidden)
    dh, dhz = out.new_zeros(k, b, hidden), out.new_empty(k, b, hidden)
    grid, block = _grid(k, b, hidden)
    for step in range(t_len) if reverse else range(t_len - 1, -1, -1):
        prev = step + 1 if reverse else step - 1
        h_prev = out[:, prev] if 0 <= prev < t_len else zeros
        dg = grad_gates[:, step]
        _step_backward[grid](
            dh,
            grad_out[:, step],
            gates[step],
            news[:, step],
            h_prev,
            dg,
            grad_n[:, step],
            dhz,
            b,
            hidden,
            grad_out.stride(0),
            gates.stride(1),
            news.stride(0),
            h_prev.stride(0),
            grad_gates.stride(0),
            grad_n.stride(0),
            BLOCK=block,
        )
        dh = torch.baddbmm(dhz, dg, w_hh)
    return grad_gates, grad_n
