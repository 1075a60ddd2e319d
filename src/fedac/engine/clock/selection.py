"""Client selection (`selection.*`, docs/system.md "Who trains"): which of the clients online at a
round's start train in it, and in FedBuff / FedAsync whom a free slot is given to.

A rule sees, for every client, its history (`history`: last reported training loss, training
clips, times selected, the round it was last selected and last reported, its last selection
utility) and, with the virtual clock, its modelled times for this round (the clock's `ClientTimes`:
download, local steps, upload; known before anyone trains, as FedScale's device profiles are).
The history lives in the run state (`RunState.selection`, checkpointed), so a resumed run chooses
what an uninterrupted one would; every random draw is seeded by (seed, rule, the round's key), so
every process of a torchrun run chooses the same clients. The chosen clients train as before (one
stacked computation); the round's schedule (schedule.py `RoundSchedule.choose`) calls `choose`
where it samples, and `observe` with the losses of the clients whose updates the server received.

Rules:

- `random`: uniform without replacement (cohort.py `sample_clients`), from the very stream of the
  engine before rules existed (`numpy_rng(seed, "cohort", round)`, `("dispatch", n)` in the async
  modes): bit for bit.
- `oort` (Lai et al., OSDI 2021, Sec. 4.2-4.3, Alg. 1; FedScale's `thirdparty/oort` for what the
  paper leaves open). A client that has reported has the statistical utility
  U_i = |B_i| x L_i (|B_i| its training clips; L_i the mean training loss of its last update,
  which fedac's client update reports, standing in for the paper's root-mean-square per-sample
  loss sqrt(mean l^2), which it does not). Its score is
      (min(U_i, clip) - U_min) / (U_max - U_min) + sqrt(0.1 ln R / r_i)           (staleness bonus)
  with clip the `clip_bound` quantile of the reporters' utilities, R the current round and r_i
  the round it last reported, multiplied by (T / t_i)^alpha when its modelled duration t_i exceeds
  the preferred duration T (the `round_threshold` percentile of every client's duration). Each
  round epsilon <- max(epsilon x decay, epsilon_min); (1 - epsilon) K clients are exploited:
  drawn with probability proportional to score among those scoring at least c x the K-th highest;
  the rest explore clients never heard from. A never-heard-from client has no loss: it is chosen
  only by exploration, which ranks it by its data size x the same system penalty (FedScale's
  initial reward) and draws among the `sample_window` x slots largest, proportional to that. The
  pacer: every W rounds, when the exploited clients' mean utility summed over the last W rounds is
  within 10 % of the W before, T's percentile rises by delta (at most 100: no penalty); when it
  moved 5x or more, it falls by delta (FedScale's rule). The blacklist (off by default, as in
  FedScale) leaves out clients that reported more than `blacklist_rounds` times. Where the
  exploration and exploitation pools run short of K, the best-scoring remaining clients fill the
  round (FedScale would return fewer).
- `poc`, power-of-choice (Cho, Wang and Joshi 2020, rpow-d): d candidates drawn without
  replacement with probability n_k / n, of which the K with the highest loss are chosen. The loss
  is the one the client reported when it last trained (rpow-d), so the rule costs no computation or
  traffic and the clock charges nothing; a client that never trained counts as +inf (chosen first,
  in the order drawn). The paper's pow-d instead has every candidate evaluate the current model (a
  forward pass over its data and a download each round); fedac does not model that variant.
- `fedcs` (Nishio and Yonetani, ICC 2019, Alg. 2): from the clients online, repeatedly take the one
  that lengthens the predicted round least, keeping it when the round still ends within
  `system.deadline` (else it is passed over); at most the round's size. Predicted times are the
  clock's model. `channel=shared` is the paper's: uploads take turns on one channel
  (end_j = max(end_{j-1}, update_j) + upload_j); `parallel` is fedac's clock (end = max over the
  chosen of their whole times, so the fastest come first).
"""

from __future__ import annotations

import heapq
import logging
import math
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from fedac.config import Config
from fedac.engine.clock.cohort import sample_clients
from fedac.seeding import numpy_rng
from fedac.settings.selection import SELECTORS, ClockNeed, not_read

log = logging.getLogger(__name__)


class Times(Protocol):
    """A client's modelled update (the clock's `ClientTimes`)."""

    @property
    def total(self) -> float: ...

    @property
    def up_s(self) -> float: ...


#: client -> its modelled times this round (None without a device model)
TimesOf = Callable[[str], Times] | None


def selection_columns(history: dict[str, Any], client: str) -> dict[str, float]:
    """clients.csv's columns of selection from the run state's history (`RunState.selection`):
    none under a rule that keeps no history (random), else the client's times selected and last
    selection utility."""
    if "clients" not in history:
        return {}
    entry = history["clients"].get(client)
    return {
        "times_selected": int(entry["selected"]) if entry else 0,
        "selection_utility": entry["utility"] if entry else math.nan,
    }


class Selection:
    """The base of every rule: history bookkeeping and the engine's two calls. A rule overrides
    `pick` (and `clock_need`, to declare what it needs of the virtual clock)."""

    #: Whether the rule keeps a history (random does not: its runs stay as they were).
    tracks = True

    def __init__(self, cfg: Config, sizes: dict[str, int]):
        self.cfg, self.settings, self.seed = cfg, cfg.selection, cfg.seed
        self.sizes = sizes
        self.history: dict[str, Any] = {}
        given, defaults = vars(cfg).get("_given", {}), vars(type(cfg.selection)())
        # (given at another value than its default: a saved config.yaml gives every key, each at
        # its default where the run did not set it, and reads back without a warning)
        changed = {f"selection.{k}" for k, v in defaults.items() if getattr(cfg.selection, k) != v}
        unread = sorted(k for k in not_read(cfg.selection.method) if k in given and k in changed)
        if unread:
            log.warning(
                "%s not read under selection.method=%s", ", ".join(unread), cfg.selection.method
            )

    @classmethod
    def clock_need(cls, settings: Any) -> ClockNeed:
        """What the rule needs of the virtual clock under its `settings` (the `selection`
        section), which the compatibility matrix reads before any data (settings/compatibility.py
        refuses a run without it): nothing by default."""
        return ClockNeed()

    # --- the engine's calls -----------------------------------------------------------------------
    def bind(self, history: dict[str, Any]) -> None:
        """Use the run state's history (RunState.selection) from now on (a rule that keeps one
        marks it with its "clients", so clients.csv shows its columns: `selection_columns`)."""
        self.history = history
        if self.tracks:
            history.setdefault("clients", {})

    def choose(
        self, candidates: list[str], size: int, key: tuple, round_idx: int, times: TimesOf = None
    ) -> list[str]:
        """`size` of `candidates` (fewer if there are fewer), in the candidates' order. `key`
        seeds the draws; `round_idx` is the round (async: the model version + 1)."""
        size = min(size, len(candidates))
        if size <= 0:
            return []
        picked = set(self.pick(candidates, size, key, round_idx, times))
        if self.tracks:
            for name in picked:
                entry = self.client(name)
                entry["selected"] += 1
                entry["last_selected"] = round_idx
        return [c for c in candidates if c in picked]

    def observe(self, round_idx: int, losses: dict[str, float]) -> None:
        """The training losses of the clients whose updates the server received this round."""
        if not self.tracks:
            return
        for name, loss in losses.items():
            entry = self.client(name)
            entry["loss"] = float(loss)
            entry["reported"] += 1
            entry["last_reported"] = round_idx

    def columns(self, client: str) -> dict[str, float]:
        """clients.csv's columns of selection (none for random)."""
        return selection_columns(self.history, client) if self.tracks else {}

    # --- for the rules ----------------------------------------------------------------------------
    def pick(
        self, candidates: list[str], size: int, key: tuple, round_idx: int, times: TimesOf
    ) -> list[str]:
        raise NotImplementedError

    def client(self, name: str) -> dict[str, Any]:
        """A client's history entry (created on first use)."""
        clients = self.history.setdefault("clients", {})
        if name not in clients:
            clients[name] = {
                "loss": math.nan,
                "samples": self.sizes.get(name, 0),
                "selected": 0,
                "last_selected": 0,
                "reported": 0,
                "last_reported": 0,
                "utility": math.nan,
            }
        return clients[name]

    def rng(self, key: tuple) -> np.random.Generator:
        return numpy_rng(self.seed, f"select-{self.settings.method}", *key)


class RandomSelection(Selection):
    """Uniform without replacement: the engine's draw before selection rules existed."""

    tracks = False

    def pick(
        self, candidates: list[str], size: int, key: tuple, round_idx: int, times: TimesOf
    ) -> list[str]:
        return sample_clients(candidates, size, numpy_rng(self.seed, *key))


def weighted_draw(rng: np.random.Generator, names: list[str], weights: list[float], k: int):
    """k of `names` without replacement, with probability proportional to `weights` (uniform when
    they sum to nothing)."""
    w = np.asarray(weights, dtype=float)
    p = w / w.sum() if w.sum() > 0 else None
    return [names[i] for i in rng.choice(len(names), k, replace=False, p=p)]


def norm(values: list[float], clip_bound: float) -> tuple[float, float, float]:
    """(clip value, minimum, range) of utilities as Oort normalises them: the clip the
    `clip_bound` quantile (FedScale's index int(n x bound)), the minimum x 0.999, the range at
    least 1e-4."""
    ordered = sorted(values)
    clip = ordered[min(int(len(ordered) * clip_bound), len(ordered) - 1)]
    low = ordered[0] * 0.999
    return clip, low, max(ordered[-1] - low, 1e-4)


def paced_threshold(
    threshold: float, exploited: list[float], round_idx: int, step: int, delta: float
) -> float:
    """Oort's pacer: the percentile of the preferred duration after round `round_idx`'s check
    (`exploited`: each round's mean utility of its exploited clients that reported)."""
    if round_idx < 2 * step or round_idx % step:
        return threshold
    before, last = sum(exploited[-2 * step : -step]), sum(exploited[-step:])
    if abs(last - before) <= before * 0.1:  # stalled: accept slower clients
        return min(100.0, threshold + delta)
    if abs(last - before) >= before * 5:
        return max(delta, threshold - delta)
    return threshold


def preferred_duration(durations: list[float], threshold: float) -> float:
    """T: the `threshold` percentile of the clients' durations (FedScale's index), inf at 100."""
    if threshold >= 100 or not durations:
        return math.inf
    ordered = sorted(durations)
    return ordered[min(int(len(ordered) * threshold / 100.0), len(ordered) - 1)]


class Oort(Selection):
    """Oort (module docstring)."""

    @classmethod
    def clock_need(cls, settings: Any) -> ClockNeed:
        if settings.round_penalty > 0 and settings.round_threshold < 100:
            return ClockNeed(
                "clock",
                "weighs each client's speed",
                "selection.round_penalty=0 for its statistical utility alone",
            )
        return ClockNeed()

    def _advance(self, round_idx: int) -> dict[str, Any]:
        """The rule's state, moved on to round `round_idx` once (decay, pacer)."""
        s, state = self.settings, self.history.setdefault("oort", {})
        state.setdefault("epsilon", s.exploration)
        state.setdefault("threshold", s.round_threshold)
        state.setdefault("exploited", [])
        if state.get("round") == round_idx:
            return state
        clients = self.history.get("clients", {})
        fresh = set(self.history.pop("fresh", []))
        last = [c for c in state.get("exploit", []) if c in fresh]
        state["exploited"].append(sum(self.utility(clients[c]) for c in last) / (len(last) + 1e-4))
        state["threshold"] = paced_threshold(
            state["threshold"], state["exploited"], round_idx, s.pacer_step, s.pacer_delta
        )
        state["epsilon"] = max(state["epsilon"] * s.exploration_decay, s.exploration_min)
        state["round"], state["exploit"] = round_idx, []
        return state

    def observe(self, round_idx: int, losses: dict[str, float]) -> None:
        super().observe(round_idx, losses)
        self.history.setdefault("fresh", []).extend(sorted(losses))  # (the pacer's "successful")

    def utility(self, entry: dict[str, Any]) -> float:
        """U_i = |B_i| x L_i."""
        return entry["samples"] * entry["loss"]

    def blacklist(self) -> set[str]:
        s = self.settings
        if s.blacklist_rounds < 0:
            return set()
        clients = self.history.get("clients", {})
        over = sorted(
            (c for c, e in clients.items() if e["reported"] > s.blacklist_rounds),
            key=lambda c: (-clients[c]["reported"], c),
        )
        return set(over[: int(s.blacklist_max_len * len(self.sizes))])

    def scores(
        self, explored: list[str], round_idx: int, penalty: Callable[[str], float]
    ) -> dict[str, float]:
        """Each explored client's score (module docstring)."""
        entries = {c: self.client(c) for c in explored}
        rewards = [self.utility(e) for e in entries.values() if self.utility(e) > 0]
        if not rewards:
            rewards = [0.0]
        clip, low, spread = norm(rewards, self.settings.clip_bound)
        out = {}
        for c, e in entries.items():
            bonus = math.sqrt(0.1 * math.log(max(round_idx, 1)) / max(e["last_reported"], 1))
            out[c] = abs(((min(self.utility(e), clip) - low) / spread + bonus) * penalty(c))
        return out

    def pick(
        self, candidates: list[str], size: int, key: tuple, round_idx: int, times: TimesOf
    ) -> list[str]:
        s, state = self.settings, self._advance(round_idx)
        durations = {c: times(c).total for c in self.sizes} if times is not None else {}
        prefer = preferred_duration(list(durations.values()), state["threshold"])

        def penalty(c: str) -> float:
            t = durations.get(c, 0.0)
            return (prefer / max(1e-4, t)) ** s.round_penalty if t > prefer else 1.0

        banned = self.blacklist()
        feasible = [c for c in candidates if c not in banned]
        explored = [c for c in feasible if self.client(c)["reported"] > 0]
        fresh = [c for c in feasible if self.client(c)["reported"] == 0]
        scores = self.scores(explored, round_idx, penalty)
        rng = self.rng(key)
        exploit_len = min(size - int(size * state["epsilon"]), len(explored))
        exploit = self._exploit(scores, exploit_len, rng)
        initial = {c: self.client(c)["samples"] * penalty(c) for c in fresh}
        explore = self._explore(initial, min(len(fresh), size - len(exploit)), rng)
        chosen = exploit + explore
        rest = sorted((c for c in explored if c not in chosen), key=lambda c: (-scores[c], c))
        chosen += rest[: size - len(chosen)]
        for c in feasible:
            self.client(c)["utility"] = scores.get(c, initial.get(c, math.nan))
        state["exploit"] = state["exploit"] + exploit
        return chosen

    def _exploit(self, scores: dict[str, float], k: int, rng: np.random.Generator) -> list[str]:
        """k clients drawn proportional to score among those of score >= c x the k-th highest."""
        if k <= 0:
            return []
        ranked = sorted(scores, key=lambda c: (-scores[c], c))
        cut = scores[ranked[k - 1]] * self.settings.cut_off
        pool = [c for c in ranked if scores[c] >= cut]
        return weighted_draw(rng, pool, [scores[c] for c in pool], k)

    def _explore(self, initial: dict[str, float], k: int, rng: np.random.Generator) -> list[str]:
        """k never-heard-from clients drawn proportional to data x penalty among the
        sample_window x k largest."""
        if k <= 0:
            return []
        ranked = sorted(initial, key=lambda c: (-initial[c], c))
        pool = ranked[: max(k, int(self.settings.sample_window * k))]
        return weighted_draw(rng, pool, [initial[c] for c in pool], k)


class PowerOfChoice(Selection):
    """Power-of-choice, rpow-d (module docstring)."""

    def pick(
        self, candidates: list[str], size: int, key: tuple, round_idx: int, times: TimesOf
    ) -> list[str]:
        d = min(len(candidates), self.settings.candidates or 2 * size)
        d = max(d, size)
        drawn = weighted_draw(
            self.rng(key), candidates, [float(self.sizes[c]) for c in candidates], d
        )

        def loss(c: str) -> float:
            value = self.client(c)["loss"]
            return math.inf if math.isnan(value) else value

        for c in drawn:
            self.client(c)["utility"] = loss(c)
        order = {c: i for i, c in enumerate(drawn)}
        return sorted(drawn, key=lambda c: (-loss(c), order[c]))[:size]


class FedCS(Selection):
    """FedCS's greedy choice (module docstring)."""

    @classmethod
    def clock_need(cls, settings: Any) -> ClockNeed:
        return ClockNeed("deadline", "chooses the clients predicted to meet the deadline")

    def pick(
        self, candidates: list[str], size: int, key: tuple, round_idx: int, times: TimesOf
    ) -> list[str]:
        assert times is not None
        return fedcs_greedy(
            {c: times(c) for c in candidates},
            size,
            self.cfg.system.deadline,
            self.settings.channel == "shared",
            lambda c, end: self.client(c).__setitem__("utility", end),
        )


def fedcs_greedy(
    times: dict[str, Times],
    size: int,
    deadline: float,
    shared: bool,
    note: Callable[[str, float], None] = lambda c, end: None,
) -> list[str]:
    """FedCS Alg. 2: repeatedly the client whose addition ends the predicted round earliest (ties:
    the first in `times`' order), kept when that end is within `deadline` (the paper passes over
    one that is not; every other client would end later still, so the choice stops there);
    `note(client, end)` records each kept client's predicted end. Shared channel: adding client c
    ends the round at max(end, update_c) + upload_c, so the best is the smallest upload among the
    clients whose update is done by `end`, or the smallest update + upload among the others: two
    heaps, O(n log n)."""
    order = {c: i for i, c in enumerate(times)}
    update = {c: t.total - t.up_s for c, t in times.items()}
    if not shared:  # (end = max over the chosen of their whole times: the fastest first)
        ranked = sorted(times, key=lambda c: (times[c].total, order[c]))
        chosen = [c for c in ranked[:size] if times[c].total <= deadline]
        for c in chosen:
            note(c, times[c].total)
        return chosen
    by_update = sorted(times, key=lambda c: (update[c], order[c]))
    ready: list[tuple[float, int, str]] = []  # (upload, order, client): update done by `end`
    waiting = [(update[c] + times[c].up_s, order[c], c) for c in times]
    heapq.heapify(waiting)
    moved, chosen, end, next_ready = set(), [], 0.0, 0
    while len(chosen) < size:
        while next_ready < len(by_update) and update[by_update[next_ready]] <= end:
            c = by_update[next_ready]
            if c not in chosen:
                heapq.heappush(ready, (times[c].up_s, order[c], c))
                moved.add(c)
            next_ready += 1
        while waiting and (waiting[0][2] in moved or waiting[0][2] in chosen):
            heapq.heappop(waiting)
        options = []
        if ready:
            options.append((end + ready[0][0], ready[0][1], ready[0][2], ready))
        if waiting:
            options.append((*waiting[0], waiting))
        if not options:
            break
        after, _, best, heap = min(options, key=lambda o: (o[0], o[1]))
        if after > deadline:
            break
        heapq.heappop(heap)
        chosen.append(best)
        end = after
        note(best, after)
    return chosen


def build_selection(cfg: Config, sizes: dict[str, int]) -> Selection:
    """The run's rule (`selection.method`, a plug-in's included)."""
    cls = SELECTORS.load(cfg.selection.method)
    return cls(cfg, sizes)
