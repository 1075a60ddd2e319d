"""LG-FedAvg (Liang et al. 2020, "Think Locally, Act Globally: Federated Learning with Local and
Global Representations", Algorithm 1): each client keeps a local representation (the body) and the
global model is the top layers (the head), averaged by FedAvg. A client trains its local body and
the global head together on its data (the client update of Algorithm 1) and uploads the head.

Body and head are models/parts.py's. The paper also trains the local representations with auxiliary
objectives (e.g. adversarial fairness); those are not part of this baseline: the body learns the
supervised loss through the shared head only.

Warm start (`lgfedavg.warm_start`): the official code first trains FedAvg and starts every client's
network from that model; here the run directory of a FedAvg run of the same network gives its last
checkpoint's global model as the initial network of every client and the server's initial head.
Without it every client starts from the common random initial model (partial.py).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from fedac.algorithms.base import Params
from fedac.algorithms.partial import PartlyShared
from fedac.errors import ConfigError
from fedac.models.parts import body_entries


class LGFedAvg(PartlyShared):
    name = "lgfedavg"

    def private_entries(self, model: nn.Module) -> set[str]:
        return body_entries(model, self.cfg.model.name)

    def initial_model(self) -> Params:
        """The common random initial model, or the warm start's FedAvg model."""
        if self._initial is None and self.cfg.lgfedavg.warm_start:
            self._initial = warm_model(Path(self.cfg.lgfedavg.warm_start), super().initial_model())
        return super().initial_model()


def warm_model(run_dir: Path, like: Params) -> Params:
    """The global model of the FedAvg run in `run_dir` (its checkpoint.pt's last round), refused,
    naming the setting, when it is missing or not a model of `like`'s entries and shapes."""
    path = run_dir / "checkpoint.pt"
    if not path.is_file():
        raise ConfigError(f"lgfedavg.warm_start: {run_dir} holds no FedAvg run (no checkpoint.pt)")
    params = torch.load(path, map_location="cpu", weights_only=False)["server"].get("params", {})
    wrong = sorted(
        n for n in like if n not in params or tuple(params[n].shape) != tuple(like[n].shape)
    )
    if wrong or set(params) != set(like):
        raise ConfigError(
            f"lgfedavg.warm_start: {run_dir}'s global model is not this run's network (entries "
            f"{(wrong or sorted(set(params) ^ set(like)))[:3]} differ); warm start from a FedAvg "
            "run of the same model.name and data"
        )
    return {n: params[n].to(like[n].dtype).clone() for n in like}
