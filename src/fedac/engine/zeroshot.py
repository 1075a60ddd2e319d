"""The zero-shot driver: the rounds of its streaming scenarios (zero-shot FL with new classes).
Every user of the scenario trains every round on fresh clips (data/streams.py), the algorithm's
client and server sides run unchanged (algorithms/zeroshot.py), and the run directory is the one
`fedac run` writes (config.yaml, metrics.csv, results.json, checkpoint.pt) through the skeleton
every driver shares (engine/run.py). Its rounds differ from the simulator's fixed clients and cohort
sampling, and it alone knows the scenario's truth, hence a driver of its own; engine/runner.py picks
it for an algorithm with the `streaming` capability.

The algorithm's inputs go in as arguments: D0 and the evaluation rows when it is built
(`SharedRows`), the oracle count of new classes with each server update (`ZeroShotFL.update`), the
worker threads in the runtime; the round's grouping comes back in the update's result
(`ZeroShotUpdate`).

Metrics (per round; the truth of new classes is read here, never by the algorithm):
- the paper's, on D0 rows: per user, `local_acc/<user>` (its raw model, rows of its labels, argmax
  over them), `global_acc/<user>` (f_G after the round's update on the same rows) and
  `increase/<user>`;
- the honest ones, on the official validation and test clips of the 10 classes (window scores
  averaged per clip): accuracy and macro-F1 on all, old and new classes; a registered label counts
  as the true class most of its reports hold, an unregistered new class is never right;
- registration: ARI of the reported (user, local id) groups against their true classes, impression
  purity, correct share, data-impression synthesis time.
Resume: the checkpoint holds the server state (as a plain dict: engine/state.py) and the history;
every random choice derives from (seed, purpose, round, user), so a resumed run ends with the
numbers of an uninterrupted one.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedac.algorithms import algorithm_class
from fedac.algorithms.base import Task
from fedac.algorithms.zeroshot import (
    ClassReport,
    Grouping,
    ScoreUpload,
    SharedRows,
    StreamClientData,
    ZeroShotFL,
    ZeroShotServer,
    ZeroShotUpload,
    labelled_accuracy,
)
from fedac.config import Config
from fedac.data.features import features_of
from fedac.data.registry import load_manifest
from fedac.data.streams import NEW_ID, build_stream
from fedac.engine.clients import ByteLedger, log_users, user_summary
from fedac.engine.data import _gather, _rows_by_clip, normalize
from fedac.engine.execution import ExecutionPlan
from fedac.engine.report import WALL_LABEL, format_table
from fedac.engine.run import RoundDriver
from fedac.engine.state import RunState
from fedac.engine.tracking import check_trackers
from fedac.errors import ConfigError
from fedac.settings.compatibility import check as check_combination
from fedac.training.metrics import classification_metrics
from fedac.training.runtime import start_runtime
from fedac.training.step import train_client
from fedac.training.types import all_finite

log = logging.getLogger(__name__)

LEGEND = {
    "local_acc": (
        "paper metric: users' raw local models on the D0 rows of their labels, mean over users and "
        "rounds"
    ),
    "global_acc": (
        "paper metric: the global score table on the same rows, mean over users and rounds"
    ),
    "increase": "global_acc - local_acc (the paper's 'deterministic accuracy increase')",
    "final_local_acc / final_global_acc / final_increase": "the same, last round only (Table 4)",
    "accuracy / macro_f1": (
        "global score table on the official test clips of the 10 classes, last round"
    ),
    "accuracy_old / accuracy_new": "the same on the 8 old / the 2 new classes",
    "forgetting_old": (
        "test accuracy on old classes: best before the first registration minus last round"
    ),
    "ari / registration_correct / di_purity": "means over rounds with reports",
}


class ZeroShotDriver(RoundDriver):
    shown = ("local_acc", "global_acc", "test_accuracy")

    def __init__(self, cfg: Config, run_dir: str | Path, progress: bool = True):
        cls = algorithm_class(cfg.algorithm)
        if not cls.streaming:
            raise ConfigError(
                f"the zero-shot driver runs streaming algorithms (zeroshot), not '{cfg.algorithm}'"
            )
        if not issubclass(cls, ZeroShotFL):  # (it scores and feeds what ZeroShotFL reports)
            raise ConfigError(
                f"the zero-shot driver runs ZeroShotFL and its subclasses; '{cfg.algorithm}' "
                f"({cls.__module__}.{cls.__qualname__}) is streaming but not one of them"
            )
        # Settings this driver would silently ignore (the weight-averaging runtimes', the clock's)
        # are refused by the compatibility matrix, before any data.
        check_combination(cfg)
        self.cfg, self.run_dir, self.progress = cfg, Path(run_dir), progress
        check_trackers(cfg.log)  # a missing tracker extra fails here, not after training
        self.runtime = start_runtime(cfg.runtime)  # resolved once, passed down
        self.device = self.runtime.device
        manifest = load_manifest(cfg, progress)
        feats = features_of(manifest, cfg, progress, self.device)
        # every user's windows resident on the run's device
        self.x = normalize(feats.features).to(self.device)
        self.rows_of = _rows_by_clip(feats, len(manifest.clips))
        self.stream = stream = build_stream(cfg, manifest)
        self.scenario = stream.scenario
        public_x, public_y, _ = _gather(self.x, self.rows_of, stream.public, stream.public_labels)
        self.splits = {}
        for name, clips in (("val", stream.val), ("test", stream.test)):
            wx, _, position = _gather(self.x, self.rows_of, clips, [0] * len(clips))
            self.splits[name] = (
                wx,
                position,
                torch.tensor([stream.task_label[c] for c in clips], device=wx.device),
            )
        task = Task(int(self.x.shape[1]), self.scenario.num_old, list(self.scenario.users))
        rows = SharedRows(
            public_x, public_y, torch.cat([self.splits["val"][0], self.splits["test"][0]])
        )
        self.algorithm: ZeroShotFL = cls(cfg, task, self.runtime, rows)
        #: The last server update's grouping (None in a round without reports): scored and saved per
        #: round.
        self.grouping: Grouping | None = None

    def client_data(self, user: str, round_idx: int) -> StreamClientData:
        clips, ids = self.stream.draw(user, round_idx)
        x, y, _ = _gather(self.x, self.rows_of, clips, ids)
        empty = x.new_zeros((0, *x.shape[1:]))
        names = {}
        # the user knows what it recorded; anonymous mode hides it
        if self.cfg.zeroshot.identity == "reported":
            names = {
                i: self.scenario.classes[self.stream.truth[(user, i)]]
                for i in set(ids)
                if i >= NEW_ID
            }
        return StreamClientData(
            user,
            x,
            y,
            empty,
            y.new_zeros(0),
            architecture=self.scenario.architecture(user, round_idx),
            names=names,
        )

    # --- truth-side helpers (metrics only) -------------------------------------------------------
    def label_truth(self, registry: dict[tuple[str, int], int]) -> dict[int, int]:
        """Global label -> true task class: old labels are themselves; a registered label is the
        true class most of its reports hold."""
        votes: dict[int, Counter] = {}
        for key, label in registry.items():
            votes.setdefault(label, Counter())[self.stream.truth[key]] += 1
        return {
            **{c: c for c in range(self.scenario.num_old)},
            **{label: v.most_common(1)[0][0] for label, v in votes.items()},
        }

    def truly_new(self, registry: dict[tuple[str, int], int], reports: list[ClassReport]) -> int:
        """The number of distinct true classes among the reports not registered yet (the oracle
        l_new)."""
        known = set(self.label_truth(registry).values())
        return len({self.stream.truth[(r.user, i)] for r in reports for i in r.local_ids} - known)

    def split_metrics(self, server: ZeroShotServer, split: str) -> dict[str, float]:
        """The score table on one split's clips: window scores averaged per clip, argmax over Y."""
        E_val = len(self.splits["val"][0])
        start = 0 if split == "val" else E_val
        wx, position, labels = self.splits[split]
        table = server.scores[start : start + len(wx)]
        clip_scores = (
            table.new_zeros(len(labels), table.shape[1]).index_add_(0, position, table).cpu()
        )
        mapping = self.label_truth(server.registry)
        predicted = np.array([mapping.get(int(p), -1) for p in clip_scores.argmax(1)])
        truth = labels.cpu().numpy()
        out = classification_metrics(truth, predicted)
        old = truth < self.scenario.num_old
        out["accuracy_old"] = (
            float((predicted[old] == truth[old]).mean()) if old.any() else float("nan")
        )
        out["accuracy_new"] = (
            float((predicted[~old] == truth[~old]).mean()) if (~old).any() else float("nan")
        )
        return out

    def grouping_metrics(self, server: ZeroShotServer, g: Grouping | None) -> dict[str, float]:
        from sklearn.metrics import adjusted_rand_score

        if g is None:
            return {}
        truth = [self.stream.truth[key] for key in g.keys]
        mapping = self.label_truth(server.registry)
        point_truth = np.array(truth)[g.owner]
        purity = sum(
            Counter(point_truth[g.cluster == c].tolist()).most_common(1)[0][1]
            for c in set(g.cluster.tolist())
        ) / len(point_truth)
        return {
            "ari": float(adjusted_rand_score(truth, g.labels)) if len(truth) > 1 else float("nan"),
            "registration_correct": float(
                np.mean([mapping[lab] == t for lab, t in zip(g.labels, truth)])
            ),
            "di_purity": float(purity),
        }

    # --- rounds ---------------------------------------------------------------------------------
    def run_round(self, state: RunState, round_idx: int) -> dict[str, float]:
        alg, cfg = self.algorithm, self.cfg
        payload = alg.broadcast(state.server)
        uploads: list[tuple[ZeroShotUpload, int]] = []
        row: dict[str, float] = {}
        users: dict[str, list[int]] = {}
        sent: dict[str, ZeroShotUpload] = {}
        for user in self.scenario.users:
            data = self.client_data(user, round_idx)
            result = train_client(alg, payload, None, data, round_idx, cfg.seed)
            sent[user] = result.upload
            if not all_finite(result.upload):
                log.warning(
                    "round %d: user %s returned NaN/Inf scores or weights; its update is discarded",
                    round_idx,
                    user,
                )
                continue
            uploads.append((result.upload, data.num_samples))
            if isinstance(result.upload, ScoreUpload):
                users[user] = result.upload.labels
                row[f"local_acc/{user}"] = result.metrics["local_acc"]
        reports = [u for u, _ in uploads if isinstance(u, ClassReport)]
        step = alg.update(
            state.server,
            uploads,
            round_idx,
            num_new=self.truly_new(state.server.registry, reports),
        )
        state.server, metrics, self.grouping = step.server, step.metrics, step.grouping
        server = state.server
        E = len(self.splits["val"][0]) + len(self.splits["test"][0])
        for user, labels in users.items():
            row[f"global_acc/{user}"] = labelled_accuracy(
                server.scores[E:, labels], server.public_y, labels
            )
            row[f"increase/{user}"] = row[f"global_acc/{user}"] - row[f"local_acc/{user}"]
        for key in ("local_acc", "global_acc", "increase"):
            values = [v for k, v in row.items() if k.startswith(key + "/") and np.isfinite(v)]
            row[key] = float(np.mean(values)) if values else float("nan")
        row.update(metrics)
        row.update(ByteLedger(state).round(payload, sent))
        row.update({f"val_{k}": v for k, v in self.split_metrics(server, "val").items()})
        row.update({f"test_{k}": v for k, v in self.split_metrics(server, "test").items()})
        row.update(self.grouping_metrics(server, self.grouping))
        row["labels"] = float(server.scores.shape[1])
        return row

    def save_impressions(self, round_idx: int, g: Grouping | None) -> None:
        """A registration round's impressions, clusters, true classes and similarity matrices, for
        the paper's Fig. 3 (PCA of the impressions) and Fig. 4 (similarity heat-map):
        impressions/round<r>.pt."""
        if g is None:
            return
        folder = self.run_dir / "impressions"
        folder.mkdir(parents=True, exist_ok=True)
        record = {
            **g.record(),
            "truth": [self.stream.truth[key] for key in g.keys],
            "classes": self.scenario.classes,
            "num_old": self.scenario.num_old,
            "points": torch.from_numpy(g.points).half(),
            "anchors": torch.from_numpy(g.anchors).half(),
        }
        torch.save(record, folder / f"round{round_idx}.pt")

    # --- the run (the skeleton: engine/run.py) ----------------------------------------------------
    @property
    def rounds(self) -> int:
        return self.scenario.rounds

    @property
    def desc(self) -> str:
        return f"zeroshot {self.scenario.name}"

    @property
    def clients_per_round(self) -> int:
        return len(self.scenario.users)

    def _fresh_state(self) -> RunState:
        return RunState(self.cfg.algorithm, self.algorithm.init_server())

    def first_line(self) -> str:
        self.execution = ExecutionPlan(self.algorithm).path
        return f"zeroshot {self.scenario.name} on {self.runtime.name}; users train {self.execution}"

    def round_written(self, state: RunState, round_idx: int, row: dict[str, float]) -> None:
        self.save_impressions(round_idx, self.grouping)
        log_users(self.run_dir, state, round_idx, row)  # clients.csv: one row per user

    def closing(self) -> dict[str, Any]:
        return {"execution": self.execution}

    def final_results(self, state: RunState) -> dict[str, Any]:
        history = state.history
        last = history[-1]

        def mean(key: str) -> float:
            values = [r[key] for r in history if key in r and np.isfinite(r[key])]
            return float(np.mean(values)) if values else float("nan")

        final: dict[str, Any] = {
            "has_global_model": False,
            "scenario": self.scenario.name,
            "users": len(self.scenario.users),
            "scale": self.scenario.scale,
            "public_per_class": self.scenario.public_per_class,
        }
        users = self.scenario.users
        for key in ("local_acc", "global_acc", "increase"):
            final[key] = mean(key)
            final[f"final_{key}"] = last[key]
            for user in users:
                final[f"{key}/{user}"] = mean(f"{key}/{user}")
        for key in ("accuracy", "macro_f1", "accuracy_old", "accuracy_new"):
            final[key] = last[f"test_{key}"]
        first = next((r["round"] for r in history if r.get("reports")), None)
        before = [r["test_accuracy_old"] for r in history if first is None or r["round"] < first]
        final["forgetting_old"] = (
            (max(before) - last["test_accuracy_old"]) if before else float("nan")
        )
        for key in (
            "ari",
            "registration_correct",
            "di_purity",
            "di_self_consistency",
            "di_seconds_per_class",
        ):
            final[key] = mean(key)
        final["di_seconds"] = float(sum(r.get("di_seconds", 0.0) for r in history))
        final["labels"] = int(last["labels"])
        return {
            "algorithm": self.cfg.algorithm,
            "dataset": self.cfg.dataset,
            "seed": self.cfg.seed,
            "final": final,
            "history": history,
            "rounds": state.round,
            "clients": len(users),
            "num_classes": len(self.scenario.classes),
            "zeroshot_legend": LEGEND,
            "per_client": user_summary(state),
        }


#: The registration figures of a run whose rounds registered no new class (NaN in results.json).
NONE_YET = "n/a (no new class registered yet)"


def zeroshot_table(results: dict[str, Any]) -> str:
    """The CLI's closing table for a zero-shot run."""
    f = results["final"]
    absent = lambda v: v is None or v != v  # noqa: E731 (NaN, or null read back)
    pct = lambda v: "n/a" if absent(v) else f"{100 * v:.2f}%"  # noqa: E731
    rows = [
        ("algorithm", "zeroshot"),
        ("dataset / scenario", f"{results['dataset']} / {f['scenario']}"),
        (
            "D0: local / global / increase (mean over rounds)",
            f"{pct(f['local_acc'])} / {pct(f['global_acc'])} / {pct(f['increase'])}",
        ),
        (
            "D0: last round local / global",
            f"{pct(f['final_local_acc'])} / {pct(f['final_global_acc'])}",
        ),
        ("test: accuracy / macro-F1", f"{pct(f['accuracy'])} / {pct(f['macro_f1'])}"),
        ("test: old / new classes", f"{pct(f['accuracy_old'])} / {pct(f['accuracy_new'])}"),
        ("labels registered (|Y|)", str(f["labels"])),
        (
            "registration: ARI / correct",
            NONE_YET if absent(f["ari"]) else f"{f['ari']:.3f} / {pct(f['registration_correct'])}",
        ),
        (
            "impression synthesis",
            f"{f['di_seconds']:.1f} s; per class: "
            + (
                NONE_YET
                if absent(f["di_seconds_per_class"])
                else f"{f['di_seconds_per_class']:.1f} s"
            ),
        ),
        ("rounds", str(results["rounds"])),
        (WALL_LABEL, f"{results['wall_seconds']:.1f} s"),
    ]
    return format_table(rows)
