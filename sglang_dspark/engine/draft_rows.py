"""The drafter's inference arithmetic on the package's CPU row kernels (kernels/cpu_rows.py).

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
engine/weight_format.py for int8 and int4, where the target runs these kernels too; elsewhere the
drafter keeps torch's ops. `DSparkDrafter.draft` takes this path when every slot's cache ends at
its anchor (the engine's case) and the block fits the attention kernel; anything else goes through
the module's own forward.
"""

from __future__ import annotations

import torch
from torch import nn

from sglang_dspark.drafter.heads import VanillaMarkov
from sglang_dspark.drafter.layers import rope_cos_sin
from sglang_dspark.engine.quantized_linear import Int8Linear

MAX_ROWS = 16  # rows_attention's exact rows per segment (engine/target_model.py EXACT_ROWS)
MAX_GROUP, MAX_HEAD_DIM = 16, 256  # rows_attention's limits (cpu_rows.cpp)


def _int8(*weights: torch.Tensor) -> Int8Linear:
    """One Int8Linear over the rows of `weights` stacked (a fused projection; `q8_rows_mm` where the
    shape fits it, aten's int8 kernel where not)."""
    w = torch.cat([x.detach() for x in weights])
    linear = nn.Linear(w.shape[1], w.shape[0], bias=False, device="meta")
    linear.weight = nn.Parameter(w, requires_grad=False)
    return Int8Linear(linear)


class _Layer:
    def __init__(self, layer):
        attn, mlp = layer.self_attn, layer.mlp
        self.heads, self.kv_heads, self.head_dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
        self.input_norm, self.post_norm = layer.input_layernorm, layer.post_attention_layernorm
        self.q_norm, self.k_norm = attn.q_norm, attn.k_norm
        self.qkv = _int8(attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight)
        self.kv = _int8(attn.k_proj.weight, attn.v_proj.weight)  # the context side: no queries
        self.o = _int8(attn.o_proj.weight)
        self.gate_up = _int8(mlp.gate_proj.weight, mlp.up_proj.weight)
        self.down = _int8(mlp.down_proj.weight)


class DraftRows:
    """A drafter's weights repacked for the row kernels, and its three inference passes. The Linear,
    Markov W1 and confidence weights are copies taken at construction (norm weights are read live):
    load new weights into a drafter before building its DraftRows, not after. Context
    flushes of any size take the row kernels too: the modules' bfloat16 GEMM is faster for many warm
    rows, but oneDNN builds a kernel for every new row count, and a flush's count is new almost
    every time."""

    @staticmethod
    def fits(drafter) -> bool:
        """Whether the row kernels can run this drafter (bfloat16 activations, attention limits)."""
        cfg = drafter.config
        return (drafter.dtype == torch.bfloat16 and drafter.gamma <= MAX_ROWS and cfg.head_dim <= MAX_HEAD_DIM
                and cfg.head_dim % 2 == 0 and cfg.num_attention_heads % cfg.num_key_value_heads == 0
                and cfg.num_attention_heads // cfg.num_key_value_heads <= MAX_GROUP)

    @torch.no_grad()
    def __init__(self, drafter, ops):
        if not self.fits(drafter):
            raise ValueError("this drafter does not fit the row kernels (DraftRows.fits)")
        cfg = drafter.config
        self.ops = ops
        self.eps = cfg.rms_norm_eps
        self.fc, self.hidden_norm, self.norm = _int8(drafter.fc.weight), drafter.hidden_norm, drafter.norm
        self.layers = [_Layer(layer) for layer in drafter.layers]
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
        self.lm_head = _int8(lm_head)
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

    def _eps(self, norm: nn.RMSNorm) -> float:
        return norm.eps if norm.eps is not None else self.eps

    def _rmsnorm(self, x: torch.Tensor, norm: nn.RMSNorm) -> torch.Tensor:
        return self.ops.rows_rmsnorm(x.contiguous(), norm.weight, self._eps(norm))

    def _head_norm(self, x: torch.Tensor, norm: nn.RMSNorm, heads: int, head_dim: int) -> torch.Tensor:
        """Per-head RMSNorm of x [T, heads * head_dim] (q_norm / k_norm)."""
        return self._rmsnorm(x.reshape(-1, head_dim), norm).view(-1, heads * head_dim)

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
            k = self._head_norm(kv_rows[:, :width], layer.k_norm, layer.kv_heads, layer.head_dim)
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
        for i, layer in enumerate(self.layers):
            h = self._rmsnorm(x, layer.input_norm)
            qkv = layer.qkv(h)
            q_width, kv_width = layer.heads * layer.head_dim, layer.kv_heads * layer.head_dim
            q = self._head_norm(qkv[:, :q_width], layer.q_norm, layer.heads, layer.head_dim)
            k = self._head_norm(qkv[:, q_width : q_width + kv_width], layer.k_norm, layer.kv_heads, layer.head_dim)
            rows = torch.cat([q, k, qkv[:, q_width + kv_width :]], dim=1)
            q = self.ops.rows_rope_store(rows, self.cos, self.sin, positions, slots, kv[i], layer.heads, layer.kv_heads)
            attn = self.ops.rows_attention(q, kv[i], slots, keys, self.scale)
            x, h = self.ops.rows_add_rmsnorm(x.contiguous(), layer.o(attn), layer.post_norm.weight,
                                             self._eps(layer.post_norm))
            x = x + layer.down(self.ops.rows_silu_mul(layer.gate_up(h)))
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
