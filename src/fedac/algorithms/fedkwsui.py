"""FedKWS-UI (Li et al., Interspeech 2022, "Avoid Overfitting User Specific Information in Federated
Keyword Spotting"): FedAvg plus ALO (adversarial learning against overfitted models, Eq. 1-3) and
ALT (adaptive local training, Sec. 4), as the paper writes them and its official code runs them.

The model is a shared encoder h = f(x) with two heads (code `CifNet`):
global g(h) = W_g ReLU(P_g h) + b_g with P_g: h -> int(2 h g_ratio), private p(h) = W_p ReLU(P_p h)
+ b_p with P_p: h -> int(2 h (1 - g_ratio)) (no bias on P; g_ratio 0.6 gives 1.2 h and 0.8 h). The
  shared
model evaluated on val/test is the encoder with the global head.

Per sampled client k and round:
1. Private phase (skipped when lambda = 0): floor(private_ratio * E) + 1 steps of CE on the private
   head; the encoder's gradients are dropped, so only the private head learns (BatchNorm running
   statistics still move, as in the code).
2. Global phase, s_k steps (ALT) of Eq. 3:
       L = CE_ls(g(h), y; mu_k) - lambda * mean_i[ -sum_c pi_ic log softmax(g(h_i))_c ],
   pi = softmax(p(h)) detached (Eq. 2, negative distillation), CE_ls the label-smoothed CE of Eq. 1
   with target (1 - mu_k) onehot + mu_k / C.
3. Upload the whole model; the server takes the unweighted mean of every entry (Sec. 3;
   `fedkwsui.aggregation`).

ALT (Sec. 4): with class counts c_k, n_k = sum c_k, q = c_k / n_k,
    w1 = min(n_k / cap, 1), w2 = -sum_c q_c ln(q_c + 1e-8) / ln C, rbar_k = 2 w1 w2 / (w1 + w2),
    s_k = floor(r0 * rbar_k * E).
A client with s_k = 0 still uploads (its private phase changed the private head and BN statistics).

Where the paper and the code differ, the code's reading is the default and the paper's an option
(`fedkwsui.` settings): mu_k = ls_mu (1 - rbar_k) (code) vs a constant mu (Eq. 1,
`adaptive_mu=false`); cap = 100 / 300 on 12- / 35-class Speech Commands (code) vs max_j n_j (text,
`size_cap=max`); r0 = 3.5 / 5.0 (code and Sec. 5) vs K / sum_k rbar_k (Sec. 4's conservation rule,
`r0=sum`); the private head averaged with everything else (code) vs kept per client (text's psi_p^k,
`private=persistent`, held as the client's explicit persistent state so it works in the simulator
and on Flower). Other choices: the 1e-8 inside the entropy's log is the code's (it makes 12 equal
counts give s = 174, not 175); the encoder's gradients in the private phase are never formed (its
forward runs without autograd), so SGD's weight decay does not touch the encoder there (the code
zeroes them, which lets a 1e-5 decay through).
The heads keep PyTorch's default initialisation, as the code's do; `fedkwsui.head_init=kaiming`
gives them Kaiming-normal weights (config.py says why: the default shrinks the encoder's gradient
4-7x). Every step's gradient is clipped at `train.max_grad_norm` (fedkwsui's algorithm default: the
code's 50). The stacked form is `FedKWSUI.cohort_update` below (any of the four
networks, through training/functional.py; ALT's per-client step counts as a chunk whose active
clients shrink).
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from fedac.algorithms.base import (
    Algorithm,
    ClientData,
    ClientResult,
    Params,
    Task,
    model_params,
    reproduces,
)
from fedac.errors import ConfigError
from fedac.models import build_model
from fedac.models.base import EmbeddingModel
from fedac.seeding import torch_generator
from fedac.training.functional import StackedStep, stacked_optimizer
from fedac.training.local import (
    clip_gradients,
    cross_entropy,
    cycling_batches,
    make_optimizer,
    on_device,
)
from fedac.training.stacking import CohortChunk, OnDevices, broadcast_params, run_chunks
from fedac.training.types import class_labels, feature_windows

#: The code's constants for Speech Commands (fedkwsui.py): classes -> (size cap, r0).
SPEECH_COMMANDS_ALT = {12: (100.0, 3.5), 35: (300.0, 5.0)}
PRIVATE = "private_"
HEAD_INITS = ("default", "kaiming")
AGGREGATIONS = ("uniform", "weighted", "general")


# --- ALT ------------------------------------------------------------------------------------------
def normalized_entropy(counts: list[int] | torch.Tensor) -> float:
    """-sum_c q_c ln(q_c + 1e-8) / ln C of a client's class counts (Sec. 4, e_k; 1e-8 as the
    code)."""
    c = torch.as_tensor(counts, dtype=torch.float64)
    total = float(c.sum())
    if total == 0 or len(c) < 2:
        return 0.0
    q = c / total
    # Clamped at 0: one class gives -ln(1 + 1e-8) < 0 (in the code too, where it also means no
    # steps).
    return max(float(-(q * torch.log(q + 1e-8)).sum() / math.log(len(c))), 0.0)


def alt_ratio(counts: list[int] | torch.Tensor, size_cap: float) -> float:
    """rbar_k: harmonic mean of min(n_k / cap, 1) and the normalised class entropy (0 when both are
    0)."""
    w1 = min(float(sum(int(v) for v in counts)) / size_cap, 1.0)
    w2 = normalized_entropy(counts)
    return 2 * w1 * w2 / (w1 + w2) if w1 + w2 > 0 else 0.0


def alt_steps(ratio: float, r0: float, base_steps: int) -> int:
    """s_k = floor(r0 * rbar_k * E) local steps."""
    return int(math.floor(r0 * ratio * base_steps))


def adaptive_mu(ls_mu: float, ratio: float) -> float:
    """The code's mu_k = ls_mu * (1 - rbar_k): less smoothing for qualified clients."""
    return ls_mu * (1.0 - ratio)


# --- ALO ------------------------------------------------------------------------------------------
def smoothed_cross_entropy(logits: torch.Tensor, y: torch.Tensor, mu: float) -> torch.Tensor:
    """Eq. 1: batch mean of -sum_c [(1 - mu) 1{y = c} + mu / C] log softmax(logits)_c."""
    target = F.one_hot(y, logits.shape[-1]).to(logits.dtype) * (1.0 - mu) + mu / logits.shape[-1]
    return -(target * logits.log_softmax(dim=-1)).sum(dim=-1).mean()


def distillation_cross_entropy(
    global_logits: torch.Tensor, private_logits: torch.Tensor
) -> torch.Tensor:
    """mean_i[-sum_c pi_ic log softmax(g_i)_c] with pi = softmax(private) detached; Eq. 2 is its
    negative."""
    teacher = private_logits.detach().softmax(dim=-1)
    return -(teacher * global_logits.log_softmax(dim=-1)).sum(dim=-1).mean()


def alo_loss(
    global_logits: torch.Tensor,
    private_logits: torch.Tensor,
    y: torch.Tensor,
    mu: float,
    adv_lambda: float,
) -> torch.Tensor:
    """Eq. 3: L_ls + lambda * L_adv = CE_ls(g; mu) - lambda * CE(pi, g)."""
    loss = smoothed_cross_entropy(global_logits, y, mu)
    if adv_lambda:
        loss = loss - adv_lambda * distillation_cross_entropy(global_logits, private_logits)
    return loss


class TwoHeadModel(nn.Module):
    """A network's encoder (`embed`) with FedKWS-UI's global and private heads; `forward` is the
    global one."""

    def __init__(
        self,
        network: EmbeddingModel,
        num_classes: int,
        g_ratio: float = 0.6,
        head_init: str = "default",
    ):
        super().__init__()
        network.head = nn.Identity()  # replaced by the two heads (and not counted as parameters)
        self.encoder: EmbeddingModel = network
        h = network.embedding_dim
        global_width, private_width = int(2.0 * h * g_ratio), int(2.0 * h * (1.0 - g_ratio))
        if global_width < 1 or private_width < 1:
            raise ConfigError(
                f"fedkwsui.g_ratio must lie in (0, 1) and leave both heads a unit, got {g_ratio}"
            )
        self.global_proj = nn.Linear(h, global_width, bias=False)
        self.global_head = nn.Linear(global_width, num_classes)
        self.private_proj = nn.Linear(h, private_width, bias=False)
        self.private_head = nn.Linear(private_width, num_classes)
        self.embedding_dim = h
        # redrawn from the same (seeded) RNG stream the constructor drew from
        if head_init == "kaiming":
            for layer in (self.global_proj, self.global_head, self.private_proj, self.private_head):
                nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")
                if layer.bias is not None:
                    nn.init.zeros_(layer.bias)
        elif head_init != "default":
            raise ConfigError(
                f"fedkwsui.head_init must be one of {', '.join(HEAD_INITS)}, got {head_init!r}"
            )

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder.embed(x)

    def global_logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.global_head(F.relu(self.global_proj(h)))

    def private_logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.private_head(F.relu(self.private_proj(h)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.global_logits(self.embed(x))


def _setting(text: str, key: str, words: tuple[str, ...]) -> str | float:
    """A setting that is a positive number or one of `words`."""
    if str(text).lower() in words:
        return str(text).lower()
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise ConfigError(
            f"{key} must be a positive number or one of {', '.join(words)}, got {text!r}"
        )
    return value


class FedKWSUI(Algorithm):
    name = "fedkwsui"
    # (the server takes combine's mean of whole models, then keeps its private heads)
    sums_uploads = True
    # (its two heads wrap a feature network's embedding)
    trains_ssl_encoders = False
    partial_work = "fedkwsui plans its own steps (its private model's and the shared one's)"

    def __init__(self, cfg, task, runtime=None):
        super().__init__(cfg, task, runtime)
        opts = cfg.fedkwsui
        if opts.private not in ("shared", "persistent"):
            raise ConfigError(
                f"fedkwsui.private must be shared or persistent, got {opts.private!r}"
            )
        if opts.aggregation not in AGGREGATIONS:
            raise ConfigError(
                "fedkwsui.aggregation must be uniform, weighted or general, got "
                f"{opts.aggregation!r}"
            )
        if opts.head_init not in HEAD_INITS:
            raise ConfigError(
                f"fedkwsui.head_init must be one of {', '.join(HEAD_INITS)}, got {opts.head_init!r}"
            )
        if not 0 <= opts.ls_mu <= 1:
            raise ConfigError(f"fedkwsui.ls_mu must lie in [0, 1], got {opts.ls_mu}")
        if opts.adv_lambda < 0:
            raise ConfigError(
                "fedkwsui.adv_lambda must be >= 0 (Eq. 2 already carries the minus), got "
                f"{opts.adv_lambda}"
            )
        if opts.local_steps < 1:
            raise ConfigError(f"fedkwsui.local_steps (E) must be >= 1, got {opts.local_steps}")
        if task.class_counts is None:
            raise ConfigError(
                "fedkwsui needs every client's class counts (Task.class_counts) for ALT; build the "
                "task with engine.data.build_federated_data"
            )
        self.size_cap, r0 = self.alt_constants(task.class_counts)
        self.ratios = {
            c: alt_ratio(n, self.size_cap) for c, n in zip(task.clients, task.class_counts)
        }
        # the paper's conservation rule, K / sum rbar_k, over the clients that hold data
        if r0 is None:
            held = [self.ratios[c] for c, n in zip(task.clients, task.class_counts) if sum(n)]
            r0 = len(held) / sum(held) if sum(held) > 0 else 1.0
        self.r0: float = r0

    def alt_constants(self, class_counts: list[list[int]]) -> tuple[float, float | None]:
        """(size cap, r0) after resolving auto / max / sum (r0 None: K / sum rbar, computed by the
        caller); `class_counts` is the task's (checked present by the constructor)."""
        opts, task = self.cfg.fedkwsui, self.task
        cap = _setting(opts.size_cap, "fedkwsui.size_cap", ("auto", "max"))
        r0 = _setting(opts.r0, "fedkwsui.r0", ("auto", "sum"))
        known = (
            SPEECH_COMMANDS_ALT.get(task.num_classes)
            if self.cfg.dataset == "speech_commands"
            else None
        )
        if cap == "auto":
            cap = known[0] if known else "max"
        if cap == "max":
            cap = float(max((sum(n) for n in class_counts), default=0)) or 1.0
        if r0 == "auto":
            r0 = known[1] if known else "sum"
        return float(cap), None if r0 == "sum" else float(r0)

    # --- models ---------------------------------------------------------------------------------
    def build_network(self, name: str) -> TwoHeadModel:
        # the zoo's networks are EmbeddingModels (models/base.py); a plug-in needs embed, head,
        # embedding_dim
        network = cast(
            EmbeddingModel,
            build_model(
                name, self.task.num_features, self.task.num_classes, self.cfg.model.dropout
            ),
        )
        return TwoHeadModel(
            network, self.task.num_classes, self.cfg.fedkwsui.g_ratio, self.cfg.fedkwsui.head_init
        )

    def init_server(self) -> dict[str, Any]:
        return {"params": self.initial_params(self.cfg.model.name, "global-init")}

    def init_client_state(self, client: str) -> Params | None:
        """`private=persistent`: the client's own private head (seeded per client); shared: no
        state."""
        if self.cfg.fedkwsui.private != "persistent":
            return None
        params = self.initial_params(self.cfg.model.name, "client-init", client)
        return {k: v for k, v in params.items() if k.startswith(PRIVATE)}

    # --- client -----------------------------------------------------------------------------------
    def client_plan(self, client: str) -> dict[str, float]:
        """This client's rbar_k, mu_k and global-phase steps s_k."""
        opts = self.cfg.fedkwsui
        ratio = self.ratios[client]
        steps = alt_steps(ratio, self.r0, opts.local_steps) if opts.alt else opts.local_steps
        mu = adaptive_mu(opts.ls_mu, ratio) if opts.adaptive_mu else opts.ls_mu
        return {"ratio": ratio, "mu": mu, "steps": steps}

    def scratch_model(
        self, name: str, params: Params | None = None, role: str = "global"
    ) -> TwoHeadModel:
        # built by build_network above
        return cast(TwoHeadModel, super().scratch_model(name, params, role))

    def _step(self, model: nn.Module, optimizer: torch.optim.Optimizer, loss: torch.Tensor) -> None:
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        clip_gradients(model, self.cfg.train)
        optimizer.step()

    def client_update(
        self,
        payload: Params,
        state: Params | None,
        data: ClientData,
        round_idx: int,
        generator: torch.Generator,
    ) -> ClientResult:
        opts, batch = self.cfg.fedkwsui, self.cfg.train.batch_size
        # (never padded waveforms: a waveform task has no Task.class_counts, which ALT needs)
        x, y = feature_windows(data.x, "FedKWS-UI"), class_labels(data.y, "FedKWS-UI")
        model = self.scratch_model(self.cfg.model.name, payload)
        if state is not None:
            model.load_state_dict(state, strict=False)  # the client's own private head
        plan = self.client_plan(data.name)
        model.train()
        private_loss: float | torch.Tensor = 0.0  # summed as tensors (no host sync per step)
        private_steps = 0
        if opts.adv_lambda:
            optimizer = make_optimizer(model.parameters(), self.cfg.train)
            private = cycling_batches(
                data.num_samples, batch, int(opts.private_ratio * opts.local_steps) + 1, generator
            )
            for idx in on_device(private, data.x):
                # The encoder's gradients are dropped here, so its backward pass is never run: the
                # encoder forward (BatchNorm statistics included) runs without autograd. Same
                # numbers, and a private step costs about a third of a global one.
                with torch.no_grad():
                    h = model.embed(x[idx])
                loss = F.cross_entropy(model.private_logits(h), y[idx])
                self._step(model, optimizer, loss)
                private_loss += loss.detach().double()
                private_steps += 1
        optimizer = make_optimizer(model.parameters(), self.cfg.train)
        total: float | torch.Tensor = 0.0
        steps = 0
        for idx in on_device(
            cycling_batches(data.num_samples, batch, int(plan["steps"]), generator), data.x
        ):
            h = model.embed(x[idx])
            loss = alo_loss(
                model.global_logits(h),
                model.private_logits(h),
                y[idx],
                plan["mu"],
                opts.adv_lambda,
            )
            self._step(model, optimizer, loss)
            total += loss.detach().double()
            steps += 1
        params = model_params(model)
        new_state = (
            {k: v for k, v in params.items() if k.startswith(PRIVATE)}
            if state is not None
            else None
        )
        metrics = {
            "loss": float(total) / steps if steps else float("nan"),
            "steps": float(steps),
            "private_loss": float(private_loss) / max(private_steps, 1),
            "private_steps": float(private_steps),
            "alt_ratio": plan["ratio"],
            "mu": plan["mu"],
        }
        return ClientResult(params, new_state, metrics)

    @reproduces(client_update)
    def cohort_update(
        self,
        payload: Params,
        states: list[Params | None],
        datas: list[ClientData],
        round_idx: int,
        seed: int,
    ) -> list[ClientResult]:
        """FedKWS-UI's client update (`client_update`: the private phase, then ALT's s_k global
        steps of the ALO loss) for a whole cohort. Every client's batches are drawn from its own
        generator in the sequential order (private phase first); clients are sorted by total steps
        so those still training are a prefix (ALT gives each client its own count); the optimiser
        starts afresh with the global phase."""
        cfg, opts, arch = self.cfg.train, self.cfg.fedkwsui, self.cfg.model.name
        forward = self.stacked_forward(arch)
        private_steps = int(opts.private_ratio * opts.local_steps) + 1 if opts.adv_lambda else 0
        plans = [self.client_plan(d.name) for d in datas]
        batches = _cohort_batches(datas, plans, private_steps, cfg.batch_size, round_idx, seed)
        order = sorted(range(len(datas)), key=lambda i: -len(batches[i]))
        payloads = OnDevices(payload)
        results: list[ClientResult | None] = [None] * len(datas)

        def train(chunk: CohortChunk) -> list[tuple[int, ClientResult]]:
            params = broadcast_params(payloads(chunk.device), len(chunk))
            # `private=persistent`: each client's own private head
            for k, position in enumerate(chunk.positions):
                for name, value in (states[position] or {}).items():
                    params[name][k].copy_(value)
            model = StackedStep(forward, params, cfg)
            mus = torch.tensor([plans[i]["mu"] for i in chunk.positions], device=chunk.device)
            sums = _chunk_losses(forward, model, params, chunk, mus, private_steps, opts, cfg)
            return _chunk_results(model, chunk, sums, plans, states, private_steps)

        size = self.packing.fixed_chunk
        chunks = (
            CohortChunk(
                [order[i] for i in part],
                [datas[order[i]] for i in part],
                cfg,
                round_idx,
                seed,
                [batches[order[i]] for i in part],
            )
            for part in (range(j, min(j + size, len(order))) for j in range(0, len(order), size))
        )
        workers = self.runtime.workers
        for position, result in run_chunks(
            train, chunks, self.cfg.runtime, self.device, self.devices, workers=workers
        ):
            results[position] = result
        return results  # type: ignore[return-value]

    # --- server -----------------------------------------------------------------------------------
    @classmethod
    def server_weighting(cls, cfg) -> str:
        """`fedkwsui.aggregation` uniform (1/|S| each, Sec. 3) or weighted (n_k) replaces
        `aggregation.weighting`; general keeps it (one weighting for every method of a table)."""
        choice = cfg.fedkwsui.aggregation
        return {"uniform": "uniform", "weighted": "n_k"}.get(choice, cfg.aggregation.weighting)

    def server_update(
        self, server: dict[str, Any], uploads: list[tuple[Params, int]], round_idx: int
    ) -> tuple[dict[str, Any], dict[str, float]]:
        params, metrics = self.combine(server, uploads)
        if self.cfg.fedkwsui.private == "persistent":  # private heads stay on the clients
            params.update({k: v for k, v in server["params"].items() if k.startswith(PRIVATE)})
        return {**server, "params": params}, metrics


def alt_statistics(
    cfg, num_classes: int, clients: list[str], counts: list[list[int]]
) -> dict[str, float]:
    """Paper Fig. 1's colour: r0 * rbar_k over the clients with data, under `cfg.fedkwsui`'s ALT
    constants, with the max n_k of Table 1, the resolved cap and r0 (for `fedac data stats`), and
    the mean ALT steps floor(r0 rbar_k E) per client against E: Sec. 4's rule sum_k r0 rbar_k E = K
    E makes the mean r0 * rbar_k 1 and the mean steps E less the flooring."""
    algo = FedKWSUI(cfg, Task(0, num_classes, clients, counts))
    held = [c for c, n in zip(clients, counts) if sum(n)]
    values = [algo.r0 * algo.ratios[c] for c in held]
    if not values:
        return {}
    steps = cfg.fedkwsui.local_steps
    return {
        "size_cap": algo.size_cap,
        "r0": algo.r0,
        "max_n_k": float(max(sum(n) for n in counts)),
        "min": min(values),
        "median": float(torch.tensor(values).median()),
        "mean": sum(values) / len(values),
        "max": max(values),
        "local_steps": float(steps),
        "mean_steps": sum([alt_steps(algo.ratios[c], algo.r0, steps) for c in held]) / len(held),
    }


def _cohort_batches(
    datas: list[ClientData],
    plans: list[dict],
    private_steps: int,
    batch_size: int,
    round_idx: int,
    seed: int,
) -> list[list]:
    """Each client's batches in the sequential path's order: the private phase's, then ALT's
    global steps, all drawn from the client's own generator."""
    batches = []
    for d, plan in zip(datas, plans):
        gen = torch_generator(seed, "batches", round_idx, d.name)
        batches.append(
            list(cycling_batches(d.num_samples, batch_size, private_steps, gen))
            + list(cycling_batches(d.num_samples, batch_size, int(plan["steps"]), gen))
        )
    return batches


def _chunk_losses(
    forward,
    model: StackedStep,
    params: Params,
    chunk: CohortChunk,
    mus: torch.Tensor,
    private_steps: int,
    opts,
    cfg,
) -> torch.Tensor:
    """Every step of a chunk: the private phase trains only the private heads on the frozen
    encoder's embeddings, then the global phase trains everything on the ALO loss with a fresh
    optimiser. Returns the summed losses, (private, global) x client, in float64."""
    sums = torch.zeros(2, len(chunk), dtype=torch.float64, device=chunk.device)
    for s, step in enumerate(chunk.steps):
        x, y = chunk.batch(step)
        active, weight, masks = step.active, step.weight, chunk.dropout(step)
        if s == private_steps:  # the global phase's optimiser is new, as the sequential path's
            model.optimizer = stacked_optimizer({n: params[n] for n in forward.param_names}, cfg)
        if s < private_steps:  # only the private head learns: the encoder runs without autograd
            with torch.no_grad():
                h = forward(model.frozen(active), x, masks, weight, "embed")
            leaf, state = model.leaves(active)
            loss = cross_entropy(forward(state, h, None, weight, "private_logits"), y, weight)
        else:
            leaf, state = model.leaves(active)
            h = forward(state, x, masks, weight, "embed")
            loss = _alo_loss(
                forward(state, h, None, weight, "global_logits"),
                forward(state, h, None, weight, "private_logits"),
                y,
                weight,
                mus[:active],
                opts.adv_lambda,
            )
        model.update(loss, leaf, active)
        sums[int(s >= private_steps), :active] += loss.detach()
    return sums


def _chunk_results(
    model: StackedStep,
    chunk: CohortChunk,
    sums: torch.Tensor,
    plans: list[dict],
    states: list[Params | None],
    private_steps: int,
) -> list[tuple[int, ClientResult]]:
    """Each client's trained parameters, its private head when it keeps one, and its metrics: the
    mean loss of each phase, the step counts and ALT's ratio and mu."""
    out = []
    private_sums, global_sums = sums.tolist()  # one host sync a chunk
    for k, position in enumerate(chunk.positions):
        plan, steps = plans[position], int(plans[position]["steps"])
        params_k = model.client(k)
        private = (
            {n: v for n, v in params_k.items() if n.startswith("private_")}
            if states[position] is not None
            else None
        )
        metrics = {
            "loss": global_sums[k] / steps if steps else float("nan"),
            "steps": float(steps),
            "private_loss": private_sums[k] / max(private_steps, 1),
            "private_steps": float(private_steps),
            "alt_ratio": plan["ratio"],
            "mu": plan["mu"],
        }
        out.append((position, ClientResult(params_k, private, metrics)))
    return out


def _alo_loss(
    global_logits: torch.Tensor,
    private_logits: torch.Tensor,
    y: torch.Tensor,
    weight: torch.Tensor,
    mu: torch.Tensor,
    adv_lambda: float,
) -> torch.Tensor:
    """`fedkwsui.alo_loss` per client (clients, batch) -> (clients,): each client's label smoothing
    mu_k, weighted batch means (padding at weight 0)."""
    log_p = global_logits.log_softmax(dim=-1)
    classes = global_logits.shape[-1]
    target = (
        F.one_hot(y, classes).to(log_p.dtype) * (1.0 - mu.view(-1, 1, 1))
        + mu.view(-1, 1, 1) / classes
    )
    loss = (-(target * log_p).sum(-1) * weight).sum(-1)
    if adv_lambda:
        teacher = private_logits.detach().softmax(dim=-1)
        loss = loss - adv_lambda * (-(teacher * log_p).sum(-1) * weight).sum(-1)
    return loss
