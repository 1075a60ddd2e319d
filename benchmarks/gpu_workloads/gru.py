"""bench_gpu.py's `gru` workload: the stacked GRU's recurrence alone, a GSC round's cohort packed
into one chunk, each way fedac runs it on the device (`torch`; on CUDA also `triton` and
`torch_graph`) against `plain`, one cuDNN GRU call per client as a per-client loop runs it
(workload_gru's docstring has the details). `fastest` names the winner; no target checks it."""

from __future__ import annotations

from pathlib import Path

import torch

from fedac.models.crnn import CRNN_SPECS
from gpu_timing import run_paths, scale
from workloads import FRAMES


def gru_case(args, clients: int):
    """One direction of CRNN-Base's GRU for a packed chunk at GSC scale: its input frames (K, T * B,
    C), stacked weights and an upstream gradient, on the run's device (frames after two poolings of
    101)."""
    spec, b, t = CRNN_SPECS["crnn_base"], 16, FRAMES // 4
    c, hidden = spec.conv_channels[-1], spec.hidden
    gen = torch.Generator().manual_seed(0)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(args.device).requires_grad_()

    inputs = (
        rand(clients, t * b, c),
        rand(clients, 3 * hidden, c, scale=0.1),
        rand(clients, 3 * hidden, scale=0.1),
        rand(clients, 3 * hidden, hidden, scale=0.1),
        rand(clients, 3 * hidden, scale=0.1),
    )
    return inputs, torch.randn(clients, t, b, hidden, generator=gen).to(args.device), t, b


def workload_gru(args, tmp: Path) -> dict:
    """The stacked GRU's recurrence, forward and backward of one layer direction for a packed chunk
    (a "round" is 5 of them), each way a GPU can run it (issue 45, item 2): fedac's pure-torch
    recurrence (`torch`), the Triton kernel (`triton`), the torch recurrence replayed from a CUDA
    graph (`torch_graph`), and `plain`: one cuDNN GRU call per client (torch.gru with that client's
    weights), what a per-client loop runs."""
    from fedac import kernels
    from fedac.models.stacked import _GRULayer

    clients = scale(args, "gru_clients")
    reps = 5

    def layer_path(mode: str):
        def build():
            kernels.set_gru_kernel(mode)
            inputs, grad, t, _ = gru_case(args, clients)

            def once() -> None:
                out = _GRULayer.apply(*inputs, t, False)
                torch.autograd.grad(out, inputs, grad)

            return (lambda r: [once() for _ in range(reps)]), (lambda r: clients * reps)

        return build

    def graph_path():
        kernels.set_gru_kernel("torch")
        inputs, grad, t, _ = gru_case(args, clients)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up outside the graph, as capture requires
            for _ in range(2):
                torch.autograd.grad(_GRULayer.apply(*inputs, t, False), inputs, grad)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_grads = torch.autograd.grad(_GRULayer.apply(*inputs, t, False), inputs, grad)  # noqa: F841
        return (lambda r: [graph.replay() for _ in range(reps)]), (lambda r: clients * reps)

    def plain_path():
        inputs, grad, t, b = gru_case(args, clients)
        frames, w_ih, b_ih, w_hh, b_hh = inputs
        # (K, B, T, C)
        x = frames.detach().view(clients, t, b, -1).transpose(1, 2).contiguous().requires_grad_()
        weights = [w_ih, w_hh, b_ih, b_hh]
        grads = grad.transpose(1, 2).contiguous()

        def once() -> None:
            outs = [
                torch.gru(
                    x[k],
                    x.new_zeros(1, b, w_hh.shape[2]),
                    [w[k] for w in weights],
                    True,
                    1,
                    0.0,
                    True,
                    False,
                    True,
                )[0]
                for k in range(clients)
            ]
            torch.autograd.grad(outs, [x, *weights], list(grads.unbind(0)))

        return (lambda r: [once() for _ in range(reps)]), (lambda r: clients * reps)

    paths = {"torch": layer_path("torch")}
    if args.device.type == "cuda":
        paths["triton"] = layer_path("triton")
        paths["torch_graph"] = graph_path
    paths["plain"] = plain_path
    out = args.live(
        {
            "clients": clients,
            "shape": dict(
                zip(
                    ("K", "T", "B", "C", "H"),
                    (
                        clients,
                        FRAMES // 4,
                        16,
                        CRNN_SPECS["crnn_base"].conv_channels[-1],
                        CRNN_SPECS["crnn_base"].hidden,
                    ),
                )
            ),
            "sample": "one client's forward and backward of the layer",
            "paths": {},
        }
    )
    try:
        run_paths(args, paths, None, into=out["paths"])
    finally:
        kernels.set_gru_kernel("auto")
    timed = {
        name: r["s_per_round"] / reps for name, r in out["paths"].items() if "s_per_round" in r
    }
    out.update({"s_per_layer": timed, "fastest": min(timed, key=timed.get) if timed else None})
    return out
