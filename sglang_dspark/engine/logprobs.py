"""Log-probabilities of emitted tokens, from the target's own logits at their positions.

A speculative step emits the accepted drafts and one correction or bonus token; row k of the
request's verify logits is the target at the position of emitted token k, so the logprob is the
target's log-softmax there (raw logits: before temperature, top-k and top-p, as OpenAI reports
them), never the drafter's.
"""

from __future__ import annotations

import torch

from sglang_dspark.engine.request import TokenLogprob


def token_logprobs(logits: torch.Tensor, token_ids: list[int], top: int) -> list[TokenLogprob]:
    """logits [n, V] at the positions of `token_ids` (n of them); `top` alternatives each."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    chosen = logp[torch.arange(len(token_ids)), torch.tensor(token_ids)].tolist()
    if top:
        values, ids = logp.topk(top, dim=-1)
        tops = [tuple(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]
    else:
        tops = [()] * len(token_ids)
    return [TokenLogprob(t, lp, tp) for t, lp, tp in zip(token_ids, chosen, tops)]
