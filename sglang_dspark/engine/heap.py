"""Give freed heap memory back to the operating system.

Weights are loaded as float32 and cast (and quantized), `--dtype auto` reads a sample of them or
times float32 and bfloat16 copies of every Linear weight, and a long prompt's prefill allocates attention scores of tens of MiB per layer. Most
of these tensors are a few MiB each, below glibc's mmap threshold, so freeing them leaves the pages
in malloc's arena: measured on SmolLM2 in bfloat16, an idle server kept 0.55 GiB of such pages after
start-up (benchmarks/serve_memory.py). `malloc_trim(0)` returns them; elsewhere (musl, macOS) this is
a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> bool:
    """Trim malloc's arenas; True where the C library can trim. No gc.collect(): reference counting
    has already freed the tensors, and a full collection of a process with torch and transformers
    imported takes about 0.2 s with the GIL held (the HTTP thread's too)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
