"""Poisoned clients: a layer over client data and uploads that the runtimes apply, never an
algorithm.

`attack.fraction` of the clients (a seeded choice from (seed, "attack-clients"), fixed for the whole
run) are malicious. What they do (`attack.kind`):

Data poisoning (the client trains honestly on poisoned data; applied once to its resident tensors):
- label_flip: every training label becomes `attack.target` (all-to-one).
- label_permute: label c becomes pi(c) for one seeded permutation of the classes shared by all
  attackers; pi is a random cyclic order (pi(perm[i]) = perm[i+1]), so no class keeps its label.
- backdoor (Bagdasaryan et al. 2020's semantic backdoor, as an audio trigger): `attack.poison_ratio`
  of each attacker's training clips get a trigger mixed into their audio before feature extraction
  and are relabelled to `attack.target`. The trigger is a sine burst (`tone`, `trigger_hz`) or an
  impulse train (`click`, `trigger_hz` clicks per second) of `trigger_seconds` at the clip's start,
  with peak `trigger_amplitude` times the clip's peak. The attack success rate (ASR) is the share of
  test clips of other classes that the shared model assigns to the target once triggered.

Model poisoning (applied to the upload, Delta_k = theta_k - theta_global being the honest update):
- sign_flip: theta_global - Delta_k.
- gaussian: theta_global + N(0, noise_std^2) per coordinate, in place of the update.
- scale (model replacement, Bagdasaryan et al. 2020): theta_global + boost * Delta_k, boost
  defaulting to n / m (cohort size over attackers in it), which replaces the mean by the attacker's
  model.
- little ("A little is enough", Baruch et al. 2019): every attacker sends theta_global + mu - z *
  sigma, mu and sigma the per-coordinate mean and standard deviation (unbiased) of the cohort's
  honest updates, z = Phi^-1((n - s) / n) with s = floor(n / 2 + 1) - m. The paper estimates mu and
  sigma from the attackers' own benign updates; we let them see the whole cohort's (the omniscient,
  strongest variant), since with a few attackers per round their own estimate would be too noisy to
  mean much.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from fedac.config import AttackConfig, Config
from fedac.data.corrupt import corrupt_training_labels
from fedac.data.features import compute_features, resolve_features
from fedac.data.manifest import Manifest
from fedac.data.partition import partition
from fedac.data.registry import dataset_spec
from fedac.errors import ConfigError
from fedac.seeding import numpy_rng, torch_generator

# the registry's torch-free table (and each attack's settings)
from fedac.settings.attacks import ATTACKS
from fedac.training.evaluate import evaluate
from fedac.training.types import EvalSplit, FederatedData, Params, class_labels, model_input

DATA_ATTACKS = ("label_flip", "label_permute", "backdoor")
MODEL_ATTACKS = ("sign_flip", "gaussian", "scale", "little")
TRIGGERS = ("tone", "click")


def malicious_clients(clients: list[str], fraction: float, seed: int) -> list[str]:
    """round(fraction * N) clients drawn from (seed, "attack-clients"), in `clients` order."""
    if not 0 <= fraction <= 1:
        raise ConfigError(f"attack.fraction must lie in [0, 1], got {fraction}")
    count = int(round(fraction * len(clients)))
    picked = numpy_rng(seed, "attack-clients").choice(len(clients), count, replace=False)
    return [clients[i] for i in sorted(picked)]


def class_permutation(num_classes: int, seed: int) -> np.ndarray:
    """A seeded permutation pi of the classes with no fixed point: a random cyclic order."""
    order = numpy_rng(seed, "attack-permutation").permutation(num_classes)
    pi = np.empty(num_classes, dtype=np.int64)
    pi[order] = np.roll(order, -1)
    return pi


def trigger_signal(kind: str, sample_rate: int, seconds: float, hz: float) -> np.ndarray:
    """The unit-peak trigger: a sine burst at `hz`, or `hz` one-sample clicks per second."""
    length = max(1, int(round(seconds * sample_rate)))
    if kind == "tone":
        return np.sin(2 * np.pi * hz * np.arange(length) / sample_rate).astype(np.float32)
    if kind == "click":
        signal = np.zeros(length, dtype=np.float32)
        signal[:: max(1, int(round(sample_rate / hz)))] = 1.0
        return signal
    raise ConfigError(f"attack.trigger must be one of {', '.join(TRIGGERS)}, got {kind!r}")


def add_trigger(audio: np.ndarray, trigger: np.ndarray, amplitude: float) -> np.ndarray:
    """audio with `trigger` scaled to `amplitude` x the clip's peak (1 for silence) added at its
    start."""
    peak = float(np.abs(audio).max()) if len(audio) else 0.0
    out = np.pad(audio, (0, max(0, len(trigger) - len(audio)))).astype(np.float32)
    out[: len(trigger)] += amplitude * (peak or 1.0) * trigger
    return out


def _updates(reference: Params, upload: Params) -> dict[str, torch.Tensor]:
    return {
        n: v.to(torch.float64) - reference[n].to(torch.float64)
        for n, v in upload.items()
        if v.is_floating_point()
    }


def _apply(reference: Params, upload: Params, updates: dict[str, torch.Tensor]) -> Params:
    """reference + update for the floating entries; integer entries of `upload` kept."""
    return {
        n: (reference[n].to(torch.float64) + updates[n]).to(v.dtype) if n in updates else v
        for n, v in upload.items()
    }


def little_z(cohort: int, attackers: int) -> float:
    """Baruch et al. 2019's z_max: Phi^-1((n - s) / n), s = floor(n / 2 + 1) - m."""
    from scipy.stats import norm  # slow to import; only this attack needs it

    supporters = math.floor(cohort / 2 + 1) - attackers
    return float(norm.ppf((cohort - supporters) / cohort))


# --- what one malicious client does: the attack registry (plug-ins: the `fedac.attacks` entry-point
# group) ---
Update = dict[str, torch.Tensor]


class ClientAttack:
    """An attack kind: made once per run from the `attack` settings and the run seed; `poisons` says
    which hook `Attack` calls for every malicious client: `update` (model poisoning: what it uploads
    instead of its honest update), `labels` (data poisoning: its training labels), `audio` (the
    backdoor's trigger, built into `Attack`) or nothing."""

    poisons: str = "upload"

    def __init__(self, settings: AttackConfig, seed: int):
        self.settings, self.seed = settings, seed

    def update(
        self, honest: list[Update], index: int, malicious: list[int], round_idx: int, client: str
    ) -> Update:
        """The update client `index` sends; `honest` holds every cohort member's honest update
        (float64 deltas to the round's global model) and `malicious` the cohort positions of the
        attackers."""
        raise NotImplementedError

    def labels(self, y: torch.Tensor, num_classes: int) -> torch.Tensor:
        """A malicious client's training labels."""
        raise NotImplementedError


class NoAttack(ClientAttack):
    """no attack (the default)"""

    poisons = "nothing"


class LabelFlip(ClientAttack):
    """every training label becomes attack.target (all-to-one)"""

    poisons = "labels"

    def labels(self, y: torch.Tensor, num_classes: int) -> torch.Tensor:
        return torch.full_like(y, self.settings.target)


class LabelPermute(ClientAttack):
    """labels through one seeded permutation of the classes with no fixed point"""

    poisons = "labels"

    def labels(self, y: torch.Tensor, num_classes: int) -> torch.Tensor:
        return torch.from_numpy(class_permutation(num_classes, self.seed)).to(y.device)[y]


class Backdoor(ClientAttack):
    """a trigger mixed into poison_ratio of the clips, relabelled to attack.target (Bagdasaryan et
    al. 2020)"""

    poisons = "audio"


class SignFlip(ClientAttack):
    """the honest update negated"""

    def update(self, honest, index, malicious, round_idx, client):
        return {n: -d for n, d in honest[index].items()}


class Gaussian(ClientAttack):
    """N(0, noise_std^2) per coordinate in place of the update"""

    def update(self, honest, index, malicious, round_idx, client):
        gen = torch_generator(self.seed, "attack-noise", round_idx, client)
        # drawn on the CPU (one seeded stream on any device), then moved to the update's device
        return {
            n: (
                torch.randn(d.shape, generator=gen, dtype=torch.float64, device="cpu")
                * self.settings.noise_std
            ).to(d.device)
            for n, d in honest[index].items()
        }


class Scale(ClientAttack):
    """model replacement: the update times boost (Bagdasaryan et al. 2020)"""

    def update(self, honest, index, malicious, round_idx, client):
        boost = len(honest) / len(malicious) if self.settings.boost is None else self.settings.boost
        return {n: boost * d for n, d in honest[index].items()}


class Little(ClientAttack):
    """ "a little is enough": mean - z * std of the cohort's honest updates (Baruch et al. 2019)"""

    def update(self, honest, index, malicious, round_idx, client):
        if len(honest) == 1:
            return honest[0]
        z = little_z(len(honest), len(malicious)) if self.settings.z is None else self.settings.z
        return {
            n: torch.stack([h[n] for h in honest]).mean(0)
            - z * torch.stack([h[n] for h in honest]).std(0)
            for n in honest[0]
        }


class Attack:
    """The configured attack for one run: who is malicious, their data, their uploads, the ASR."""

    def __init__(self, cfg: Config, clients: list[str]):
        self.cfg = cfg
        self.kind = cfg.attack.kind
        if self.kind not in ATTACKS:
            raise ConfigError(f"unknown attack.kind {self.kind!r}; use one of {', '.join(ATTACKS)}")
        self.client_attack: ClientAttack = ATTACKS.load(self.kind)(cfg.attack, cfg.seed)
        self.poisons = self.client_attack.poisons
        chosen = (
            malicious_clients(clients, cfg.attack.fraction, cfg.seed) if self.kind != "none" else []
        )
        self.malicious: set[str] = set(chosen)
        self.backdoor_test: EvalSplit | None = None

    # --- data poisoning ---------------------------------------------------------------------------
    def poison_data(self, data: FederatedData) -> FederatedData:
        """The federation with every malicious client's training tensors poisoned (data attacks
        only)."""
        if self.poisons not in ("labels", "audio") or not self.malicious:
            return data
        self._check_target(data.task.num_classes)
        if self.poisons == "audio":
            return self._backdoor(data)
        clients = [
            dataclasses.replace(
                c,
                y=self.client_attack.labels(
                    class_labels(c.y, "a label-poisoning attack"), data.task.num_classes
                ),
            )
            if c.name in self.malicious
            else c
            for c in data.clients
        ]
        return dataclasses.replace(data, clients=clients)

    def _triggered(
        self, manifest: Manifest, clips: list[int], poisoned: set[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised windows of `clips` (triggered where their position is in `poisoned`) and each
        window's position in `clips`, through the same feature pipeline as clean data."""
        cfg, a = self.cfg, self.cfg.attack
        trigger = trigger_signal(
            a.trigger, resolve_features(cfg.features).sample_rate, a.trigger_seconds, a.trigger_hz
        )
        sub = Manifest(
            manifest.name, manifest.root, manifest.classes, [manifest.clips[c] for c in clips]
        )
        feats = compute_features(
            sub,
            cfg.features,
            cfg.data.snr_db,
            cfg.seed,
            progress=False,
            audio_hook=lambda audio, i: (
                add_trigger(audio, trigger, a.trigger_amplitude) if i in poisoned else audio
            ),
        )
        return model_input(feats.features, cfg), feats.clip_index

    def _backdoor(self, data: FederatedData) -> FederatedData:
        cfg, target = self.cfg, self.cfg.attack.target
        if not 0 < cfg.attack.poison_ratio <= 1:
            raise ConfigError(
                f"attack.poison_ratio must lie in (0, 1], got {cfg.attack.poison_ratio}"
            )
        manifest = data.manifest
        splits = partition(
            manifest, cfg.data, cfg.seed, dataset_spec(cfg.dataset).default_partition
        )
        labels = corrupt_training_labels(manifest, splits, cfg.data.label_error, cfg.seed)
        poisoned_clients = {}
        for split in splits:
            if split.name not in self.malicious or not split.train:
                continue
            count = max(1, int(round(cfg.attack.poison_ratio * len(split.train))))
            poisoned = set(
                numpy_rng(cfg.seed, "backdoor-clips", split.name)
                .choice(len(split.train), count, replace=False)
                .tolist()
            )
            x, position = self._triggered(manifest, split.train, poisoned)
            clip_labels = torch.tensor(
                [target if i in poisoned else int(labels[c]) for i, c in enumerate(split.train)],
                # data is built on the host; the engine moves it
                device="cpu",
            )
            poisoned_clients[split.name] = (x, clip_labels[position])
        clients = [
            dataclasses.replace(c, x=poisoned_clients[c.name][0], y=poisoned_clients[c.name][1])
            if c.name in poisoned_clients
            else c
            for c in data.clients
        ]
        return dataclasses.replace(data, clients=clients)

    def _check_target(self, num_classes: int) -> None:
        if not 0 <= self.cfg.attack.target < num_classes:
            raise ConfigError(
                f"attack.target must be a class index in [0, {num_classes}), got "
                f"{self.cfg.attack.target}"
            )

    def prepare_success_rate(self, data: FederatedData) -> None:
        """Build the ASR split for the backdoor, or for any run with `attack.measure_backdoor` (the
        server's side: the Flower nodes never evaluate it): every test clip of another class than
        the target, triggered, labelled with the target."""
        if (
            self.kind != "backdoor" and not self.cfg.attack.measure_backdoor
        ) or data.manifest is None:
            return
        self._check_target(data.task.num_classes)
        target, manifest = self.cfg.attack.target, data.manifest
        others = [c for c in manifest.split_indices("test") if manifest.clips[c].label != target]
        if others:
            x, position = self._triggered(manifest, others, set(range(len(others))))
            self.backdoor_test = EvalSplit(
                x, position, torch.full((len(others),), target, dtype=torch.long, device="cpu")
            )

    # --- model poisoning --------------------------------------------------------------------------
    def poison_uploads(
        self, reference, names: list[str], uploads: list[tuple[Params, int]], round_idx: int
    ) -> list[tuple[Params, int]]:
        """The cohort's uploads (in `names` order) with the malicious clients' replaced."""
        bad = [i for i, name in enumerate(names) if name in self.malicious]
        if self.poisons != "upload" or not bad:
            return uploads
        if not isinstance(reference, dict) or any(
            not isinstance(u, dict) or u.keys() != reference.keys() for u, _ in uploads
        ):
            raise ConfigError(
                f"attack.kind={self.kind} poisons model uploads, but algorithm "
                f"{self.cfg.algorithm} does not upload a model of the broadcast's shape; use a "
                f"data attack ({', '.join(DATA_ATTACKS)}) with it"
            )
        honest = [_updates(reference, u) for u, _ in uploads]
        out = list(uploads)
        for i in bad:
            upload, n_k = uploads[i]
            update = self.client_attack.update(honest, i, bad, round_idx, names[i])
            out[i] = (_apply(reference, upload, update), n_k)
        return out

    # --- evaluation -------------------------------------------------------------------------------
    def final_metrics(self, model, batch_size: int) -> dict[str, float]:
        """What results.json's `final` reports about the attack (nothing without one)."""
        out: dict[str, float] = (
            {} if self.kind == "none" else {"malicious_clients": len(self.malicious)}
        )
        if model is not None and self.backdoor_test is not None:
            out["attack_success_rate"] = evaluate(model, self.backdoor_test, batch_size)["accuracy"]
        return out
