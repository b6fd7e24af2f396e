"""Verification of one decode step: each request's drafts against the target's ragged logits.

Greedy requests compare argmaxes; sampled ones run rejection sampling against the distribution
each draft was drawn from, processed with the request's own temperature / top-k / top-p. A seeded
sampled request compares its drafts with the target's own sample at each position, drawn with the
number its seed keys to that position (engine/sampling.py): drafted with the same number, a draft
survives where it is that sample, and the output is the target's own sample at every position, so
its text does not depend on the batch, the load or what was drafted. Exact too: each token is an
inverse-CDF sample of the target's distribution at a uniform no earlier token depended on.
"""

from __future__ import annotations

import torch

from sglang_dspark.core.sampling import inverse_cdf
from sglang_dspark.core.verify import verify_chain, verify_chain_greedy, verify_chain_greedy_argmax
from sglang_dspark.engine.sampling import SamplingBatch


def pad_rows(rows: torch.Tensor, lens: torch.Tensor, width: int) -> torch.Tensor:
    """Ragged rows [sum(1 + l_r), ...] -> [R, width + 1, ...]; padding rows are never read."""
    padded = rows.new_zeros(lens.numel(), width + 1, *rows.shape[1:])
    padded[torch.arange(width + 1).unsqueeze(0) <= lens.unsqueeze(1)] = rows
    return padded


def verify_step(batch: SamplingBatch, drafts: torch.Tensor | None, draft_probs: torch.Tensor | None,
                ragged_logits: torch.Tensor, lens: torch.Tensor, shared: torch.Generator
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(accepted drafts [R], next token [R]) for ragged logits [sum(1 + lens), V]."""
    ragged_logits = batch.biased(ragged_logits, lens)  # logit_bias before every verification path
    R = lens.numel()
    width = int(lens.max()) if R else 0
    greedy = batch.greedy
    all_greedy = bool(greedy.all())
    if width == 0:  # nothing to verify (one row per request): the next token from it
        if all_greedy:  # what sampling a one-hot gives, without a softmax over the vocabulary
            return torch.zeros(R, dtype=torch.int64), ragged_logits.argmax(-1)
        return torch.zeros(R, dtype=torch.int64), batch.sample(batch.probs(ragged_logits))
    drafts = drafts[:, :width]
    if all_greedy:  # the argmax of every verify row, compared on the host; no draft probs read
        return _greedy_prefixes(ragged_logits.argmax(-1).tolist(), drafts.tolist(), lens.tolist())
    if draft_probs is None:
        raise ValueError("sampled rows need the drafts' probabilities (the drafter's sampler reported none)")
    draft_probs = draft_probs[:, :width]
    num_acc = torch.zeros(R, dtype=torch.int64)
    nxt = torch.zeros(R, dtype=torch.int64)
    logits = pad_rows(ragged_logits, lens, width)  # [R, width + 1, V]
    if greedy.any():
        g = greedy.nonzero().squeeze(-1)
        num_acc[g], nxt[g] = verify_chain_greedy(drafts[g], logits[g], lens[g])
    target_probs = batch.probs(logits)
    seeded = batch.seeded_sampled()
    if seeded:  # the target's own keyed sample at every verify row, compared like an argmax
        idx = torch.tensor(seeded)
        u = batch.keyed(seeded, range(width + 1))
        own = inverse_cdf(target_probs[idx].flatten(0, 1), u.flatten()).view(len(seeded), width + 1)
        num_acc[idx], nxt[idx] = verify_chain_greedy_argmax(drafts[idx], own, lens[idx])
    unseeded = [i for i in range(R) if not greedy[i] and batch.seeds[i] is None]
    if unseeded:  # one vectorised rejection-sampling call over the shared generator
        idx = torch.tensor(unseeded)
        num_acc[idx], nxt[idx] = verify_chain(drafts[idx], draft_probs[idx], target_probs[idx], lens[idx],
                                              generator=shared)
    return num_acc, nxt


def _greedy_prefixes(argmax: list[int], drafts: list[list[int]], lens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """verify_chain_greedy_argmax over ragged argmax ids (row r owns 1 + lens[r] of them), in plain
    Python: a step verifies a few dozen ids, and a dozen small tensor ops to pad and compare them
    cost more than the target's argmax itself (right after the forward, each op is a cache miss)."""
    num_acc, nxt, start = [], [], 0
    for row_drafts, n in zip(drafts, lens):
        ids, k = argmax[start:start + n + 1], 0
        while k < n and row_drafts[k] == ids[k]:
            k += 1
        num_acc.append(k)
        nxt.append(ids[k])
        start += n + 1
    return torch.tensor(num_acc, dtype=torch.int64), torch.tensor(nxt, dtype=torch.int64)
