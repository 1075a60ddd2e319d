"""Every client, not only their mean: each client's metrics at every evaluation (clients.csv) and
the bytes each client receives and uploads (metrics.csv's totals, clients.csv's per-client sums).

Evaluation only runs models in eval mode on resident tensors: it draws from no random generator, so
a run's trained numbers are the same with or without it."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np
import torch
from torch import nn

from fedac.algorithms.base import Algorithm
from fedac.config import Config
from fedac.data.waveform import Padded
from fedac.engine.clock.selection import selection_columns
from fedac.engine.data import FederatedData
from fedac.engine.distributed import Summed, current_world
from fedac.engine.report import append_client_rows, no_holdout_reason, ranked
from fedac.engine.state import ByteBook, RunState
from fedac.training.device import nbytes, to_device
from fedac.training.evaluate import clip_predictions, logits
from fedac.training.metrics import confusion, confusion_metrics, spread
from fedac.training.types import ClientData, class_labels

if TYPE_CHECKING:  # (models/ssl.py imports transformers: not at run time)
    from fedac.models.early_exit import MultiExitSSL


class Evaluator(Protocol):
    """What scoring the clients reads of a run (engine/evaluation.py's `Evaluator` gives it)."""

    cfg: Config
    data: FederatedData
    algorithm: Algorithm
    device: Any
    run_dir: Path
    state_owner: Callable[[str], int] | None
    holds_clients: bool

    def personalized_models(
        self, state: RunState, clients: list[ClientData] | None = None
    ) -> Iterator[tuple[ClientData, nn.Module]]: ...


#: The per-client metrics, each as the shared model's (<key>) and, for personalized methods, the
#: client's own model's (own_<key>), on the client's local held-out windows.
CLIENT_METRICS = ("accuracy", "macro_f1", "uar")


def scored(data: ClientData) -> bool:
    """Whether a client's held-out windows can be scored: it holds some, with class labels (not CTC
    texts)."""
    return not isinstance(data.holdout_y, Padded) and len(data.holdout_y) > 0


def prediction_scores(pred: torch.Tensor, y: torch.Tensor, num_classes: int) -> dict[str, float]:
    """Accuracy, macro-F1 and UAR of window predictions; accuracy computed as `window_accuracy`
    does."""
    scores = confusion_metrics(confusion(y.cpu().numpy(), pred.cpu().numpy(), num_classes))
    scores["accuracy"] = float((pred == y).float().mean())
    return scores


def holdout_metrics(
    model: nn.Module, data: ClientData, num_classes: int, batch_size: int
) -> dict[str, float]:
    """`model` on the client's held-out windows; {} when they cannot be scored (`scored`)."""
    if not scored(data):
        return {}
    return prediction_scores(
        logits(model, data.holdout_x, batch_size).argmax(dim=1),
        class_labels(data.holdout_y, "holdout_metrics"),
        num_classes,
    )


def batched_holdout_metrics(
    model: nn.Module, clients: list[ClientData], num_classes: int, batch_size: int, device
) -> dict[str, dict[str, float]]:
    """`holdout_metrics` of every client, with the clients' held-out windows run through the model
    in batches of about `batch_size` windows across clients: one forward per batch, not one per
    client (a GRU's steps are sequential, so a call costs nearly the same for 5 windows as for 500:
    scoring 240 clients one by one took 11 % of the default run). Waveform inputs (Padded) are
    scored per client."""
    out: dict[str, dict[str, float]] = {}
    group: list[tuple[str, torch.Tensor, torch.Tensor]] = []  # (client, held-out windows, labels)

    def flush() -> None:
        if group:
            pred = logits(model, torch.cat([x for _, x, _ in group]), batch_size).argmax(dim=1)
            for (name, _, y), part in zip(group, pred.split([len(y) for _, _, y in group])):
                out[name] = prediction_scores(part, y, num_classes)
            group.clear()

    for data in clients:
        if not scored(data):
            continue
        data = to_device(data, device)
        if isinstance(data.holdout_x, Padded):
            out[data.name] = holdout_metrics(model, data, num_classes, batch_size)
            continue
        group.append((data.name, data.holdout_x, class_labels(data.holdout_y, "holdout_metrics")))
        if sum(len(y) for _, _, y in group) >= batch_size:
            flush()
    flush()
    return out


#: clients.csv's columns that are no score of a model
#: clients.csv's columns of the virtual clock (engine/clock/book.py `ClientLedger.columns`).
CLOCK_COLUMNS = ("compute_s", "comm_s", "arrived", "late", "dropped", "mean_staleness")
#: clients.csv's columns of a selection rule (engine/clock/selection.py `selection_columns`).
SELECTION_COLUMNS = ("times_selected", "selection_utility")


NOT_SCORES = (
    "round",
    "client",
    "n_k",
    "holdout",
    "depth",
    "bytes_down",
    "bytes_up",
    *CLOCK_COLUMNS,
    *SELECTION_COLUMNS,
)


#: metrics.spread's figures that rank clients: read over the clients with enough held-out clips
RANKED = ("p10", "p50", "p90", "worst10_mean")


def spreads(rows: list[dict[str, Any]], min_clips: int = 1) -> dict[str, dict[str, float]]:
    """metrics.spread of every score column of one evaluation's rows: the mean (weighted by n_k
    where rows have it) and std over every client with the score, the percentiles and the worst-10 %
    mean over those of them that hold at least `min_clips` held-out clips (`ranked`: `clients` and
    `ranked_clients` count both)."""
    keys = list(dict.fromkeys(k for r in rows for k in r if k not in NOT_SCORES))
    out = {}
    for key in keys:
        held = [r for r in rows if key in r]
        weights = [r["n_k"] for r in held] if all("n_k" in r for r in held) else None
        counted = [r[key] for r in held if ranked(r, min_clips)]
        ranks = spread(counted)
        out[key] = {
            **spread([r[key] for r in held], weights),
            **{k: ranks[k] for k in RANKED},
            "clients": len(held),
            "ranked_clients": len(counted),
        }
    return out


def exit_scores(
    model: MultiExitSSL, data: ClientData, num_classes: int, batch_size: int
) -> dict[str, float]:
    """An early-exit model (MultiExitSSL) at each of its exits on the client's held-out windows, as
    exit<L>_<metric> (evaluate_views' tags); the model is left at the exit it was at."""
    at, out = model.depth, {}
    for depth in model.exits:
        out.update(
            {
                f"exit{depth}_{k}": v
                for k, v in holdout_metrics(
                    model.use_exit(depth), data, num_classes, batch_size
                ).items()
            }
        )
    model.use_exit(at)
    return out


class ByteLedger:
    """Bytes each client received (the round's broadcast payload) and uploaded (its upload), counted
    from the tensors themselves (`nbytes`: numel x element size over nested dicts / lists). Kept in
    the run's state, so a resumed run's totals continue; a checkpoint written before the ledger
    existed has no count of its earlier rounds, and its cumulative totals are NaN (unknown) rather
    than too small."""

    def __init__(self, state: RunState):
        if state.bytes is None:
            known = state.round == 0
            state.bytes = ByteBook(0 if known else math.nan, 0 if known else math.nan)
        self.book = state.bytes

    def round(
        self,
        payload: Any,
        uploads: dict[str, Any],
        wire: dict[str, int] | None = None,
        down: int | None = None,
    ) -> dict[str, float]:
        """Count one round: every client in `uploads` (name -> its upload) received `payload`.
        `wire` / `down`: the bytes each upload / the broadcast took on the wire where that is not
        its dense size (compressed, rules/compression.py). Returns metrics.csv's columns: the
        round's sums, the mean per client and the cumulative totals."""
        down = nbytes(payload) if down is None else down
        wire = wire or {}
        # (an upload summed by the all-reduce of several processes counts what it would have sent)
        ups = {
            name: wire[name]
            if name in wire
            else upload.bytes
            if isinstance(upload, Summed)
            else nbytes(upload)
            for name, upload in uploads.items()
        }
        for name, up in ups.items():
            pair = self.book.clients.setdefault(name, [0, 0])
            pair[0] += down
            pair[1] += up
        self.book.down += down * len(ups)
        self.book.up += sum(ups.values())
        per_client = float(np.mean(list(ups.values()))) if ups else math.nan
        return {
            "download_bytes": float(down * len(ups)),
            "upload_bytes": float(sum(ups.values())),
            "upload_bytes_per_client": per_client,
            "download_bytes_total": float(self.book.down),
            "upload_bytes_total": float(self.book.up),
        }

    @property
    def clients(self) -> dict[str, list[int]]:
        return self.book.clients


def columns(rows: list[dict[str, Any]], personalized: bool) -> list[str]:
    """clients.csv's header: every column of the rows, and the own_* ones of a personalized method
    (empty until a client has trained)."""
    own = [f"own_{k}" for k in CLIENT_METRICS] if personalized else []
    scores = [k for k in dict.fromkeys(k for r in rows for k in r) if k not in NOT_SCORES]
    fixed = [k for k in ("round", "client", "n_k", "holdout", "depth") if any(k in r for r in rows)]
    sent = [
        k
        for k in ("bytes_down", "bytes_up", *CLOCK_COLUMNS, *SELECTION_COLUMNS)
        if any(k in r for r in rows)
    ]
    return fixed + list(dict.fromkeys(scores + own)) + sent


def shared_out(clients: list[ClientData], score, what: str, owner=None) -> dict[str, Any]:
    """`score(group)` ({client: its scores}) of `clients` over the processes of a torchrun run: rank
    r scores every size-th client from r as one group (engine/distributed.py `World.each`), or, with
    `owner` (client name -> rank), the clients it owns (their states live there); every rank gets
    every client's scores. Over all the run's clients both agree (distributed.py `owner`). In one
    process, all clients as one group."""
    world = current_world()
    if owner is None:
        groups_in = [clients[r :: world.size] for r in range(world.size)]
    else:
        groups_in = [[c for c in clients if owner(c.name) == r] for r in range(world.size)]
    groups = world.each(groups_in, score, what)
    return {name: scores for group in groups for name, scores in group.items()}


def own_scores(ev: Evaluator, state: RunState, score) -> dict[str, Any]:
    """`score(client data, its own model)` of every client with a model of its own (a personalized
    method's trained clients: Evaluator.personalized_models), shared out over the processes, by
    client name in the clients' order. Each is scored as it is yielded (own models share one scratch
    model)."""
    trained = [c for c in ev.data.clients if state.visits.get(c.name)]
    scores = shared_out(
        trained,
        lambda group: {
            data.name: score(data, own) for data, own in ev.personalized_models(state, group)
        },
        "gathering the own models' scores",
        ev.state_owner,
    )
    return {c.name: scores[c.name] for c in trained if c.name in scores}


def evaluate_clients(
    ev: Evaluator, state: RunState, round_idx: int, server: dict[str, Any]
) -> list[dict[str, Any]]:
    """clients.csv's rows of one evaluation by `ev`: the shared model of `server` and
    each trained client's own model on every client's held-out windows (each process its share of
    the clients: `shared_out`). Own models are scored before the shared model is loaded."""
    batch, num_classes = ev.cfg.train.eval_batch_size, ev.data.task.num_classes
    own = own_scores(
        ev, state, lambda data, model: holdout_metrics(model, data, num_classes, batch)
    )
    shared = ev.algorithm.global_model(server)

    def shared_scores(group: list[ClientData]) -> dict[str, dict[str, float]]:
        assert shared is not None  # (called only with a shared model)
        scores_of = batched_holdout_metrics(shared, group, num_classes, batch, ev.device)
        if hasattr(shared, "exits"):  # (an early-exit model: MultiExitSSL)
            for data in group:
                if scores_of.get(data.name):
                    scores_of[data.name].update(
                        exit_scores(
                            cast("MultiExitSSL", shared),
                            to_device(data, ev.device),
                            num_classes,
                            batch,
                        )
                    )
        return scores_of

    scores_of = (
        shared_out(ev.data.clients, shared_scores, "gathering the clients' scores")
        if shared is not None
        else {}
    )
    depths = getattr(ev.algorithm, "depths", {})  # early exit: each client's own exit
    rows = []
    for data in ev.data.clients:
        scores = scores_of.get(data.name, {})
        mine = own.get(data.name, {})
        if not scores and not mine:
            continue
        where = {"depth": depths[data.name]} if data.name in depths else {}
        rows.append(
            {
                "round": round_idx,
                "client": data.name,
                "n_k": data.num_samples,
                "holdout": len(data.holdout_y),
                **where,
                **scores,
                **{f"own_{k}": v for k, v in mine.items()},
                **client_bytes(state, data.name),
                **(state.system.client_columns(data.name) if state.system is not None else {}),
                **selection_columns(state.selection, data.name),
            }
        )
    return rows


def client_bytes(state: RunState, client: str) -> dict[str, int]:
    """clients.csv's bytes_down / bytes_up of a client so far; none where the driver counts no bytes
    (the Flower ServerApp: its messages travel through Flower, not through `ByteLedger`)."""
    if state.bytes is None:
        return {}
    down, up = state.bytes.clients.get(client, (0, 0))
    return {"bytes_down": down, "bytes_up": up}


def log_clients(ev: Evaluator, state: RunState, round_idx: int) -> list[dict[str, Any]]:
    """Append this evaluation's rows to the run's clients.csv, and return them."""
    rows = evaluate_clients(ev, state, round_idx, state.server)
    if rows:
        append_client_rows(ev.run_dir, columns(rows, type(ev.algorithm).personalized), rows)
    return rows


def client_summary(ev: Evaluator, state: RunState, server: dict[str, Any]) -> dict[str, Any]:
    """results.json's `clients`: every per-client metric's spread (metrics.spread, n_k-weighted mean
    included) for the selected shared model and the last own models, and the cohort counts: clients
    scored, and those that could not be, with the reason."""
    rows = evaluate_clients(ev, state, state.round, server)
    total, fewest = len(ev.data.clients), ev.cfg.eval.min_client_clips
    out: dict[str, Any] = {
        "spreads": spreads(rows, fewest),
        "evaluated": len(rows),
        "without_holdout": total - len(rows),
        "min_client_clips": fewest,
        "unranked": sum(not ranked(r, fewest) for r in rows),
    }
    if total > len(rows):
        ctc = any(isinstance(c.holdout_y, Padded) for c in ev.data.clients)
        out["without_holdout_reason"] = no_holdout_reason(
            ev.cfg, ctc, ev.holds_clients, any_holdout=bool(rows)
        )
    return out


def test_confusion(ev: Evaluator, model: nn.Module | None) -> dict[str, Any] | None:
    """results.json's `confusion`: the shared model's clip predictions on the test split against the
    truth (counts[true][predicted]) with the class names; None for tasks without classes."""
    split = ev.data.test
    if model is None or split is None or split.kind != "classification":
        return None
    num = ev.data.task.num_classes
    pred = clip_predictions(model, split, ev.cfg.train.eval_batch_size)
    counts = confusion(split.labels.cpu().numpy(), pred.cpu().numpy(), num)
    manifest = ev.data.manifest
    classes = list(manifest.classes) if manifest is not None else [str(k) for k in range(num)]
    return {"classes": classes, "counts": counts.tolist()}


#: A streaming run's per-user scores (engine/zeroshot.py's history columns <key>/<user>): the user's
#: own model on its labels, the shared score table on them, and the gain.
USER_SCORES = ("local_acc", "global_acc", "increase")


def user_rows(state: RunState, round_idx: int, row: dict[str, float]) -> list[dict[str, Any]]:
    """clients.csv's rows of a streaming (zero-shot) round: one per user that reported scores, from
    the round's history row, with the bytes the user has received and uploaded so far."""
    users = [key.split("/", 1)[1] for key in row if key.startswith(f"{USER_SCORES[0]}/")]
    return [
        {
            "round": round_idx,
            "client": user,
            **{key: row[f"{key}/{user}"] for key in USER_SCORES if f"{key}/{user}" in row},
            **client_bytes(state, user),
        }
        for user in users
    ]


def log_users(run_dir, state: RunState, round_idx: int, row: dict[str, float]) -> None:
    rows = user_rows(state, round_idx, row)
    if rows:
        append_client_rows(run_dir, columns(rows, False), rows)


def user_summary(state: RunState) -> dict[str, Any]:
    """results.json's `per_client` of a streaming run: the spreads of the last round's per-user
    scores."""
    last = state.history[-1]
    rows = user_rows(state, int(last["round"]), last)
    return {"spreads": spreads(rows), "evaluated": len(rows), "without_holdout": 0}
