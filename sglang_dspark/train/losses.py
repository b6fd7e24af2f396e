"""DSpark training loss (paper section 3.3): 0.1 CE + 0.9 L1 + 1.0 confidence BCE.

Position weights follow the paper, w_k = exp(-(k-1)/gamma) for 1-based block position k, i.e.
exp(-k/gamma) for the 0-based k used here. Every term is a weighted mean over valid positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

CE_WEIGHT, L1_WEIGHT, CONF_WEIGHT = 0.1, 0.9, 1.0


@dataclass
class LossParts:
    total: torch.Tensor
    ce: torch.Tensor
    l1: torch.Tensor
    conf: torch.Tensor
    accept: torch.Tensor  # mean analytic acceptance 1 - 0.5 L1 (unweighted), a progress signal


def position_weights(gamma: int, device=None) -> torch.Tensor:
    return torch.exp(-torch.arange(gamma, device=device, dtype=torch.float32) / gamma)


def dspark_loss(draft_logits, conf_logits, target_probs, labels, valid) -> LossParts:
    """draft_logits/target_probs [..., G, V]; conf_logits/labels/valid [..., G]."""
    gamma = draft_logits.shape[-2]
    w = position_weights(gamma, draft_logits.device) * valid.float()
    denom = w.sum().clamp(min=1e-6)
    log_pd = F.log_softmax(draft_logits.float(), dim=-1)
    ce = -log_pd.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    l1 = (log_pd.exp() - target_probs).abs().sum(-1)
    accept = (1.0 - 0.5 * l1).detach().clamp(0.0, 1.0)  # analytic acceptance of rejection sampling
    bce = F.binary_cross_entropy_with_logits(conf_logits.float(), accept, reduction="none")
    ce_m, l1_m, conf_m = ((x * w).sum() / denom for x in (ce, l1, bce))
    return LossParts(
        total=CE_WEIGHT * ce_m + L1_WEIGHT * l1_m + CONF_WEIGHT * conf_m,
        ce=ce_m.detach(), l1=l1_m.detach(), conf=conf_m.detach(),
        accept=(accept * valid).sum() / valid.sum().clamp(min=1),
    )
