"""Early-exit federated fine-tuning of SSL speech encoders: each client trains its
encoder only up to its own maximum depth L_i, with the head at that exit, and the server averages
every layer over the clients that trained it (aggregation.exit_aggregate, the paper's Eq. 1).

- Depths (`earlyexit.mode`): homo, every client at `earlyexit.depth`; hetero, a seeded split fixed
  for the whole run with exactly round(low_fraction * N) clients at `low_depth` and the rest at
  `high_depth` (the paper's 50/50 low/high resource clients). Depths use the 12-layer scale
  (models/early_exit.py).
- Local step: the forward pass stops after encoder.layers[:L_i] and the loss is taken at the exit
  L_i only (the paper as written); layers above L_i and the other exits' heads are frozen and never
  run. The frozen CNN front end (model.freeze_cnn) is not part of the model; the feature projection
  and the positional convolution train with every client (the paper is silent; they sit below layer
  1). The head trains at `earlyexit.head_lr` when set (the paper is silent on rates), the rest at
  train.lr.
- Upload: the trained tensors and "depth" (L_i, int64); n_i travels with every upload. With
  `earlyexit.aggregation=fedavg` clients return the full model, untouched tensors as received.
- `model.peft` (lora, ia3): the encoder's own weights stay frozen and out of every payload; a client
  trains the adapters of encoder.layers[:L_i] (an adapter belongs to the layer it sits in) and the
  head at L_i, and uploads those.
- Evaluation: the shared model at `earlyexit.eval_exit` (default: the deepest client depth) selects
  and reports the headline metrics; every exit is evaluated as well (`evaluate_views`, one encoder
  pass per batch for all exits).
"""

from __future__ import annotations

import time
from typing import Any, cast

import torch
from torch import nn

from fedac.algorithms.base import Algorithm, ClientData, ClientResult, Params, clone_params
from fedac.data.waveform import Padded
from fedac.errors import ConfigError
from fedac.models.early_exit import MultiExitSSL, build_multi_exit, scale_depth
from fedac.models.ssl import is_ssl_model
from fedac.rules.exits import EXIT_AGGREGATIONS, exit_aggregate
from fedac.seeding import numpy_rng
from fedac.training.device import to_device
from fedac.training.evaluate import evaluate_exits
from fedac.training.local import make_optimizer, train_supervised

MODES = ("hetero", "homo", "budget")


class EarlyExitFL(Algorithm):
    name = "earlyexit"

    def __init__(self, cfg, task, runtime=None):
        super().__init__(cfg, task, runtime)
        ee = cfg.earlyexit
        if not is_ssl_model(cfg.model.name):
            raise ConfigError(
                f"algorithm 'earlyexit' fine-tunes SSL encoders; model.name={cfg.model.name} is "
                "not one (use w2v2_tiny, w2v2_s, w2v2_m or w2v2_base)"
            )
        # Uploads hold only the tensors a client trained and the server combines them with
        # earlyexit.aggregation: settings that act on full-model uploads would be ignored or
        # misapplied.
        ignored = {
            "aggregation.method": (cfg.aggregation.method, "mean"),
            "attack.kind": (cfg.attack.kind, "none"),
            "dp.mode": (cfg.dp.mode, "none"),
        }
        for setting, (value, default) in ignored.items():
            if value != default:
                raise ConfigError(
                    f"{setting}={value} does not apply to --algorithm earlyexit (its uploads hold "
                    "only the layers each client trained; earlyexit.aggregation combines them): "
                    f"leave it at {default}"
                )
        if ee.mode not in MODES:
            raise ConfigError(f"earlyexit.mode must be one of {', '.join(MODES)}, got {ee.mode!r}")
        if ee.aggregation not in EXIT_AGGREGATIONS:
            raise ConfigError(
                f"earlyexit.aggregation must be one of {', '.join(EXIT_AGGREGATIONS)}, got "
                f"{ee.aggregation!r}"
            )
        if ee.head_lr < 0:
            raise ConfigError(f"earlyexit.head_lr must be >= 0 (0: train.lr), got {ee.head_lr}")
        if not 0 <= ee.low_fraction <= 1:
            raise ConfigError(f"earlyexit.low_fraction must lie in [0, 1], got {ee.low_fraction}")
        self.exits = self.scratch_model(cfg.model.name).exits
        self.depths = self._assign_depths()
        self.eval_exit = (
            self._exit(ee.eval_exit, "eval_exit") if ee.eval_exit else max(self.depths.values())
        )

    # --- depths --------------------------------------------------------------------------------
    def _exit(self, depth: int, setting: str) -> int:
        """A configured depth (12-layer scale) as an exit of this encoder, or a ConfigError naming
        it."""
        layer = scale_depth(depth, len(self.scratch_model(self.cfg.model.name).encoder.layers))
        if layer not in self.exits:
            raise ConfigError(
                f"earlyexit.{setting}={depth} is layer {layer} of this encoder, which has no exit "
                f"there; exits are {self.exits} (earlyexit.exits={self.cfg.earlyexit.exits}, "
                "scaled)"
            )
        return layer

    @property
    def high_depth(self) -> int:
        ee = self.cfg.earlyexit
        return self._exit(ee.high_depth, "high_depth") if ee.high_depth else self.exits[-1]

    def _assign_depths(self) -> dict[str, int]:
        """Each client's maximum depth L_i, fixed for the run (see the module docstring)."""
        ee, clients = self.cfg.earlyexit, self.task.clients
        if ee.mode == "homo":
            return dict.fromkeys(clients, self._exit(ee.depth, "depth"))
        if ee.mode == "budget":
            return self._budget_depths()
        low, high = self._exit(ee.low_depth, "low_depth"), self.high_depth
        order = numpy_rng(self.cfg.seed, "depth").permutation(len(clients))
        lows = {clients[i] for i in order[: round(ee.low_fraction * len(clients))]}
        return {c: low if c in lows else high for c in clients}

    def memory_per_exit(self) -> dict[int, float]:
        """Measured training memory (MB) of every exit at train.batch_size clips of
        earlyexit.budget_seconds."""
        frames = max(1, round(self.cfg.earlyexit.budget_seconds * 49))  # 49 CNN frames per second
        with torch.random.fork_rng():
            model = self.make_model(self.cfg.model.name)
            return {
                e: depth_memory(
                    model, e, self.cfg.train, self.cfg.train.batch_size, frames, steps=1
                )["train_mb"]
                for e in self.exits
            }

    def client_budgets(self) -> dict[str, float]:
        """Each client's memory budget R_i (MB): its device's `memory_mb` when the run has a device
        trace (`system.devices`, the virtual clock's: data/traces.py), else a seeded draw from
        `earlyexit.budgets_mb`."""
        clients, system = self.task.clients, self.cfg.system
        if system.devices != "none":
            from fedac.data.traces import load_devices

            devices = load_devices(system.devices, clients, self.cfg.seed, system.fill)
            unknown = [c for c in clients if devices[c].memory_mb is None]
            if unknown:
                raise ConfigError(
                    f"earlyexit.mode=budget takes each client's memory from system.devices="
                    f"{system.devices}, which gives none for {len(unknown)} clients (e.g. "
                    f"{', '.join(unknown[:3])}): fill its memory_mb column, or set "
                    "system.devices=none and earlyexit.budgets_mb"
                )
            return {c: float(devices[c].memory_mb) for c in clients}  # type: ignore[arg-type]
        budgets = self.cfg.earlyexit.budgets_mb
        if not budgets:
            raise ConfigError(
                "earlyexit.mode=budget needs earlyexit.budgets_mb, e.g. --set "
                "earlyexit.budgets_mb=200,800 (see `fedac memory` for the memory of each exit), "
                "or a device trace with memory (system.devices)"
            )
        return {
            c: budgets[int(numpy_rng(self.cfg.seed, "budget", c).integers(len(budgets)))]
            for c in clients
        }

    def _budget_depths(self) -> dict[str, int]:
        """L_i = the deepest exit whose measured memory fits client i's budget (the paper's R_i,
        §2.2)."""
        budgets = self.client_budgets()
        memory = self.memory_per_exit()
        depths = {}
        for client in self.task.clients:
            budget = budgets[client]
            fits = [e for e in self.exits if memory[e] <= budget]
            if not fits:
                raise ConfigError(
                    f"client {client}: its memory budget {budget} MB is below the "
                    f"{memory[self.exits[0]]:.1f} MB that exit {self.exits[0]} needs; raise the "
                    "budget or lower train.batch_size / earlyexit.budget_seconds"
                )
            depths[client] = fits[-1]
        return depths

    # --- models --------------------------------------------------------------------------------
    def build_network(self, name: str) -> MultiExitSSL:
        return build_multi_exit(
            name,
            self.task.kind,
            self.task.num_classes,
            self.cfg.earlyexit.exits,
            self.cfg.model,
            self.cfg.model.dropout,
        )

    # every model of this method is a MultiExitSSL (build_network above)
    def make_model(self, name: str) -> MultiExitSSL:
        return cast(MultiExitSSL, super().make_model(name))

    def scratch_model(
        self, name: str, params: Params | None = None, role: str = "global"
    ) -> MultiExitSSL:
        return cast(MultiExitSSL, super().scratch_model(name, params, role))

    def init_server(self) -> dict[str, Any]:
        return {"params": self.initial_params(self.cfg.model.name, "global-init")}

    @staticmethod
    def trained(name: str, depth: int) -> bool:
        """Whether a client at `depth` trains the tensor `name`: not a layer at or above index depth
        (layers[:depth] run), not another exit's head."""
        parts = name.split(".")
        if name.startswith("encoder.layers."):
            return int(parts[2]) < depth
        if name.startswith("exit_heads."):
            return int(parts[1]) == depth
        return True

    # --- contract ------------------------------------------------------------------------------
    def client_update(
        self,
        payload: Params,
        state: Any,
        data: ClientData,
        round_idx: int,
        generator: torch.Generator,
    ) -> ClientResult:
        depth = self.depths[data.name]
        model = self.scratch_model(self.cfg.model.name, payload).use_exit(depth)
        train_to(model, depth)
        groups = [
            {
                "params": [
                    p
                    for n, p in model.named_parameters()
                    if p.requires_grad and n.startswith("exit_heads.") == head
                ]
            }
            for head in (False, True)
        ]
        if self.cfg.earlyexit.head_lr > 0:  # the exit head at its own rate (earlyexit.head_lr)
            groups[1]["lr"] = self.cfg.earlyexit.head_lr
        metrics = train_supervised(
            model,
            data.x,
            data.y,
            self.cfg.train,
            generator,
            optimizer=make_optimizer(groups, self.cfg.train),
        )
        keep_all = self.cfg.earlyexit.aggregation == "fedavg"  # the baseline returns full models
        upload = {
            k: v
            for k, v in clone_params(model.state_dict()).items()
            if keep_all or self.trained(k, depth)
        }
        upload["depth"] = torch.tensor(depth, dtype=torch.int64, device=self.device)
        return ClientResult(upload, None, {**metrics, "depth": float(depth)})

    def server_update(
        self, server: dict[str, Any], uploads: list[tuple[Params, int]], round_idx: int
    ) -> tuple[dict[str, Any], dict[str, float]]:
        params = exit_aggregate(uploads, server["params"], self.cfg.earlyexit.aggregation)
        depths = [int(p["depth"]) for p, _ in uploads]
        return {**server, "params": params}, {"mean_depth": sum(depths) / len(depths)}

    # --- evaluation ----------------------------------------------------------------------------
    def global_model(self, server: dict[str, Any]):
        return self.scratch_model(self.cfg.model.name, server["params"]).use_exit(self.eval_exit)

    def evaluate_views(self, model: nn.Module, split, batch_size: int):
        """The shared model at eval_exit, and every exit as exit<L>, from one encoder pass per
        batch."""
        exits = cast(MultiExitSSL, model)  # global_model's, a MultiExitSSL
        by_exit = evaluate_exits(exits, split, batch_size)
        exits.use_exit(self.eval_exit)
        return dict(by_exit[self.eval_exit]), {
            f"exit{depth}": metrics for depth, metrics in by_exit.items()
        }


# --- memory per depth (`fedac memory`, earlyexit.mode=budget) -------------------------------------

MB = 1e6


def depth_memory(
    model: MultiExitSSL, depth: int, train, batch: int, frames: int, steps: int = 2
) -> dict[str, float]:
    """Measured memory and time of one local training step at exit `depth` on a batch of `batch`
    clips of `frames` CNN frames (random inputs: the sizes, not the values, set the memory).

    - weights_mb: the fp32 tensors a client at this depth holds and runs (front end, layers[:depth],
      its head; with model.peft the frozen encoder weights and the adapters);
    - trainable_mb: the fp32 tensors it trains (without model.peft: all of weights_mb);
    - train_mb: weights + gradients + optimizer state of the trained tensors (AdamW: 2 per
      parameter, SGD with momentum: 1) + the tensors autograd saves for backward, counted by storage
      with saved-tensor hooks during a real forward pass, parameters left out (CPU: the allocator
      keeps no peak);
    - step_seconds: median wall time of a forward + backward + optimizer step.
    """
    model.use_exit(depth).train()
    params = dict(model.named_parameters())
    train_to(model, depth)
    runs = [p for name, p in params.items() if EarlyExitFL.trained(name, depth)]
    trainable = [p for p in runs if p.requires_grad]
    nbytes = lambda tensors: sum(t.numel() * t.element_size() for t in tensors)  # noqa: E731
    states = 2 if train.optimizer == "adamw" else (1 if train.momentum else 0)
    generator = torch.Generator().manual_seed(0)
    cpu = torch.device("cpu")  # drawn on the host, then moved to the model's device
    x = Padded(
        torch.randn(batch, frames, model.config.conv_dim[-1], generator=generator, device=cpu),
        torch.full((batch,), frames, device=cpu),
    )
    y: Padded | torch.Tensor
    if model.kind == "ctc":
        width = max(1, frames // 4)
        y = Padded(
            torch.randint(1, 28, (batch, width), generator=generator, device=cpu),
            torch.full((batch,), width, device=cpu),
        )
    else:
        # a classification exit's linear head
        head = cast(nn.Linear, model.exit_heads[str(depth)].head)
        y = torch.randint(0, head.out_features, (batch,), generator=generator, device=cpu)
    device = next(model.parameters()).device
    x, y = to_device(x, device), to_device(y, device)
    saved: dict[int, int] = {}
    # counted as weights already
    weight_storages = {p.untyped_storage().data_ptr() for p in params.values()}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weight_storages:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    optimizer = make_optimizer(trainable, train)
    times = []
    for step in range(max(1, steps)):
        started = time.perf_counter()
        with (
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
            if step == 0
            else torch.enable_grad()
        ):
            loss = model.task_loss(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - started)
    weights = nbytes(runs)
    out = {
        "depth": float(depth),
        "weights_mb": weights / MB,
        "trainable_mb": nbytes(trainable) / MB,
        "activations_mb": sum(saved.values()) / MB,
        "train_mb": (weights + (1 + states) * nbytes(trainable) + sum(saved.values())) / MB,
        "step_seconds": sorted(times)[len(times) // 2],
    }
    train_to(model, None)
    return out


def train_to(model: MultiExitSSL, depth: int | None) -> None:
    """Trains exactly what a client at `depth` trains (None: every exit), never the encoder weights
    that model.peft keeps frozen."""
    for name, param in model.named_parameters():
        param.requires_grad_(
            name not in model.frozen and (depth is None or EarlyExitFL.trained(name, depth))
        )
