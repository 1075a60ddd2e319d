"""FedMLAC (fedmlac.md Section 3.2): personalized client models and a shared Plug-in trained by
mutual learning (Algorithm 1), Plug-ins combined by Layer-wise Pruning Aggregation (Algorithm 2).

Client k keeps its own model omega_k (architecture fixed once per client: `model.client_model`, or a
seeded draw from `model.zoo` when heterogeneous) and receives the global Plug-in theta each round.
Per batch B, in Algorithm 1's order:

  omega <- omega - lr * grad[ alpha * CE(F_k(x), y) + (1 - alpha) * KL(p_theta || p_omega) ]  (6-8)
  theta <- theta - lr * grad[ KL(p_omega || p_theta) + plugin_ce_weight * CE(F_g(x), y) ]    (Eq. 9)

with KL(p || q) = sum_c p(c) log(p(c) / q(c)) (Eq. 5), the first argument being the teacher, whose
output is detached. Only theta (with n_k) is uploaded; omega never leaves the client.

Choices where the paper is silent (all config options under `fedmlac.`):
- alpha = 0.5: equal weight of CE and distillation, the balance of deep mutual learning (Eq. 4,
  lambda = 1).
- temperature = 1: Eq. 7 and 9 on plain softmax outputs; T > 1 softens both and scales KL by T^2
  (Hinton et al.) so gradient magnitudes stay comparable.
- plugin_ce_weight = 0: Eq. 9 as written, the Plug-in learns the labels only through omega.
- teacher = "pre_update": Alg. 1 line 13 evaluates grad L^g at (omega_{t+(i)}, theta_{t+(i)}), i.e.
  the teacher logits of omega computed before omega's step on the same batch are reused;
  "post_update" recomputes them with the freshly updated omega (one more forward pass).
- ml = false (`w/o ML`): omega on CE alone, theta on CE alone; lpa = false (`w/o LPA`): n_k-weighted
  mean.
- warmup_rounds = 0 (beyond the paper): rounds 1..W train as `w/o ML` before mutual learning starts.
- min_visits = 10: a run whose clients train fewer times than this (rounds x active ratio) warns:
  the Plug-in learns only through the clients' models (Eq. 9), which need many visits to become
  confident teachers (README, FedMLAC section, for the measurements).
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import torch
from torch import nn

from fedac.algorithms.base import (
    Algorithm,
    ClientData,
    ClientResult,
    Params,
    model_params,
    reproduces,
)
from fedac.algorithms.mutual import distillation_kl, personalized_loss, plugin_loss  # noqa: F401 (FedMLAC's API)
from fedac.errors import ConfigError
from fedac.models.stacked import stack_params
from fedac.training.functional import StackedStep
from fedac.training.local import client_batches, clip_gradients, make_optimizer
from fedac.training.stacking import (
    CohortChunk,
    OnDevices,
    broadcast_params,
    group_positions,
    train_chunks,
)

log = logging.getLogger(__name__)


def expected_visits(cfg, num_clients: int) -> float:
    """Rounds in which an average client trains: rounds x cohort size / clients
    (engine.sample_cohort)."""
    cohort = max(1, int(round(cfg.train.fraction * num_clients)))
    return cfg.train.rounds * min(cohort, num_clients) / max(num_clients, 1)


def warn_if_few_visits(cfg, num_clients: int) -> None:
    """Mutual learning bootstraps slowly: a client's model must become a confident teacher before
    the Plug-in learns from it (Eq. 9 has no label term). Warn when a client trains too rarely for
    that."""
    visits = expected_visits(cfg, num_clients)
    # (0 clients: not known here, e.g. a Flower server whose clients are whatever devices connect.)
    if cfg.fedmlac.ml and num_clients and visits < cfg.fedmlac.min_visits:
        log.warning(
            "FedMLAC: each client trains in about %.1f of %d rounds (%d clients, "
            "train.fraction=%s); mutual learning needs about %d visits per client to bootstrap, so "
            "expect a Plug-in near chance. Raise train.rounds or train.fraction, or lower "
            "data.max_clients (or set fedmlac.min_visits to silence this).",
            visits,
            cfg.train.rounds,
            num_clients,
            cfg.train.fraction,
            cfg.fedmlac.min_visits,
        )


class FedMLAC(Algorithm):
    name = "fedmlac"
    personalized = True
    dp_compatible = True  # its Plug-in is the aggregate (with fedmlac.lpa=false: the plain mean)
    lpa_setting = "fedmlac.lpa"

    def __init__(self, cfg, task, runtime=None):
        super().__init__(cfg, task, runtime)
        if not 0 <= cfg.fedmlac.alpha <= 1:
            raise ConfigError(f"fedmlac.alpha must lie in [0, 1], got {cfg.fedmlac.alpha}")
        if cfg.fedmlac.temperature <= 0:
            raise ConfigError(f"fedmlac.temperature must be > 0, got {cfg.fedmlac.temperature}")
        if cfg.fedmlac.warmup_rounds < 0:
            raise ConfigError(
                f"fedmlac.warmup_rounds must be >= 0, got {cfg.fedmlac.warmup_rounds}"
            )
        warn_if_few_visits(cfg, len(task.clients))

    def mutual(self, round_idx: int) -> bool:
        """Whether round `round_idx` trains by mutual learning (Eq. 8-9) or by CE alone (`w/o ML`,
        and the rounds of `fedmlac.warmup_rounds`)."""
        return self.cfg.fedmlac.ml and round_idx > self.cfg.fedmlac.warmup_rounds

    def init_server(self) -> dict[str, Any]:
        return {"params": self.initial_params(self.cfg.fedmlac.plugin_model, "plugin-init")}

    def client_update(
        self,
        payload: Params,
        state: Params,
        data: ClientData,
        round_idx: int,
        generator: torch.Generator,
    ) -> ClientResult:
        opts = self.cfg.fedmlac
        mutual = self.mutual(round_idx)
        omega = self.scratch_model(self.client_architecture(data.name), state, role="personal")
        theta = self.scratch_model(opts.plugin_model, payload, role="plugin")
        omega.train(), theta.train()
        opt_omega = make_optimizer(omega.parameters(), self.cfg.train)
        opt_theta = make_optimizer(theta.parameters(), self.cfg.train)
        # (tensors: no host sync)
        sums: dict[str, float | torch.Tensor] = {"loss": 0.0, "plugin_loss": 0.0}
        steps = 0
        for idx in client_batches(data.num_samples, self.cfg.train, generator):
            x, y = data.x[idx], data.y[idx]
            # Personalized model step (Eq. 8), the Plug-in as a fixed teacher.
            omega_logits = omega(x)
            with torch.no_grad():
                theta_teacher = theta(x) if mutual else None
            loss_omega = personalized_loss(
                omega_logits, theta_teacher, y, opts.alpha, opts.temperature, mutual
            )
            opt_omega.zero_grad(set_to_none=True)
            loss_omega.backward()
            clip_gradients(omega, self.cfg.train)
            opt_omega.step()
            # Plug-in step (Eq. 9), the personalized model as the teacher.
            if opts.teacher == "post_update":
                with torch.no_grad():
                    omega_logits = omega(x)
            loss_theta = plugin_loss(
                theta(x), omega_logits.detach(), y, opts.temperature, opts.plugin_ce_weight, mutual
            )
            opt_theta.zero_grad(set_to_none=True)
            loss_theta.backward()
            clip_gradients(theta, self.cfg.train)
            opt_theta.step()
            sums["loss"] += loss_omega.detach().double()
            sums["plugin_loss"] += loss_theta.detach().double()
            steps += 1
        metrics = {k: float(v) / max(steps, 1) for k, v in sums.items()}  # read once per update
        return ClientResult(model_params(theta), model_params(omega), metrics)

    def stacked_architectures(self) -> list[str]:
        # the clients' and the Plug-in
        return [*super().stacked_architectures(), self.cfg.fedmlac.plugin_model]

    @reproduces(client_update)
    def cohort_update(
        self,
        payload: Params,
        states: list[Params],
        datas: list[ClientData],
        round_idx: int,
        seed: int,
    ) -> list[ClientResult]:
        """FedMLAC's client update (Algorithm 1: personalized step, then Plug-in step, per batch)
        for a whole cohort, one stacked group per personalized architecture."""

        cfg, opts = self.cfg.train, self.cfg.fedmlac
        theta_model = self.stacked_forward(opts.plugin_model)
        mutual = self.mutual(round_idx)
        results: list[ClientResult | None] = [None] * len(datas)
        payloads = OnDevices(payload)
        for arch, positions in group_positions(
            [self.client_architecture(d.name) for d in datas]
        ).items():
            train = partial(
                _train_mutual_chunk,
                self.stacked_forward(arch),
                theta_model,
                payloads,
                states,
                cfg,
                opts,
                mutual,
            )
            for position, result in train_chunks(
                self, train, [datas[i] for i in positions], positions, arch, round_idx, seed
            ):
                results[position] = result
        return results  # type: ignore[return-value]

    def server_update(
        self, server: dict[str, Any], uploads: list[tuple[Params, int]], round_idx: int
    ) -> tuple[dict[str, Any], dict[str, float]]:
        params, metrics = self.combine(server, uploads, use_lpa=self.cfg.fedmlac.lpa)
        return {**server, "params": params}, metrics

    def global_model(self, server: dict[str, Any]) -> nn.Module:
        return self.scratch_model(self.cfg.fedmlac.plugin_model, server["params"], role="plugin")


def _mutual_step(omega_model, theta_model, omega, theta, chunk: CohortChunk, step, opts, mutual):
    """One batch of Algorithm 1 for every client of a chunk: the personalized step (Eq. 8), the
    Plug-in as a fixed teacher, then the Plug-in step (Eq. 9), the personalized model as the
    teacher. Returns both losses, one per client still training."""
    x, y = chunk.batch(step)
    active, weight, masks = step.active, step.weight, chunk.dropout(step)
    # Personalized model step (Eq. 8), the Plug-in as a fixed teacher.
    leaf, state = omega.leaves(active)
    omega_logits = omega_model(state, x, masks, weight)
    theta_teacher = None
    if mutual:
        with torch.no_grad():
            theta_teacher = theta_model(theta.frozen(active), x, masks, weight)
    loss_omega = personalized_loss(
        omega_logits, theta_teacher, y, opts.alpha, opts.temperature, mutual, weight
    )
    omega.update(loss_omega, leaf, active)
    # Plug-in step (Eq. 9), the personalized model as the teacher.
    if opts.teacher == "post_update":
        with torch.no_grad():
            omega_logits = omega_model(omega.frozen(active), x, masks, weight)
    leaf, state = theta.leaves(active)
    loss_theta = plugin_loss(
        theta_model(state, x, masks, weight),
        omega_logits.detach(),
        y,
        opts.temperature,
        opts.plugin_ce_weight,
        mutual,
        weight,
    )
    theta.update(loss_theta, leaf, active)
    return loss_omega, loss_theta


def _train_mutual_chunk(
    omega_model,
    theta_model,
    payloads: OnDevices,
    states: list[Params],
    cfg,
    opts,
    mutual: bool,
    chunk: CohortChunk,
) -> list[tuple[int, ClientResult]]:
    """One chunk of a cohort whose personalized models share `omega_model`'s architecture: every
    step of Algorithm 1 on the stacked models, then each client's Plug-in, personalized model and
    mean losses."""
    stacked = stack_params([states[i] for i in chunk.positions])
    # (no copy on the states' device)
    stacked = {name: value.to(chunk.device) for name, value in stacked.items()}
    omega, theta = (
        StackedStep(omega_model, stacked, cfg),
        StackedStep(theta_model, broadcast_params(payloads(chunk.device), len(chunk)), cfg),
    )
    sums = torch.zeros(2, len(chunk), dtype=torch.float64, device=chunk.device)
    for step in chunk.steps:
        loss_omega, loss_theta = _mutual_step(
            omega_model, theta_model, omega, theta, chunk, step, opts, mutual
        )
        sums[0, : step.active] += loss_omega.detach()
        sums[1, : step.active] += loss_theta.detach()
    out = []
    losses, plugin_losses = sums.tolist()  # one host sync a chunk
    for k, position in enumerate(chunk.positions):
        steps = chunk.client_steps[k]
        out.append(
            (
                position,
                ClientResult(
                    theta.client(k),
                    omega.client(k),
                    {"loss": losses[k] / steps, "plugin_loss": plugin_losses[k] / steps},
                ),
            )
        )
    return out
