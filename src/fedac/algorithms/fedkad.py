"""FedKAD baseline as fedmlac.md Section 5.2 modified it (after Shi et al., EuroMLSys '23, ref.
[34]).

The original distils through logits on a public dataset. fedmlac.md removes the public data and the
global logits and "restricts communication to class-wise aggregated feature maps only". Our reading:

- Each client trains its own model (any architecture of the zoo) on CE plus a feature-alignment loss
  align_weight * mean_i ||P(h(x_i)) - g_{y_i}||^2 that pulls its penultimate representation h(x),
  projected to a shared size by P, toward the global prototype g_c of the sample's class (classes
  without a global prototype yet contribute nothing).
- It uploads only class prototypes: the mean projected feature per class and the class counts.
- The server aggregates per class: g_c = sum_k count_{k,c} proto_{k,c} / sum_k count_{k,c}; a class
  no sampled client holds keeps its previous prototype.

P is a fixed random Gaussian matrix (scaled by 1/sqrt(d)) drawn from (seed, d) for each embedding
size d, not trained: a trained projection could collapse to zero and make the alignment trivial.
Clients of one architecture therefore share one projection. FedKAD has no global model; it is
evaluated through the clients' own models (personalized accuracy).
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from fedac.algorithms.base import Algorithm, ClientData, ClientResult, Params, model_params
from fedac.models.base import EmbeddingModel, classify
from fedac.seeding import torch_generator
from fedac.training.local import client_batches, local_step, make_optimizer


def alignment_loss(
    projected: torch.Tensor, y: torch.Tensor, prototypes: torch.Tensor, known: torch.Tensor
) -> torch.Tensor:
    """Mean squared distance to the global prototype of each sample's class, over samples whose
    class has one."""
    mask = known[y]
    if not bool(mask.any()):
        return projected.sum() * 0.0
    return (projected[mask] - prototypes[y[mask]]).square().sum(dim=1).mean()


def class_prototypes(
    projected: torch.Tensor, y: torch.Tensor, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class mean of projected features (zeros for absent classes) and per-class counts."""
    counts = torch.bincount(y, minlength=num_classes).to(projected.dtype)
    sums = projected.new_zeros(num_classes, projected.shape[1]).index_add_(0, y, projected)
    return sums / counts.clamp(min=1).unsqueeze(1), counts


def aggregate_prototypes(
    uploads: list[tuple[dict[str, torch.Tensor], int]],
    previous: torch.Tensor,
    previous_known: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Count-weighted per-class mean of the clients' prototypes; unseen classes keep their previous
    value."""
    counts = torch.stack([u["counts"] for u, _ in uploads])
    weighted = torch.stack([u["prototypes"] * u["counts"].unsqueeze(1) for u, _ in uploads]).sum(
        dim=0
    )
    total = counts.sum(dim=0)
    seen = total > 0
    protos = previous.clone()
    protos[seen] = weighted[seen] / total[seen].unsqueeze(1)
    return protos, previous_known | seen


class FedKAD(Algorithm):
    name = "fedkad"
    personalized = True
    #: Its prototypes embed all of a client's windows at once, so features.augment's per-batch
    #: windows do not fit.
    augmentable = False

    def __init__(self, cfg, task, runtime=None):
        super().__init__(cfg, task, runtime)
        self._projections: dict[int, torch.Tensor] = {}

    def projection(self, dim: int) -> torch.Tensor:
        if dim not in self._projections:
            gen = torch_generator(self.cfg.seed, "fedkad-projection", dim)
            # drawn on the CPU (the seeded stream a CPU run uses), then moved to the models' device
            draw = (
                torch.randn(dim, self.cfg.fedkad.proto_dim, generator=gen, device="cpu") / dim**0.5
            )
            self._projections[dim] = draw.to(self.device)
        return self._projections[dim]

    def init_server(self) -> dict[str, Any]:
        c, d = self.task.num_classes, self.cfg.fedkad.proto_dim
        return {
            "prototypes": torch.zeros(c, d, device=self.device),
            "known": torch.zeros(c, dtype=torch.bool, device=self.device),
        }

    def broadcast(self, server: dict[str, Any]) -> dict[str, torch.Tensor]:
        return {"prototypes": server["prototypes"], "known": server["known"]}

    def client_update(
        self,
        payload: dict[str, torch.Tensor],
        state: Params,
        data: ClientData,
        round_idx: int,
        generator: torch.Generator,
    ) -> ClientResult:
        # Feature windows and classes only: the waveform path refuses personalized methods
        # (engine/waveform.py), and features.augment those not augmentable (engine/data.py).
        windows, labels = data.x, data.y
        assert isinstance(windows, torch.Tensor) and isinstance(labels, torch.Tensor)
        # the zoo's networks are EmbeddingModels (models/base.py); a plug-in needs embed, head,
        # embedding_dim
        model = cast(
            EmbeddingModel,
            self.scratch_model(self.client_architecture(data.name), state, role="personal"),
        )
        proj = self.projection(model.embedding_dim)
        model.train()
        optimizer = make_optimizer(model.parameters(), self.cfg.train)
        total: float | torch.Tensor = 0.0  # (local_step returns the loss as a tensor: no host sync)
        steps = 0
        for idx in client_batches(data.num_samples, self.cfg.train, generator):
            x, y = windows[idx], labels[idx]
            features = model.embed(x)
            loss = F.cross_entropy(
                classify(model, features), y
            ) + self.cfg.fedkad.align_weight * alignment_loss(
                features @ proj, y, payload["prototypes"], payload["known"]
            )
            total += local_step(model, optimizer, loss, self.cfg.train)
            steps += 1
        model.eval()
        with torch.no_grad():
            protos, counts = class_prototypes(
                model.embed(windows) @ proj, labels, self.task.num_classes
            )
        return ClientResult(
            {"prototypes": protos, "counts": counts},
            model_params(model),
            {"loss": float(total) / max(steps, 1)},
        )

    def server_update(
        self,
        server: dict[str, Any],
        uploads: list[tuple[dict[str, torch.Tensor], int]],
        round_idx: int,
    ) -> tuple[dict[str, Any], dict[str, float]]:
        protos, known = aggregate_prototypes(uploads, server["prototypes"], server["known"])
        return {"prototypes": protos, "known": known}, {"known_classes": float(known.sum())}

    def global_model(self, server: dict[str, Any]) -> nn.Module | None:
        return None
