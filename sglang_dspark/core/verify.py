"""Lossless chain verification of a drafted block (speculative rejection sampling).

Every function is vectorised over requests: no Python loop over the batch. A request verifies only
the first `verify_lens[r]` drafts (a "cut"); the target row at the cut supplies the correction or
bonus token, so a cut stays exact (docs/ALGORITHM.md, verification).
"""

from __future__ import annotations

import torch

from sglang_dspark.core.sampling import sample


def _gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x [R, L, ...] and index [R] -> x[r, index[r]]."""
    return x[torch.arange(x.shape[0], device=x.device), index]


def _accepted_prefix_len(accept: torch.Tensor, verify_lens: torch.Tensor) -> torch.Tensor:
    """Length of the leading run of accepted drafts, never past the cut."""
    positions = torch.arange(accept.shape[1], device=accept.device)
    accept = accept & (positions.unsqueeze(0) < verify_lens.unsqueeze(1))
    return accept.to(torch.int64).cumprod(dim=1).sum(dim=1)


def verify_chain(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    verify_lens: torch.Tensor,
    *,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rejection-sample a block of drafts against the target.

    draft_tokens int64 [R, G]; draft_probs [R, G, V]: the distribution each draft was sampled from;
    target_probs [R, G+1, V]: the target at each draft position and at the bonus position;
    verify_lens int64 [R] in [0, G].
    Returns (num_accepted [R], next_tokens [R]): the accepted prefix length and the token that
    follows it (residual sample at the first rejection, else a bonus sample from the target).
    """
    num_requests, gamma = draft_tokens.shape
    if target_probs.shape[1] != gamma + 1:
        raise ValueError(f"target_probs needs G+1={gamma + 1} rows, got {target_probs.shape[1]}")
    index = draft_tokens.unsqueeze(-1)
    p_target = target_probs[:, :gamma].gather(-1, index).squeeze(-1)
    p_draft = draft_probs.gather(-1, index).squeeze(-1)
    # Accept x with probability min(1, p_t(x) / p_d(x)); u < 1 makes p_t >= p_d a sure accept.
    u = torch.rand(p_target.shape, generator=generator, device=p_target.device, dtype=p_target.dtype)
    num_accepted = _accepted_prefix_len(u * p_draft < p_target, verify_lens)

    target_row = _gather_rows(target_probs, num_accepted)
    draft_row = _gather_rows(draft_probs, num_accepted.clamp(max=gamma - 1))
    residual = (target_row - draft_row).clamp_(min=0)
    residual_mass = residual.sum(-1, keepdim=True)
    # A rejection is impossible when p_t == p_d, so an empty residual only arises from rounding:
    # fall back to the target row rather than dividing by zero.
    residual = torch.where(residual_mass > 0, residual / residual_mass.clamp(min=1e-30), target_row)
    rejected = (num_accepted < verify_lens).unsqueeze(-1)
    next_dist = torch.where(rejected, residual, target_row)
    next_tokens = sample(next_dist, generator)
    return num_accepted, next_tokens


def verify_chain_greedy(
    draft_tokens: torch.Tensor, target_logits: torch.Tensor, verify_lens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification: accept while the target's argmax equals the draft.

    target_logits [R, G+1, V]. Returns (num_accepted [R], next_tokens [R]) where next_tokens is the
    target's argmax after the accepted prefix, so the output is the target's own greedy decoding.
    """
    return verify_chain_greedy_argmax(draft_tokens, target_logits.argmax(dim=-1), verify_lens)


def verify_chain_greedy_argmax(
    draft_tokens: torch.Tensor, target_argmax: torch.Tensor, verify_lens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """verify_chain_greedy given the target's argmax ids [R, G+1] instead of its logits (a caller
    holding ragged logits takes the argmax before padding, which is V times less to move)."""
    gamma = draft_tokens.shape[1]
    num_accepted = _accepted_prefix_len(target_argmax[:, :gamma] == draft_tokens, verify_lens)
    return num_accepted, _gather_rows(target_argmax, num_accepted)
