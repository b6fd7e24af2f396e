"""The drafter's inference arithmetic on the package's CPU row kernels (engine/cpu/cpu_rows.py).

Why: a draft block is a one-layer model over gamma rows per request, and on a CPU its cost was
dispatch, not arithmetic: through torch's ops a block of 7 is about 980 aten calls, a third of a
whole target step on the row kernels, so drafting could not pay (benchmarks/RESULTS_LOG.md, "The
drafter on the row kernels"). Here the drafter's
Linear layers are int8 with one scale per output row (q/k/v and gate/up fused, the hot vocabulary's
lm_head and Markov rows included) through `q8_rows_mm`, its norms, RoPE and cache writes are one
kernel call each, and the block attends through `rows_attention` over its context K/V and its own,
written to the cache positions the block occupies: no gathered copy of the context, no mask.

What changes is the drafter's arithmetic, never the output's distribution: rejection sampling reads
the probabilities the drafter sampled from, whatever computed them (docs/ALGORITHM.md). Built by
engine/cpu/formats.py for int8 and int4, where the target runs these kernels too; elsewhere the
drafter keeps torch's ops. `DSparkDrafter.draft` takes this path when every slot's cache ends at
its anchor (the engine's case) and the block fits the attention kernel; anything else goes through
the module's own forward.
"""

from __future__ import annotations

import torch
from torch import nn

from sglang_dspark.drafter.heads import VanillaMarkov
from sglang_dspark.drafter.layers import rope_cos_sin
from sglang_dspark.engine.cpu.limits import fits_attention
from sglang_dspark.engine.cpu.quantized_linear import Int8Linear
from sglang_dspark.engine.cpu.row_layer import RowWeights, attend_rows, forward_rows, head_norm


def _int8(ops, *weights: torch.Tensor) -> Int8Linear:
    """One Int8Linear over the rows of `weights` stacked (a fused projection; `q8_rows_mm` where the
    shape fits it, aten's int8 kernel where not)."""
    w = torch.cat([x.detach() for x in weights])
    linear = nn.Linear(w.shape[1], w.shape[0], bias=False, device="meta")
    linear.weight = nn.Parameter(w, requires_grad=False)
    return Int8Linear(linear, ops)


def _eps(norm: nn.RMSNorm, default: float) -> float:
    return norm.eps if norm.eps is not None else default


class _Layer:
    """A draft decoder layer's int8 copies: the block's RowWeights and the context side's K/V projection."""

    def __init__(self, layer, ops, eps: float):
        attn, mlp = layer.self_attn, layer.mlp
        self.kv_heads, self.head_dim = attn.num_kv_heads, attn.head_dim
        self.k_norm, self.k_eps = attn.k_norm.weight, _eps(attn.k_norm, eps)
        self.kv = _int8(ops, attn.k_proj.weight, attn.v_proj.weight)  # the context side: no queries
        self.rows = RowWeights(
            qkv=_int8(ops, attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight), o=_int8(ops, attn.o_proj.weight),
            gate_up=_int8(ops, mlp.gate_proj.weight, mlp.up_proj.weight), down=_int8(ops, mlp.down_proj.weight),
            attn_norm=layer.input_layernorm.weight, attn_eps=_eps(layer.input_layernorm, eps),
            mlp_norm=layer.post_attention_layernorm.weight, mlp_eps=_eps(layer.post_attention_layernorm, eps),
            q_norm=attn.q_norm.weight, k_norm=attn.k_norm.weight, qk_eps=_eps(attn.q_norm, eps),
            heads=attn.num_heads, kv_heads=attn.num_kv_heads, head_dim=attn.head_dim)


class DraftRows:
    """A drafter's weights repacked for the row kernels, and its three inference passes. The Linear,
    Markov W1 and confidence weights are copies taken at construction (norm weights are the modules' own
tensors):
    load new weights into a drafter before building its DraftRows, not after. Context
    flushes of any size take the row kernels too: the modules' bfloat16 GEMM is faster for many warm
    rows, but oneDNN builds a kernel for every new row count, and a flush's count is new almost
    every time."""

    @staticmethod
    def fits(drafter) -> bool:
        """Whether the row kernels can run this drafter (bfloat16 activations, attention limits)."""
        cfg = drafter.config
        return drafter.dtype == torch.bfloat16 and fits_attention(cfg.num_attention_heads, cfg.num_key_value_heads,
                                                                  cfg.head_dim, rows=drafter.gamma)

    @torch.no_grad()
    def __init__(self, drafter, ops):
        if not self.fits(drafter):
            raise ValueError("this drafter does not fit the row kernels (DraftRows.fits)")
        cfg = drafter.config
        self.ops = ops
        self.eps = cfg.rms_norm_eps
        self.fc, self.hidden_norm, self.norm = _int8(ops, drafter.fc.weight), drafter.hidden_norm, drafter.norm
        self.embed_weight = drafter.embed_weight
        self.layers = [_Layer(layer, ops, self.eps) for layer in drafter.layers]
        self.head_dim, self.rope_theta = cfg.head_dim, cfg.rope_theta
        self._rope_tables(cfg.max_position_embeddings)
        self.scale = cfg.head_dim ** -0.5
        markov = drafter.markov_head  # the greedy chain's kernel knows the vanilla head only
        self.markov_w1 = (markov.markov_w1.weight.detach().to(torch.bfloat16).contiguous()
                          if type(markov) is VanillaMarkov else None)
        head = drafter.confidence_head  # one output: a float32 dot product, not a bfloat16 GEMM call
        self.confidence_weight = None if head is None else head.proj.weight.detach().float()[0]
        self.confidence_bias = None if head is None else head.proj.bias.detach().float()[0]
        self.vocab_changed(drafter)

    @torch.no_grad()
    def vocab_changed(self, drafter) -> None:
        """Repack the vocabulary-sized rows (lm_head, Markov W2) for the drafter's current draft vocabulary."""
        lm_head = drafter.lm_head_weight if drafter.draft_vocab is None else drafter._vocab_lm_head
        self.lm_head = _int8(self.ops, lm_head)
        head = drafter.markov_head
        # the Markov bias in float32 from the bfloat16 weights, the same arithmetic in the per-position
        # loop (markov_bias) and in the greedy chain (markov_argmax_chain)
        self.markov_w2 = None if head is None else (
            head.markov_w2.weight if drafter.draft_vocab is None else drafter._vocab_markov_w2).detach().float().contiguous()
        self.vocab_ids = (torch.empty(0, dtype=torch.long) if drafter.draft_vocab is None
                          else drafter.draft_vocab.contiguous())

    def _rope_tables(self, positions: int) -> None:
        """The drafter's own RoPE tables for positions 0 .. positions - 1, as the kernel reads them."""
        cos, sin = rope_cos_sin(torch.arange(positions), self.head_dim, self.rope_theta, dtype=torch.bfloat16)
        self.cos, self.sin = cos.contiguous(), sin.contiguous()

    def _cover(self, kv: torch.Tensor) -> None:
        """Tables for every position of the cache `kv` holds: a draft block runs past the model's
        last position (the engine's cache has gamma + 1 more), and a drafter's
        max_position_embeddings may be smaller than its target's."""
        if self.cos.shape[0] < kv.shape[-2]:
            self._rope_tables(kv.shape[-2])

    def _rmsnorm(self, x: torch.Tensor, norm: nn.RMSNorm) -> torch.Tensor:
        return self.ops.rows_rmsnorm(x.contiguous(), norm.weight, _eps(norm, self.eps))

    def accepts(self, kv: torch.Tensor) -> bool:
        """The kernels read and write bfloat16 K/V."""
        return kv.dtype == torch.bfloat16

    @torch.no_grad()
    def block_hidden(self, cache, slot_index: torch.Tensor, anchor_pos: torch.Tensor, block_ids: torch.Tensor,
                     pos: torch.Tensor) -> torch.Tensor | None:
        """The blocks' final hidden [R, G, H]; each row attends to its slot's first anchor + gamma keys
        (no gather, no mask). The block's K/V is written to the cache positions it occupies, so only
        where every slot's context ends at its anchor (the engine's case) and the block fits the
        cache; None elsewhere (the modules draft)."""
        r, g = block_ids.shape
        if not all(cache.length(slot) == p and p + g <= cache.max_len
                   for slot, p in zip(slot_index.tolist(), anchor_pos.tolist())):
            return None
        x = torch.nn.functional.embedding(block_ids.view(-1), self.embed_weight).to(torch.bfloat16)
        keys = (anchor_pos + g).repeat_interleave(g)
        return self.backbone(cache.kv, x, pos.reshape(-1), slot_index.repeat_interleave(g), keys).view(r, g, -1)

    @torch.no_grad()
    def store_context(self, kv: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                      slots: torch.Tensor) -> None:
        """Project target features hidden [n, m*H] into every layer's K/V and write them at
        (slots, positions) of `kv` [layers, 2, slots, kv_heads, max_len, head_dim]
        (DSparkDrafter.context_kv's arithmetic)."""
        self._cover(kv)
        ctx = self._rmsnorm(self.fc(hidden.to(torch.bfloat16)), self.hidden_norm)
        positions, slots = positions.contiguous(), slots.contiguous()
        for i, layer in enumerate(self.layers):
            kv_rows = layer.kv(ctx)
            width = layer.kv_heads * layer.head_dim
            k = head_norm(self.ops, kv_rows[:, :width], layer.k_norm, layer.k_eps, layer.kv_heads, layer.head_dim)
            rows = torch.cat([k, kv_rows[:, width:]], dim=1)
            self.ops.rows_rope_store(rows, self.cos, self.sin, positions, slots, kv[i], 0, layer.kv_heads)

    @torch.no_grad()
    def backbone(self, kv: torch.Tensor, x: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                 keys: torch.Tensor) -> torch.Tensor:
        """Final normed hidden [T, H] of the block rows x [T, H] (embedded) at `positions` of
        `slots`; row t attends to its slot's keys < keys[t], the block's own K/V written at its
        positions first (DSparkDrafter.backbone's arithmetic)."""
        self._cover(kv)
        positions, slots, keys = positions.contiguous(), slots.contiguous(), keys.contiguous()
        x = x.contiguous()
        for i, layer in enumerate(self.layers):
            layer_kv = kv[i]
            x = forward_rows(self.ops, layer.rows, x, layer_kv, self.cos, self.sin, positions, slots,
                             lambda q: attend_rows(self.ops, q, layer_kv, slots, keys, self.scale))
        return self._rmsnorm(x, self.norm)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Base logits [T, V or S] (float32) over the draft vocabulary's lm_head rows."""
        return self.lm_head(hidden).float()

    def confidence(self, hidden: torch.Tensor, prev_embeddings: torch.Tensor | None) -> torch.Tensor:
        """Raw confidence logits [..., G] (float32) of ConfidenceHead over hidden [..., G, H]."""
        features = hidden if prev_embeddings is None else torch.cat([hidden, prev_embeddings.to(hidden.dtype)], dim=-1)
        return features.float() @ self.confidence_weight + self.confidence_bias

    def markov_bias(self, features: torch.Tensor) -> torch.Tensor:
        """W2 features over the draft vocabulary's rows: [R, V or S] (float32)."""
        return features.float() @ self.markov_w2.T

    def greedy_chain(self, base: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor | None:
        """Every position's argmax draft [R, G] (token ids) in one kernel call, for a vanilla Markov
        head (base: float32 logits [R, G, V or S]); None for another head (the loop drafts)."""
        if self.markov_w1 is None:
            return None
        return self.ops.markov_argmax_chain(base.contiguous(), self.markov_w1, self.markov_w2, self.vocab_ids,
                                            anchors.contiguous())
