"""One decoder layer on the row kernels: the nine calls the target's decode and verify rows and the
drafter's block both make (engine/target_model.py, engine/cpu/draft_rows.py).

Each call computes every row on its own, in float32 rounded once to bfloat16, so a row's output does
not depend on what shares its call (cpu_rows.cpp). What differs between the two users is what they
hold, never the arithmetic: the target its own quantized Linear layers, the drafter int8 copies of its
modules' weights; the target attends through `rows_attention` or, for a long prompt chunk, SDPA; the
drafter's layer (and qwen3's) normalises q and k per head before RoPE.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class RowWeights:
    """A decoder layer as the row kernels take it: fused Linear layers (q/k/v, o, gate/up, down),
    the two norms' weights and eps, optional per-head q/k norms, and the head geometry."""

    qkv: nn.Module
    o: nn.Module
    gate_up: nn.Module
    down: nn.Module
    attn_norm: torch.Tensor
    attn_eps: float
    mlp_norm: torch.Tensor
    mlp_eps: float
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    qk_eps: float
    heads: int
    kv_heads: int
    head_dim: int

    @classmethod
    def of_target_layer(cls, layer) -> "RowWeights":
        """engine/target_model.py's DecoderLayer (its Linear layers already in their format)."""
        q_norm, k_norm = (layer.q_norm, layer.k_norm) if layer.qk_norm else (None, None)
        return cls(layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj,
                   layer.attn_norm.weight, layer.attn_norm.eps, layer.mlp_norm.weight, layer.mlp_norm.eps,
                   None if q_norm is None else q_norm.weight, None if k_norm is None else k_norm.weight,
                   q_norm.eps if q_norm is not None else 0.0, layer.num_heads, layer.num_kv_heads, layer.head_dim)


def call(linear: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Decode and verify rows through a Linear layer."""
    return linear(x)


def prompt_call(linear: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A prompt chunk's rows through a Linear layer: its `prompt_rows` where it keeps a faster copy
    for many rows (engine/cpu/quantized_linear.py), else its forward."""
    return getattr(linear, "prompt_rows", linear)(x)


def head_norm(ops, x: torch.Tensor, weight: torch.Tensor, eps: float, heads: int, head_dim: int) -> torch.Tensor:
    """Per-head RMSNorm of x [T, heads * head_dim]."""
    return ops.rows_rmsnorm(x.reshape(-1, head_dim).contiguous(), weight, eps).view(-1, heads * head_dim)


def attend_rows(ops, q: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor, keys: torch.Tensor,
                scale: float) -> torch.Tensor:
    """rows_attention: row t of q over the first keys[t] keys of its slot's cache `kv`."""
    return ops.rows_attention(q.contiguous(), kv, slots, keys, scale)


def forward_rows(ops, w: RowWeights, x: torch.Tensor, kv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 positions: torch.Tensor, slots: torch.Tensor, attend: Callable[[torch.Tensor], torch.Tensor],
                 linear: Callable[[nn.Module, torch.Tensor], torch.Tensor] = call) -> torch.Tensor:
    """The layer's output rows for rows x [T, hidden] at `positions` of `slots`: their K/V written into
    this layer's cache `kv` first (RoPE from the tables cos / sin), then `attend(q)` -> [T, heads *
    head_dim] (rows_attention over the keys each row sees, or SDPA for a prompt chunk)."""
    qkv = linear(w.qkv, ops.rows_rmsnorm(x, w.attn_norm, w.attn_eps))
    if w.q_norm is not None:
        q_width, kv_width = w.heads * w.head_dim, w.kv_heads * w.head_dim
        qkv = torch.cat([head_norm(ops, qkv[:, :q_width], w.q_norm, w.qk_eps, w.heads, w.head_dim),
                         head_norm(ops, qkv[:, q_width:q_width + kv_width], w.k_norm, w.qk_eps, w.kv_heads, w.head_dim),
                         qkv[:, q_width + kv_width:]], dim=1)
    q = ops.rows_rope_store(qkv, cos, sin, positions, slots, kv, w.heads, w.kv_heads)
    x, h = ops.rows_add_rmsnorm(x, linear(w.o, attend(q)), w.mlp_norm, w.mlp_eps)
    return x + linear(w.down, ops.rows_silu_mul(linear(w.gate_up, h)))
