"""Forward FLOPs of a network by formula, counted at torch's function level (`fedac models`).

`count_forward_flops(model, x)` runs one forward pass under a `TorchFunctionMode` and adds, for each
multiply-heavy function called, its FLOPs by formula (a multiply-add counts 2, as torch's
`FlopCounterMode` counts them):

- convolutions: 2 x output elements x (input channels / groups) x kernel size;
- `linear`, `matmul` / `@`, `bmm`: 2 x output elements x the contracted width;
- two-operand `einsum`: 2 x the product of every index's size;
- attention (`multi_head_attention_forward`): the q, k, v and output projections and the two
  attention products (2 x 2 x batch x L x S x embed), `scaled_dot_product_attention` its two
  products;
- `gru` / `lstm`: per step, layer and direction 2 x gates x H x (input + H), the input and hidden
  projections (3 gates for a GRU, 4 for an LSTM); of a PackedSequence, only the steps it holds.

Element-wise work (activations, norms, pooling, softmax) is not counted, as `FlopCounterMode`
does not count it. Why not `FlopCounterMode` itself: entering any `TorchDispatchMode` imports
torch's compiler (torch._dynamo, about 2.4 s), which made a first `fedac models` twice the time of
importing torch; a function-level mode imports nothing. It also sees what the dispatch-level
counter misses on the CPU: the fused attention kernel
(`_scaled_dot_product_flash_attention_for_cpu`) that `TransformerEncoderLayer` takes in training
mode, so KWT's attention products are counted here and not there. tests/test_cli.py checks the
two counts agree on every zoo network but KWT, and KWT's difference is exactly its attention
products.

A plug-in network built from other multiply-heavy functions (say a hand-written convolution by
`unfold`) is undercounted: its row says what these formulas see.
"""

from __future__ import annotations

import math
from typing import Any


def _prod(sizes) -> int:
    return math.prod(int(s) for s in sizes)


def _weight(args: tuple, kwargs: dict) -> Any:
    return args[1] if len(args) > 1 else kwargs["weight"]


def _convolution(args: tuple, kwargs: dict, out) -> int:
    return 2 * out.numel() * _prod(_weight(args, kwargs).shape[1:])


def _linear(args: tuple, kwargs: dict, out) -> int:
    return 2 * out.numel() * int(_weight(args, kwargs).shape[-1])


def _matmul(args: tuple, kwargs: dict, out) -> int:
    return 2 * out.numel() * int(args[0].shape[-1])


def _einsum(args: tuple, kwargs: dict, out) -> int:
    equation, operands = args[0], args[1:]
    if len(operands) == 1 and isinstance(operands[0], list | tuple):
        operands = tuple(operands[0])
    if len(operands) != 2:  # (a one-operand einsum is a sum or a transpose)
        return 0
    sizes: dict[str, int] = {}
    for term, operand in zip(equation.replace(" ", "").split("->")[0].split(","), operands):
        sizes.update(zip(term, (int(n) for n in operand.shape)))
    return 2 * _prod(sizes.values())


def _attention(args: tuple, kwargs: dict, out) -> int:
    query, key = args[0], args[1]
    return 2 * 2 * _prod(query.shape[:-1]) * int(key.shape[-2]) * int(query.shape[-1])


def _multi_head_attention(args: tuple, kwargs: dict, out) -> int:
    query, key = args[0], args[1]  # (L, N, E) and (S, N, E), or unbatched (L, E)
    length, batch, width = query.shape if query.dim() == 3 else (query.shape[0], 1, query.shape[1])
    source = int(key.shape[0])
    projections = 2 * batch * width * (length * width + 2 * source * width + length * width)
    return projections + 2 * 2 * batch * length * source * width


def _recurrent(gates: int):
    def count(args: tuple, kwargs: dict, out) -> int:
        # torch.gru / torch.lstm, two signatures: a padded input (input, hx, params, has_biases,
        # layers, dropout, train, bidirectional, batch_first), or a PackedSequence's (data,
        # batch_sizes, hx, params, has_biases, layers, dropout, train, bidirectional), whose
        # 1-D batch_sizes sum to data's rows: the steps actually taken, padding not counted
        packed = getattr(args[1], "ndim", None) == 1  # (an LSTM's padded hx is a tuple)
        if packed:
            inp, hx, layers, bidirectional = args[0], args[2], args[5], args[8]
            cells = int(inp.shape[0])
        else:
            inp, hx, layers, bidirectional = args[0], args[1], args[4], args[7]
            cells = _prod(inp.shape[:2]) if inp.dim() == 3 else int(inp.shape[0])
        hidden = int((hx[0] if isinstance(hx, list | tuple) else hx).shape[-1])
        dirs = 2 if bidirectional else 1
        widths = [int(inp.shape[-1])] + [dirs * hidden] * (layers - 1)
        per_step = sum(2 * gates * hidden * (w + hidden) for w in widths)
        return dirs * cells * per_step

    return count


def _formulas() -> dict:
    import torch  # lazy: start-up time
    import torch.nn.functional as F

    return {
        torch.conv1d: _convolution,
        torch.conv2d: _convolution,
        F.conv1d: _convolution,
        F.conv2d: _convolution,
        F.linear: _linear,
        torch.matmul: _matmul,
        torch.bmm: _matmul,
        torch.Tensor.__matmul__: _matmul,
        torch.Tensor.matmul: _matmul,
        torch.einsum: _einsum,
        F.scaled_dot_product_attention: _attention,
        F.multi_head_attention_forward: _multi_head_attention,
        torch.gru: _recurrent(3),
        torch.lstm: _recurrent(4),
    }


def count_forward_flops(model, x) -> float:
    """FLOPs of `model(x)`'s forward pass by the formulas above (no gradients recorded)."""
    import torch  # lazy: start-up time
    from torch.overrides import TorchFunctionMode

    formulas = _formulas()

    class Count(TorchFunctionMode):
        flops = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            formula = formulas.get(func)
            if formula is not None:
                first = out if isinstance(out, torch.Tensor) else out[0]
                Count.flops += formula(args, kwargs, first)
            return out

    with Count(), torch.no_grad():
        model(x)
    return float(Count.flops)
