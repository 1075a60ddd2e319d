"""FedMMD (Yao et al., VCIP 2018; FedKWS-UI's baseline as its official code runs it, fedreg.py):
FedAvg whose local loss adds lambda * MMD^2 between the local model's penultimate features and those
of the round's frozen global model on the same batch:

    L = CE(head(h_loc), y) + lambda * MMD^2(H_loc, H_glob),
    H_glob = embed_global(x) in eval mode, detached.

MMD^2 is the code's `mmd_rbf_noaccelerate`: Z = [H_loc; H_glob] (2B rows), D = pairwise squared L2
distances, bandwidth b = sum(D) / ((2B)^2 - 2B) + 1e-8 (no gradient through b), b <- b / 2^(5 // 2),
K = sum_{i=0..4} exp(-D / (b 2^i)), MMD^2 = mean(K_XX + K_YY - K_XY - K_YX) (the biased estimate).

Local training is FedAvg's (`train.local_epochs` passes, the server's n_k-weighted mean), so FedMMD
differs from FedAvg by the MMD term alone; it runs on the sequential path (no stacked form).
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn.functional as F

from fedac.algorithms.base import ClientData, ClientResult, Params, model_params
from fedac.algorithms.fedavg import FedAvg
from fedac.models.base import classify
from fedac.training.local import client_batches, local_step, make_optimizer, on_device
from fedac.training.types import class_labels


def mmd_rbf(
    source: torch.Tensor, target: torch.Tensor, kernel_mul: float = 2.0, kernel_num: int = 5
) -> torch.Tensor:
    """Biased MMD^2 of two (B, d) feature batches under a sum of `kernel_num` RBF kernels whose
    bandwidths are the mean pairwise squared distance times kernel_mul^(i - kernel_num // 2)."""
    total = torch.cat([source, target])
    n = total.shape[0]
    distances = (total.unsqueeze(1) - total.unsqueeze(0)).pow(2).sum(-1)
    bandwidth = distances.detach().sum() / (n * n - n) + 1e-8
    bandwidth = bandwidth / kernel_mul ** (kernel_num // 2)
    # (cast: a sum of tensors is a tensor, the start 0 aside)
    kernel = cast(
        torch.Tensor,
        sum(torch.exp(-distances / (bandwidth * kernel_mul**i)) for i in range(kernel_num)),
    )
    b = source.shape[0]
    return (kernel[:b, :b] + kernel[b:, b:] - kernel[:b, b:] - kernel[b:, :b]).mean()


class FedMMD(FedAvg):
    name = "fedmmd"
    # its DP accounting was never checked: DP runs stay with fedavg, fedprox, fedmlac
    dp_compatible = False

    def client_update(
        self,
        payload: Params,
        state: Any,
        data: ClientData,
        round_idx: int,
        generator: torch.Generator,
    ) -> ClientResult:
        weight = self.cfg.fedmmd.weight
        # Any: the model reads the windows the run's data hold, through its embed and head (which a
        # plug-in model needs): the zoo's EmbeddingModels (models/base.py) feature windows, an SSL
        # encoder (models/ssl.py) padded waveforms.
        model: Any = self.scratch_model(self.cfg.model.name, payload)
        frozen: Any = self.scratch_model(self.cfg.model.name, payload, role="frozen-global").eval()
        labels = class_labels(data.y, "FedMMD")
        model.train()
        optimizer = make_optimizer(model.parameters(), self.cfg.train)
        total: float | torch.Tensor = 0.0  # summed as tensors (no host sync per step)
        mmd_total: float | torch.Tensor = 0.0
        steps = 0
        for idx in on_device(client_batches(data.num_samples, self.cfg.train, generator), data.x):
            x, y = data.x[idx], labels[idx]
            h = model.embed(x)
            loss = F.cross_entropy(classify(model, h), y)
            if weight:
                with torch.no_grad():
                    reference = frozen.embed(x)
                mmd = mmd_rbf(h, reference)
                loss = loss + weight * mmd
                mmd_total += mmd.detach().double()
            total += local_step(model, optimizer, loss, self.cfg.train)
            steps += 1
        metrics = {
            "loss": float(total) / max(steps, 1),
            "mmd": float(mmd_total) / max(steps, 1),
            "steps": float(steps),
        }
        return ClientResult(model_params(model), None, metrics)
