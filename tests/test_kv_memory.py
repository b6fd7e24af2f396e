"""The README's claim on the reference engine's KV cache: sized for 16 x 8,192 positions of SmolLM2
(5.6 GiB in float32), its memory is committed only as requests reach those positions."""

import os

import pytest
import torch

from sglang_dspark.engine.kv_cache import KVCache

PAGE = os.sysconf("SC_PAGE_SIZE")


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:  # size, resident, ... in pages
        return int(f.read().split()[1]) * PAGE


# Found by this test: numpy's zeros were madvised for transparent huge pages, and one (layer, K|V,
# slot, head) run of SmolLM2's cache is exactly 2 MiB, so the first position a request wrote
# committed its slot's whole context (360 MiB per slot instead of 45 KiB per position) on hosts with
# THP in "madvise" or "always" mode; kv_cache.zeros_on_demand now maps its own zero pages and
# refuses huge pages for them. Checked in both dtypes the engine's caches use.
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_full_context_cache_commits_only_the_positions_written(dtype):
    before = _resident_bytes()
    # SmolLM2-135M: 30 layers, 3 KV heads of 64 -> 45 KiB per position in float32
    cache = KVCache(num_layers=30, num_kv_heads=3, head_dim=64, num_slots=16, max_len=8192, dtype=dtype)
    assert cache.nbytes() == 16 * 8192 * 45 * 1024 * dtype.itemsize // 4
    cache.kv[:, :, 0, :, :10] = 1.0  # one request reached position 10: 450 KiB, 180 runs of 4 KiB pages
    assert float(cache.kv[0, 0, 0, 0, 9, 0]) == 1.0 and float(cache.kv[0, 0, 1, 0, 0, 0]) == 0.0
    grown = _resident_bytes() - before
    assert grown < 64 * 2**20, (grown, cache.nbytes())  # not the 5.6 GiB the cache spans, nor a slot's 360 MiB
    del cache
