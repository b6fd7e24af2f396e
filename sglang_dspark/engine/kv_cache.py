"""Preallocated per-slot KV cache for the reference engine's target model."""

from __future__ import annotations

import numpy as np
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
        self.kv = zeros_on_demand((num_layers, 2, num_slots, num_kv_heads, max_len, head_dim), dtype, device)

    @property
    def dtype(self) -> torch.dtype:
        return self.kv.dtype

    @property
    def device(self) -> torch.device:
        return self.kv.device

    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()


def zeros_on_demand(shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
    """Zeros whose memory is committed only where written, on a CPU.

    Zeros, not empty: masked positions still enter P @ V with weight 0, and 0 * NaN = NaN. numpy's
    zeros come from calloc, which for large sizes maps fresh pages the kernel zeroes on first
    touch, so a cache sized for the model's whole context (8,192 tokens) costs memory only for the
    positions requests actually reach; torch.zeros would write (and commit) every byte at start.
    """
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    # numpy has no bfloat16: an unsigned integer of the same width is the same zero bytes
    same_width = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[torch.empty(0, dtype=dtype).element_size()]
    return torch.from_numpy(np.zeros(shape, dtype=same_width)).view(dtype)
