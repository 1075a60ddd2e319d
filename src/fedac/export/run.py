"""A trained model taken out of a run directory: its config.yaml, its checkpoint's selected global
model (as `train.select` chose it for the test split) or one client's own model, and the waveform ->
logits module that export, predict and stream run (export/frontend.py).

The selection follows the simulator's `final_results`: the best-validation round's global state
under `train.select=best_val` (the default), else the last. A personalised method's own model
(`--client ID`) is the client's persistent state at the last round. An early-exit model runs at
the exit given (on the 12-layer scale of `earlyexit.exits`), by default at `earlyexit.eval_exit`'s;
LoRA / IA3 adapters are merged into the encoder weights first (`merge_adapters`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedac.config import Config, load_config
from fedac.errors import ConfigError, FedacError

#: The settings every deployed model is described by (the sidecar's `features`).
FEATURE_KEYS = ("kind", "sample_rate", "n_mels", "n_mfcc", "win_ms", "hop_ms", "clip_seconds")


@dataclass
class TrainedModel:
    """A run's model ready to deploy: `model` reads what training fed it, `deployed` the
    waveform."""

    cfg: Config
    run_dir: Path
    model: nn.Module
    deployed: nn.Module
    labels: list[str]
    data: Any
    """The run's FederatedData (its test split checks an export)."""
    source: dict[str, Any] = field(default_factory=dict)

    @property
    def ssl(self) -> bool:
        from fedac.models.ssl import is_ssl_model

        return is_ssl_model(self.cfg.model.name)

    @property
    def sample_rate(self) -> int:
        from fedac.data.features import resolve_features

        return 16000 if self.ssl else resolve_features(self.cfg.features).sample_rate

    @property
    def clip_samples(self) -> int:
        """Samples of one model input window (SSL encoders read whole clips: one second is the
        example the graph is traced with; its length axis stays free)."""
        from fedac.data.features import resolve_features

        seconds = 1.0 if self.ssl else resolve_features(self.cfg.features).clip_seconds
        return int(round(seconds * self.sample_rate))


def run_config(run_dir: str | Path) -> Config:
    """The run's config.yaml (on the CPU), or a FedacError saying the folder is not a run."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise FedacError(
            f"{run_dir} is not a fedac run directory (no config.yaml); give the folder `fedac run` "
            "wrote (its last line names it)"
        )
    cfg = load_config(run_dir / "config.yaml")
    cfg.runtime.device = "cpu"
    return cfg


def merge_adapters(model: nn.Module) -> int:
    """Fold every peft LoRA / IA3 layer into its base weight and put the base layer in its place:
    the same function (to float rounding) without the adapter modules. Returns how many merged."""
    merged = 0
    for name, module in list(model.named_modules()):
        if not (hasattr(module, "merge") and hasattr(module, "get_base_layer")) or not name:
            continue
        module.merge()
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, module.get_base_layer())
        merged += 1
    if merged and hasattr(model, "frozen"):
        # (every weight is now part of the model: keep them in its state)
        object.__setattr__(model, "frozen", frozenset())
    return merged


def _selected_model(cfg: Config, algorithm, state, client: str | None) -> tuple[nn.Module, dict]:
    """The global model `train.select` chose, or `client`'s own model."""
    if client is not None:
        if client not in state.clients:
            known = sorted(state.clients)
            raise ConfigError(
                f"--client {client}: the run holds no own model of that client ("
                + (
                    f"clients with one: {', '.join(known[:8])}{', ...' if len(known) > 8 else ''})"
                    if known
                    else f"algorithm {cfg.algorithm} keeps no client models; leave --client out)"
                )
            )
        model = algorithm.personalized_model(client, state.clients[client])
        if model is None:
            raise ConfigError(f"--client {client}: {cfg.algorithm} keeps no own client models")
        return model, {"client": client, "round": state.round}
    best = cfg.train.select == "best_val" and state.best is not None
    server = algorithm.restore_server(state.best.server if best else state.server)
    model = algorithm.global_model(server)
    if model is None:
        raise ConfigError(
            f"algorithm {cfg.algorithm} trains no shared model; export a client's own model with "
            "--client ID"
        )
    return model, {"round": state.best.round if best else state.round, "select": cfg.train.select}


def _use_exit(model: nn.Module, exit_layer: int | None) -> dict[str, Any]:
    """An early-exit model at `exit_layer` (12-layer scale); the exit it runs at, recorded."""
    from fedac.models.early_exit import MultiExitSSL, scale_depth

    if not isinstance(model, MultiExitSSL):
        if exit_layer is not None:
            raise ConfigError("--exit applies to early-exit models (algorithm earlyexit) only")
        return {}
    if exit_layer is not None:
        depth = scale_depth(exit_layer, len(model.encoder.layers))
        if depth not in model.exits:
            raise ConfigError(
                f"--exit {exit_layer} (layer {depth} of this encoder) is not one of the model's "
                f"exits {model.exits}"
            )
        model.use_exit(depth)
    return {"exit_layer": int(model.depth), "exits": list(model.exits)}


def deployed_form(cfg: Config, model: nn.Module) -> nn.Module:
    """The waveform -> logits module of `model` (export/frontend.py)."""
    from fedac.export.frontend import FeatureFrontEnd, FeatureModel, SSLWaveformModel
    from fedac.models.ssl import is_ssl_model

    if not is_ssl_model(cfg.model.name):
        return FeatureModel(FeatureFrontEnd(cfg.features), model).eval()
    if getattr(model, "kind", "classification") != "classification":
        raise ConfigError(
            f"model {cfg.model.name} has a {model.kind} head: export, predict and stream serve "
            "classifiers (a CTC model's decoder is not part of a graph)"
        )
    cnn: Any = model.cnn
    if cnn is None:
        from fedac.engine.waveform import frozen_cnn

        cnn = frozen_cnn(cfg)
    return SSLWaveformModel(model, cnn).eval()


def load_trained(
    run_dir: str | Path, client: str | None = None, exit_layer: int | None = None
) -> TrainedModel:
    """The model of run `run_dir` (see the module docstring), on the CPU in eval mode, with its
    data (cached features: seconds after the run) and labels."""
    from fedac.algorithms import build_algorithm
    from fedac.engine.checkpoint import load_checkpoint
    from fedac.engine.data import build_federated_data

    run_dir = Path(run_dir)
    cfg = run_config(run_dir)
    state = load_checkpoint(run_dir)  # (before the data: a run without one fails at once)
    data = build_federated_data(cfg, progress=False, device=torch.device("cpu"))
    if data.task.kind != "classification":
        raise ConfigError(
            f"run {run_dir} trains a {data.task.kind} task: export, predict and stream serve "
            "classifiers"
        )
    algorithm = build_algorithm(cfg, data.task)
    model, source = _selected_model(cfg, algorithm, state, client)
    model = copy.deepcopy(model).cpu().float().eval()
    source.update(_use_exit(model, exit_layer))
    merged = merge_adapters(model)
    if merged:
        source["adapters_merged"] = merged
    source.update(run=str(run_dir.resolve()), algorithm=cfg.algorithm, model=cfg.model.name)
    return TrainedModel(
        cfg, run_dir, model, deployed_form(cfg, model), list(data.manifest.classes), data, source
    )
