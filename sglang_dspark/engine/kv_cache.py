"""Preallocated per-slot KV cache for the reference engine's target model."""

from __future__ import annotations

import torch


class KVCache:
    """Preallocated per-slot contiguous K/V for every layer: [num_layers, 2, num_slots, num_kv_heads, max_len, head_dim].

    The cache does not track lengths: the engine owns each slot's valid length, so rollback is free
    (positions >= length are garbage and the next write overwrites them).
    """

    def __init__(self, *, num_layers: int, num_kv_heads: int, head_dim: int, num_slots: int, max_len: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.num_slots, self.max_len = num_slots, max_len
        # zeros, not empty: masked positions still enter P @ V with weight 0, and 0 * NaN = NaN
        self.kv = torch.zeros(num_layers, 2, num_slots, num_kv_heads, max_len, head_dim, dtype=dtype, device=device)

    @property
    def dtype(self) -> torch.dtype:
        return self.kv.dtype

    @property
    def device(self) -> torch.device:
        return self.kv.device

    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()
