"""What `DSparkDrafter.draft` and `DraftKVCache.flush` ask of an inference backend, and the drafter's
own modules as one.

Two paths implement it: `ModuleBackend` (here: the drafter's torch modules, any dtype, any cache
geometry) and the engine's row-kernel path (engine/cpu/draft_rows.py `DraftRows`, attached as
`drafter.rows` where the CPU row kernels serve the drafter). Declared in drafter/ so that the
dependency is visible and checked (tests/test_architecture.py: every call the drafter makes on a
backend is a method of this protocol, and both paths implement each with the same parameters), while
drafter/ still imports nothing from engine/.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F


@runtime_checkable
class DraftBackend(Protocol):
    def accepts(self, kv: torch.Tensor) -> bool:
        """Whether this backend reads and writes a draft cache whose K/V tensor is `kv`."""

    def vocab_changed(self, drafter) -> None:
        """The drafter's draft vocabulary changed: repack what depends on it."""

    def store_context(self, kv: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                      slots: torch.Tensor) -> None:
        """Project target features hidden [n, m*H] into every layer's K/V at (slots, positions) of
        `kv` [layers, 2, slots, kv_heads, max_len, head_dim]."""

    def block_hidden(self, cache, slot_index: torch.Tensor, anchor_pos: torch.Tensor, block_ids: torch.Tensor,
                     pos: torch.Tensor) -> torch.Tensor | None:
        """Final normed hidden [R, G, H] of the blocks block_ids [R, G] at positions pos [R, G] over
        each slot's context < anchor_pos; None where this backend cannot serve the cache's geometry."""

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Base logits [..., V or S] (float32) over the draft vocabulary."""

    def confidence(self, hidden: torch.Tensor, prev_embeddings: torch.Tensor | None) -> torch.Tensor:
        """Raw confidence logits [..., G] (float32) of the confidence head (there is one)."""

    def markov_bias(self, features: torch.Tensor) -> torch.Tensor:
        """The Markov head's bias [R, V or S] from its step features."""

    def greedy_chain(self, base: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor | None:
        """Every position's argmax draft [R, G] at once, or None where the head needs the loop."""


class ModuleBackend:
    """The drafter's own modules as a DraftBackend: the arithmetic training runs, in the drafter's dtype."""

    def __init__(self, drafter):
        self.drafter = drafter

    def accepts(self, kv: torch.Tensor) -> bool:
        return True

    def vocab_changed(self, drafter) -> None:
        return None  # the drafter keeps its vocabulary's rows itself (set_draft_vocab)

    def store_context(self, kv: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                      slots: torch.Tensor) -> None:
        for i, (k, v) in enumerate(self.drafter.context_kv(hidden, positions)):
            # kv[i, 0] is [slots, kv_heads, max_len, head_dim]; k [n, kv_heads, head_dim]
            kv[i, 0].transpose(1, 2)[slots, positions] = k.to(kv.dtype)
            kv[i, 1].transpose(1, 2)[slots, positions] = v.to(kv.dtype)

    def block_hidden(self, cache, slot_index: torch.Tensor, anchor_pos: torch.Tensor, block_ids: torch.Tensor,
                     pos: torch.Tensor) -> torch.Tensor:
        """The context K/V gathered per slot, a mask for each row's context length."""
        d = self.drafter
        r, g = block_ids.shape
        c = max(int(anchor_pos.max()), 1)
        ctx_kv = [(cache.k[i, slot_index, :c].to(d.dtype), cache.v[i, slot_index, :c].to(d.dtype))
                  for i in range(len(d.layers))]
        sees_ctx = torch.arange(c, device=block_ids.device)[None, :] < anchor_pos[:, None]  # [R, C]
        mask = torch.cat([sees_ctx, sees_ctx.new_ones(r, g)], dim=-1)[:, None, :].expand(r, g, c + g)
        return d.backbone(block_ids, pos, ctx_kv, mask)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.drafter.base_logits(hidden, self.drafter._vocab_lm_head)  # over a draft vocabulary where set

    def confidence(self, hidden: torch.Tensor, prev_embeddings: torch.Tensor | None) -> torch.Tensor:
        return self.drafter.confidence_head(hidden, prev_embeddings).float()

    def markov_bias(self, features: torch.Tensor) -> torch.Tensor:
        d = self.drafter
        if d.draft_vocab is None:
            return d.markov_head.markov_w2(features)
        return F.linear(features, d._vocab_markov_w2.to(features.dtype))

    def greedy_chain(self, base: torch.Tensor, anchors: torch.Tensor) -> None:
        return None  # the per-position loop drafts
