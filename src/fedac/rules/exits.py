"""Early-exit aggregation: the next global model from uploads with different key sets (each client
trains its encoder only up to its own exit)."""

from __future__ import annotations

import torch

from fedac.errors import ConfigError
from fedac.rules.aggregation import Params

# Uploads carry different key sets: a client at depth L_i uploads the tensors it trained (front end,
# encoder.layers[:L_i], the head at L_i) and its depth under "depth" (algorithms/earlyexit.py).

EXIT_AGGREGATIONS = ("depth_weighted", "layerwise", "fedavg")


def exit_aggregate(
    uploads: list[tuple[Params, int]], reference: Params, mode: str = "depth_weighted"
) -> Params:
    """The next global model from uploads with different key sets (early-exit paper, Eq. 1).

    - depth_weighted (Eq. 1): each tensor w_l = sum_{i in S_l} n_i L_i w_{l,i} / sum_{j in S_l} n_j
      L_j over S_l, the clients that uploaded it; the paper writes S_l = {i : L_i >= l} for layers
      and {i : L_i = e} for the head of exit e, which is exactly who uploads them. Eq. 1 speaks of
      local updates; with weights summing to 1 averaging weights equals adding the averaged update.
    - layerwise (HeteroFL's rule, the paper's ablation): the same with weights n_i.
    - fedavg (the paper's heterogeneous FedAvg baseline): every client stands for a full model whose
      untrained tensors are the received `reference`, averaged with weights n_i over the whole
      cohort, so a deep layer's update is diluted by the clients that did not train it.
    A tensor nobody uploaded keeps its `reference` value (S_l empty).
    """
    if mode not in EXIT_AGGREGATIONS:
        raise ConfigError(
            f"earlyexit.aggregation must be one of {', '.join(EXIT_AGGREGATIONS)}, got {mode!r}"
        )
    if not uploads:
        raise ValueError("cannot aggregate an empty cohort")
    out: Params = {}
    for name, current in reference.items():
        if mode == "fedavg":
            members = [(p.get(name, current), float(n)) for p, n in uploads]
        else:
            members = [
                (p[name], float(n) * (int(p["depth"]) if mode == "depth_weighted" else 1))
                for p, n in uploads
                if name in p
            ]
        if not members or not current.is_floating_point():
            out[name] = current.clone()
            continue
        weights = torch.tensor([w for _, w in members], dtype=torch.float64, device=current.device)
        stacked = torch.stack([v.to(torch.float64) for v, _ in members])
        out[name] = torch.tensordot(weights / weights.sum(), stacked, dims=1).to(current.dtype)
    return out
