"""What a run's models score: each evaluated round's validation metrics (metrics.csv, clients.csv,
the best model kept for `train.select=best_val`) and the final results (results.json), for the
simulator and the Flower ServerApp. It trains nothing and reads the run only through what it is
given (`Evaluator`'s fields); engine/clients.py scores the clients for it."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from fedac.algorithms.base import Algorithm
from fedac.config import Config
from fedac.engine.clients import client_summary, log_clients, own_scores, test_confusion
from fedac.engine.data import FederatedData
from fedac.engine.distributed import World
from fedac.engine.state import BestModel, RunState
from fedac.errors import ConfigError
from fedac.rules.attacks import Attack
from fedac.rules.privacy import Privacy
from fedac.training.device import nbytes, to_device
from fedac.training.evaluate import evaluate, kws_rates, selection_score, window_accuracy
from fedac.training.metrics import mean_std
from fedac.training.types import ClientData


def tagged(
    views: dict[str, dict[str, float]], prefix: str = "", suffix: str = ""
) -> dict[str, float]:
    """The further views' metrics (Algorithm.evaluate_views) as flat keys
    <prefix><tag>_<suffix><key>."""
    return {
        f"{prefix}{tag}_{suffix}{k}": v
        for tag, metrics in views.items()
        for k, v in metrics.items()
    }


def client_state_bytes(algorithm: Algorithm, names: list[str]) -> int:
    """Bytes of the persistent states of clients `names` (one state measured per
    architecture)."""
    sizes: dict[str, int] = {}
    for name in names:
        arch = algorithm.client_architecture(name)
        if arch not in sizes:
            sizes[arch] = nbytes(algorithm.init_client_state(name))
    return sum(sizes[algorithm.client_architecture(name)] for name in names)


@dataclass
class Evaluator:
    """A run's evaluation. `client_state(state, name)`: a client's persistent state (created when
    it has none yet); `state_owner`: over several processes, the rank that holds a client's state
    (None: every process holds all); `system_summary`: results.json's `system` (None without a
    clock); `holds_clients`: false for a server whose clients hold their data elsewhere (Flower's
    device mode)."""

    cfg: Config
    data: FederatedData
    algorithm: Algorithm
    device: Any
    world: World
    run_dir: Path
    attack: Attack
    privacy: Privacy
    trainable: list[str]
    client_state: Callable[[RunState, str], Any]
    state_owner: Callable[[str], int] | None = None
    system_summary: Callable[[RunState], dict[str, Any] | None] = lambda state: None
    holds_clients: bool = True

    # --- the clients' own models -----------------------------------------------------------------
    def personalized_models(
        self, state: RunState, clients: list[ClientData] | None = None
    ) -> Iterator[tuple[ClientData, nn.Module]]:
        """(client, its own model) for every client (of `clients`, default all) that has trained at
        least once (the others still hold their random initial weights); nothing for
        non-personalized methods."""
        for client in self.data.clients if clients is None else clients:
            if not state.visits.get(client.name):
                continue
            own = self.algorithm.personalized_model(
                client.name, self.client_state(state, client.name)
            )
            if own is not None:
                yield to_device(client, self.device), own

    def personalized_local_accuracy(
        self, state: RunState, rows: list[dict[str, Any]] | None = None
    ) -> list[float]:
        """Each client's own model on its local held-out windows (empty for non-personalized
        methods): read from this evaluation's clients.csv `rows` when given (each own model is then
        scored once a round, not twice; the same accuracy, computed as `window_accuracy` does), else
        scored here."""
        if rows is not None:
            return [row["own_accuracy"] for row in rows if "own_accuracy" in row]
        batch = self.cfg.train.eval_batch_size
        return list(
            own_scores(
                self, state, lambda c, own: window_accuracy(own, c.holdout_x, c.holdout_y, batch)
            ).values()
        )

    def personalized_test_results(self, state: RunState) -> list[dict[str, float]]:
        """Each client's own model on the test split (empty for non-personalized methods)."""
        # (over several processes each scores its share: clients.own_scores)
        batch = self.cfg.train.eval_batch_size
        return list(
            own_scores(
                self, state, lambda _, own: evaluate(own, self.data.eval_split("test"), batch)
            ).values()
        )

    # --- each evaluated round --------------------------------------------------------------------
    def evaluate_round(self, state: RunState, round_idx: int, row: dict[str, float]) -> None:
        """Validation metrics of the global model (kept as `best` when they improve); personalized
        methods also log their clients' mean local held-out accuracy. Every client's scores go to
        clients.csv."""
        rows = log_clients(self, state, round_idx)
        local = self.personalized_local_accuracy(state, rows)
        if local:
            row["local_accuracy"] = mean_std(local)[0]
        model = self.algorithm.global_model(state.server)
        if model is None:
            return
        val, views = self.algorithm.evaluate_views(
            model, self.data.val, self.cfg.train.eval_batch_size
        )
        row.update({f"val_{k}": v for k, v in val.items()})
        row.update(tagged(views, "val_"))
        if self.cfg.train.test_curve:  # a curve only: selection below reads validation alone
            row["test_accuracy"] = evaluate(
                model, self.data.eval_split("test"), self.cfg.train.eval_batch_size
            )["accuracy"]
        score = selection_score(val)
        if state.best is None or score > state.best.val_score:
            state.best = BestModel(
                round_idx, val.get("accuracy", score), score, copy.deepcopy(state.server)
            )

    # --- the end of the run ----------------------------------------------------------------------
    def selected_server(self, state: RunState) -> dict[str, Any]:
        if self.cfg.train.select == "last" or state.best is None:
            return state.server
        if self.cfg.train.select != "best_val":
            raise ConfigError(
                f"train.select must be best_val or last, got {self.cfg.train.select!r}"
            )
        return state.best.server

    def client_state_memory(self, state: RunState) -> dict[str, Any]:
        """What the clients' persistent states (personal models, control variates, duals) take:
        every client that has trained holds one, of its architecture's size (measured once per
        architecture, so a process holding only its share under torchrun counts them all)."""
        held = [name for name in self.trainable if state.visits.get(name)]
        total = client_state_bytes(self.algorithm, held)
        return {
            "clients_holding": len(held),
            "bytes_total": total,
            "bytes_per_client": total / len(held) if held else 0.0,
        }

    def global_results(self, state: RunState, model: nn.Module) -> dict[str, Any]:
        """The selected shared model's test metrics, its further views and test splits, and its
        accuracy on every client's held-out windows."""
        batch = self.cfg.train.eval_batch_size
        final: dict[str, Any] = {}
        test, views = self.algorithm.evaluate_views(model, self.data.test, batch)
        final.update(test)
        final.update(tagged(views))
        if self.data.manifest is not None:  # (benchmark workloads carry no class names)
            final.update(
                kws_rates(model, self.data.eval_split("test"), self.data.manifest.classes, batch)
            )
        curve = [row["test_accuracy"] for row in state.history if "test_accuracy" in row]
        if curve:
            final["test_last5_mean"] = float(np.mean(curve[-5:]))
        for name, split in self.data.extra_test.items():
            metrics, views = self.algorithm.evaluate_views(model, split, batch)
            final.update({f"{name}_{k}": v for k, v in metrics.items()})
            final.update(tagged(views, suffix=f"{name}_"))
        final["selected_round"] = (
            state.best.round if self.cfg.train.select == "best_val" and state.best else state.round
        )
        local = self.world.each(
            self.data.clients,
            lambda c: window_accuracy(
                model,
                to_device(c.holdout_x, self.device),
                to_device(c.holdout_y, self.device),
                batch,
            ),
            "gathering the clients' accuracy",
        )
        final["client_accuracy_mean"], final["client_accuracy_std"] = mean_std(local)
        return final

    def personal_results(self, state: RunState) -> dict[str, Any]:
        """The clients' own models, over the clients that trained (the count is reported)."""
        personal = self.personalized_test_results(state)
        if not personal:
            return {}
        final: dict[str, Any] = {}
        for key in ("accuracy", "macro_f1"):
            final[f"personalized_{key}_mean"], final[f"personalized_{key}_std"] = mean_std(
                [p[key] for p in personal]
            )
        local = self.personalized_local_accuracy(state)
        final["personalized_local_accuracy_mean"], final["personalized_local_accuracy_std"] = (
            mean_std(local)
        )
        final["personalized_clients"] = len(personal)
        return final

    def final_results(self, state: RunState) -> dict[str, Any]:
        """Test metrics of the model selected on validation, plus per-client and personalized
        metrics: results.json's content."""
        server = self.selected_server(state)
        model = self.algorithm.global_model(server)
        final: dict[str, Any] = {"has_global_model": model is not None}
        if model is not None:
            final.update(self.global_results(state, model))
        final.update(self.personal_results(state))
        if model is None:
            final["selected_round"] = state.round
        batch = self.cfg.train.eval_batch_size
        final.update(
            self.attack.final_metrics(model, batch), **self.privacy.final_metrics(state.round)
        )
        visits = list(state.visits.values())
        if visits:  # the simulator's count (a Flower deployment's nodes keep their own)
            final["clients_trained"] = len(visits)
            final["visits_per_trained_client"] = float(np.mean(visits))
        extra = {"per_client": client_summary(self, state, server)}  # (spreads and cohort counts)
        extra["client_state"] = self.client_state_memory(state)
        if (system := self.system_summary(state)) is not None:
            extra["system"] = system
        if (counts := test_confusion(self, model)) is not None:
            extra["confusion"] = counts
        return {
            "algorithm": self.cfg.algorithm,
            "dataset": self.cfg.dataset,
            "seed": self.cfg.seed,
            "final": final,
            "history": state.history,
            "rounds": state.round,
            "clients": len(self.data.clients),
            "num_classes": self.data.task.num_classes,
            **extra,
        }
