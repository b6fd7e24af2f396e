"""Preallocated per-slot KV cache for the reference engine's target model."""

from __future__ import annotations

import math
import mmap

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

    def release_pages(self) -> None:
        """Give every written page back (they read as zeros again); only when no slot holds a request."""
        release_on_demand(self.kv)


def zeros_on_demand(shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
    """Zeros whose memory is committed only where written, on a CPU.

    Zeros, not empty: masked positions still enter P @ V with weight 0, and 0 * NaN = NaN. The
    memory is an anonymous private mapping: the kernel maps fresh zero pages on first touch, so a
    cache sized for the model's whole context (8,192 tokens) costs memory only for the positions
    requests actually reach; torch.zeros would write (and commit) every byte at start. Huge pages
    are refused for the mapping: numpy's zeros (calloc) are madvised for them, and one (layer, K|V,
    slot, head) run of SmolLM2's cache is exactly 2 MiB, so the first position a request wrote
    committed its slot's whole context (360 MiB instead of 45 KiB per position; tests/test_kv_memory.py).
    """
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = max(1, math.prod(shape) * torch.empty(0, dtype=dtype).element_size())
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):  # Linux
        region.madvise(mmap.MADV_NOHUGEPAGE)
    # frombuffer keeps `region` alive as long as the tensor; uint8 then a view: any dtype, bfloat16 too
    tensor = torch.frombuffer(region, dtype=torch.uint8).view(dtype).view(shape)
    tensor._on_demand_region = region  # for release_on_demand
    return tensor


def release_on_demand(tensor: torch.Tensor) -> bool:
    """Return the pages a `zeros_on_demand` tensor committed to the OS; the tensor reads as zeros
    again and commits pages anew where it is next written. A cache's slots keep the pages their
    longest request reached (a slot is reused, not shrunk); an idle engine calls this so that the
    waves of yesterday's long prompts do not stay resident. False for other tensors (a GPU's)."""
    region = getattr(tensor, "_on_demand_region", None)
    if region is None or not hasattr(mmap, "MADV_DONTNEED"):
        return False
    region.madvise(mmap.MADV_DONTNEED)  # private anonymous pages: dropped, zero-filled on next touch
    return True
