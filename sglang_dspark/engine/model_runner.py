"""The two models over their caches: prefill chunks, draft blocks, one ragged verify forward.

The runner owns the target's KV cache and the drafter's context cache and keeps them in step: every
position the target commits becomes drafter context (staged; the drafter projects it when it next
drafts). It knows nothing of requests' sampling or outcomes; the engine decides what to run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_dspark.engine.kv_cache import release_on_demand, zeros_on_demand
from sglang_dspark.engine.target_model import ForwardOutput, Segment, TargetModel


@dataclass(frozen=True)
class DecodeRow:
    """One request of a decode step: its KV slot, the position of its anchor and the anchor."""

    slot: int
    anchor_pos: int
    anchor: int


class ModelRunner:
    def __init__(self, target: TargetModel, drafter, max_running: int, max_len: int):
        self.target, self.drafter = target, drafter
        self.cache = target.new_kv_cache(max_running, max_len)
        self.gamma = drafter.gamma if drafter is not None else 0
        if drafter is not None:
            from sglang_dspark.drafter.model import DraftKVCache

            self.draft_cache = DraftKVCache(drafter, max_running, max_len, zeros=zeros_on_demand)
            self.capture = tuple(drafter.config.target_layer_ids)
        else:
            self.draft_cache, self.capture = None, ()

    def kv_bytes(self) -> int:
        """Bytes the caches take once every position of every slot is written."""
        total = self.cache.nbytes()
        if self.draft_cache is not None:
            total += self.draft_cache.kv.numel() * self.draft_cache.kv.element_size()
        return total

    def release_pages(self) -> None:
        """Both caches' pages back to the OS: only with no request in any slot (their K/V is lost)."""
        self.cache.release_pages()
        if self.draft_cache is not None:
            for slot in range(len(self.draft_cache.lengths)):
                self.draft_cache.truncate(slot, 0)  # staged features pin their steps' hidden states
            release_on_demand(self.draft_cache.kv)
            release_on_demand(self.draft_cache._buf)

    def prefill(self, chunks: list[tuple[int, int, list[int]]], all_logits: bool = False) -> torch.Tensor:
        """Run prompt chunks (slot, start, token ids); logits [len(chunks), V] of each chunk's last
        token, or with `all_logits` [total tokens, V] of every token (prompt logprobs). Their hidden
        states become drafter context.

        One forward per chunk: packed with other prompts, a chunk's rows went through GEMMs of
        another row count and one padded attention call, both of which round differently (on an AMX
        Xeon enough to change greedy text); alone, with the scheduler's fixed cut positions, a
        prompt's bits do not depend on what arrived beside it."""
        logits = []
        for slot, start, tokens in chunks:
            out = self.target.forward_segments([Segment(slot, start, torch.tensor(tokens))], self.cache,
                                               capture_layers=self.capture,
                                               logits_for="all" if all_logits else "last", prompt=True)
            logits.append(out.logits)
            if self.draft_cache is not None:
                self.draft_cache.stage(slot, start, out.hidden)
        return torch.cat(logits)

    def draft(self, rows: list[DecodeRow], sampler, block: int | None = None):
        """One block of `block` (default gamma) drafts per row (drafter.DraftOutput)."""
        return self.drafter.draft(self.draft_cache, [r.slot for r in rows], torch.tensor([r.anchor for r in rows]),
                                  torch.tensor([r.anchor_pos for r in rows]), sampler=sampler, block=block)

    def verify_forward(self, rows: list[DecodeRow], drafts: torch.Tensor | None, lens: torch.Tensor) -> ForwardOutput:
        """One ragged target forward over each row's anchor and its first lens[r] drafts:
        logits [sum(1 + lens), V] in row order."""
        segments = []
        for i, r in enumerate(rows):
            tokens = torch.tensor([r.anchor])
            if drafts is not None and lens[i]:
                tokens = torch.cat([tokens, drafts[i, : lens[i]]])
            segments.append(Segment(r.slot, r.anchor_pos, tokens))
        return self.target.forward_segments(segments, self.cache, capture_layers=self.capture)

    def commit(self, rows: list[DecodeRow], num_accepted: list[int], hidden: torch.Tensor | None,
               widths: list[int]) -> None:
        """Each row's anchor and its `num_accepted` drafts are now committed: their hidden states
        extend the drafter's context (row i's verify rows are the next widths[i] rows of `hidden`, anchor
        first), staged for the whole step at once. The target's cache needs nothing: rejected
        positions are past the KV length and are overwritten later."""
        if self.draft_cache is not None:
            offsets = [0]
            for w in widths[:-1]:
                offsets.append(offsets[-1] + w)
            self.draft_cache.stage_rows([r.slot for r in rows], [r.anchor_pos for r in rows], hidden, offsets,
                                        [n + 1 for n in num_accepted])
