"""FedMLAC's mutual-learning losses (Eqs. 5, 8, 9), shared by its per-client step and its stacked
step (both in fedmlac.py), each written for one client or for a chunk's stacked clients."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedac.training.local import cross_entropy


def distillation_kl(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    temperature: float = 1.0,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """KL(p_teacher || p_student) averaged over the batch (Eq. 5), teacher detached, scaled by T^2.

    With per-sample `weight` (clients, batch), as the stacked path passes it, the average is the
    weighted sum over each client's batch (see `local.cross_entropy`) and the result has one value
    per client."""
    t = temperature
    teacher = F.log_softmax(teacher_logits.detach() / t, dim=-1)
    student = F.log_softmax(student_logits / t, dim=-1)
    if weight is None:
        return F.kl_div(student, teacher, log_target=True, reduction="batchmean") * (t * t)
    per_sample = F.kl_div(student, teacher, log_target=True, reduction="none").sum(-1)
    return (per_sample * weight).sum(-1) * (t * t)


def personalized_loss(
    omega_logits,
    theta_logits,
    y,
    alpha: float,
    temperature: float = 1.0,
    ml: bool = True,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """Eq. 8: alpha * CE(omega) + (1 - alpha) * KL(p_theta || p_omega); CE alone without mutual
    learning."""
    ce = cross_entropy(omega_logits, y, weight)
    if not ml:
        return ce
    return alpha * ce + (1 - alpha) * distillation_kl(
        omega_logits, theta_logits, temperature, weight
    )


def plugin_loss(
    theta_logits,
    omega_logits,
    y,
    temperature: float = 1.0,
    ce_weight: float = 0.0,
    ml: bool = True,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """Eq. 9: KL(p_omega || p_theta) (+ optional CE weight); CE alone without mutual learning."""
    if not ml:
        return cross_entropy(theta_logits, y, weight)
    loss = distillation_kl(theta_logits, omega_logits, temperature, weight)
    if ce_weight:
        loss = loss + ce_weight * cross_entropy(theta_logits, y, weight)
    return loss
