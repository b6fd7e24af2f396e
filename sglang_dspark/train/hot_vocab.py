"""Training over a hot vocabulary: the drafter's vocabulary-sized heads restricted to H.

The inference drafter drafts only from H (DSparkDrafter.set_draft_vocab), so training computes
exactly that distribution: lm_head and Markov W2 rows of H only, a softmax over H. On a CPU the
two vocabulary-sized GEMMs dominate a training step, and they shrink V / |H| times. The target
side never needs its full distribution either: p_v = exp(h . W_v - lse) for v in H, with the
log-normaliser stored when the data were built (train/features.py), so p over H is exact and
1 - p(H) is the exact mass the drafter cannot propose (train/losses.py).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn


class HotRows(nn.Module):
    """A Linear restricted to output rows `ids`; gradients reach only those rows of its weight."""

    def __init__(self, full: nn.Linear, ids: torch.Tensor):
        super().__init__()
        self.full = full
        self.register_buffer("ids", ids, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.full.weight[self.ids])


@contextmanager
def hot_vocabulary(drafter, ids: torch.Tensor | None, hot_lm_head: torch.Tensor | None = None):
    """Inside the block, `drafter.forward_train` returns logits over `ids` (None: unchanged).
    `hot_lm_head` is lm_head_weight[ids], passed in when the caller keeps it across steps."""
    if ids is None:
        yield
        return
    full_head = drafter.lm_head_weight
    markov = drafter.markov_head
    w2 = markov.markov_w2 if markov is not None else None
    drafter.lm_head_weight = hot_lm_head if hot_lm_head is not None else full_head[ids]
    if markov is not None:
        markov.markov_w2 = HotRows(w2, ids)
    try:
        yield
    finally:
        drafter.lm_head_weight = full_head
        if markov is not None:
            markov.markov_w2 = w2


def vocab_index(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Token id -> its index in `ids`, -1 for tokens outside."""
    index = torch.full((vocab_size,), -1, dtype=torch.long)
    index[ids] = torch.arange(ids.numel())
    return index


def target_probs(final: torch.Tensor, lm_head_rows: torch.Tensor, lse: torch.Tensor | None):
    """(p over the rows' tokens [..., S], mass outside them [...]) of the target's distribution,
    from its final normed hidden state `final` [..., H]. Without `lse` the rows must be the whole
    vocabulary (the log-normaliser is then computed here) and the outside mass is None."""
    logits = final.float() @ lm_head_rows.T.float()
    if lse is None:
        return torch.softmax(logits, dim=-1), None
    probs = torch.exp(logits - lse.float().unsqueeze(-1))
    return probs, (1.0 - probs.sum(-1)).clamp(min=0.0)

