"""Drafter training losses. `dspark` is the paper's (section 3.3): 0.1 CE + 0.9 L1 + 1.0 confidence
BCE. `kl` is forward KL(p || q) over the hot vocabulary + CE to the target's argmax + the same BCE:
L1's gradient on the target's top token's logit is about -2 q_v, which vanishes exactly where the
draft is wrong, while KL's is q_v - p_v, largest there; the argmax label is what T = 0 verification
accepts.

Position weights follow the paper, w_k = exp(-(k-1)/gamma) for 1-based block position k, i.e.
exp(-k/gamma) for the 0-based k used here. Every term is a weighted mean over valid positions.

Over a hot vocabulary H (the drafter proposes only tokens of H, so q = 0 outside it) the L1
distance to the target is still the full-vocabulary one:
    ||q - p||_1 = sum_{v in H} |q_v - p_v| + (1 - p(H)),
where `outside_mass` = 1 - p(H) is exact because p over H comes from the stored log-normaliser.
The outside term has no gradient but belongs in the acceptance 1 - 0.5 ||q - p||_1, which is
both the confidence head's label and the progress signal. A label outside H cannot be drafted,
so it is left out of the CE term (label -1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

CE_WEIGHT, L1_WEIGHT, CONF_WEIGHT = 0.1, 0.9, 1.0
OBJECTIVES = ("dspark", "kl")


@dataclass
class LossParts:
    total: torch.Tensor
    ce: torch.Tensor
    l1: torch.Tensor
    conf: torch.Tensor
    accept: torch.Tensor  # mean analytic acceptance 1 - 0.5 L1 (unweighted), a progress signal


def position_weights(gamma: int, device=None) -> torch.Tensor:
    return torch.exp(-torch.arange(gamma, device=device, dtype=torch.float32) / gamma)


def acceptance(log_q: torch.Tensor, target_probs: torch.Tensor, outside_mass: torch.Tensor | None = None):
    """(L1 distance [...], analytic acceptance [...]) of draft log-probs against target probs over
    the same vocabulary; `outside_mass` is the target's mass outside it (the draft has none)."""
    l1 = (log_q.exp() - target_probs).abs().sum(-1)
    if outside_mass is not None:
        l1 = l1 + outside_mass
    return l1, (1.0 - 0.5 * l1).detach().clamp(0.0, 1.0)


def dspark_loss(draft_logits, conf_logits, target_probs, labels, valid, outside_mass=None) -> LossParts:
    """draft_logits/target_probs [..., G, V]; conf_logits/labels/valid/outside_mass [..., G].
    Labels are indices into the last axis, -1 where the token lies outside it."""
    gamma = draft_logits.shape[-2]
    w = position_weights(gamma, draft_logits.device) * valid.float()
    denom = w.sum().clamp(min=1e-6)
    log_pd = F.log_softmax(draft_logits.float(), dim=-1)
    drafted = labels >= 0
    ce = torch.where(drafted, -log_pd.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1), 0.0)
    w_ce = w * drafted
    l1, accept = acceptance(log_pd, target_probs, outside_mass)
    bce = F.binary_cross_entropy_with_logits(conf_logits.float(), accept, reduction="none")
    ce_m = (ce * w_ce).sum() / w_ce.sum().clamp(min=1e-6)
    l1_m, conf_m = ((x * w).sum() / denom for x in (l1, bce))
    return LossParts(
        total=CE_WEIGHT * ce_m + L1_WEIGHT * l1_m + CONF_WEIGHT * conf_m,
        ce=ce_m.detach(), l1=l1_m.detach(), conf=conf_m.detach(),
        accept=(accept * valid).sum() / valid.sum().clamp(min=1),
    )


def kl_loss(draft_logits, conf_logits, target_probs, argmax_labels, valid, outside_mass=None) -> LossParts:
    """Forward KL of the target's hot-vocabulary probabilities to the draft + CE to the target's
    argmax (-1 where outside the hot vocabulary) + confidence BCE, position-weighted like
    `dspark_loss`. KL's constant p log p term is left out (it has no gradient); `l1` reports the
    soft cross-entropy -sum p log q instead, so the parts still add up to `total`."""
    gamma = draft_logits.shape[-2]
    w = position_weights(gamma, draft_logits.device) * valid.float()
    denom = w.sum().clamp(min=1e-6)
    log_pd = F.log_softmax(draft_logits.float(), dim=-1)
    soft_ce = -(target_probs * log_pd).sum(-1)
    drafted = argmax_labels >= 0
    ce = torch.where(drafted, -log_pd.gather(-1, argmax_labels.clamp(min=0).unsqueeze(-1)).squeeze(-1), 0.0)
    w_ce = w * drafted
    _, accept = acceptance(log_pd, target_probs, outside_mass)
    bce = F.binary_cross_entropy_with_logits(conf_logits.float(), accept, reduction="none")
    ce_m = (ce * w_ce).sum() / w_ce.sum().clamp(min=1e-6)
    soft_m, conf_m = ((x * w).sum() / denom for x in (soft_ce, bce))
    return LossParts(total=soft_m + ce_m + CONF_WEIGHT * conf_m, ce=ce_m.detach(), l1=soft_m.detach(),
                     conf=conf_m.detach(), accept=(accept * valid).sum() / valid.sum().clamp(min=1))
