"""int4's prompt rows three ways, for the benchmarks that weigh them (int4_prefill.py, prefill_invariance.py).

- `one call`: what the engine does (engine/cpu/quantized_linear.py): one oneDNN bfloat16 GEMM on the
  de-quantized copy per chunk, whatever its rows.
- `fixed`: calls of exactly FIXED_ROWS rows, the last padded with zeros: on an Intel Xeon with AMX,
  where oneDNN rounds a row apart at most row counts below 256, this gives a row the same bits
  whatever its chunk (at a fixed count a row's bits did not depend on its place or neighbours).
- `kernel`: the int4 kernel, which computes every row on its own (the decode path).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from sglang_dspark.engine.cpu.quantized_linear import Int4Linear

FIXED_ROWS = 256  # EngineConfig.prefill_chunk's default
WAYS = ("one call", "fixed", "kernel")


def fixed_rows(layer: Int4Linear, rows: torch.Tensor) -> torch.Tensor:
    n = rows.shape[0]
    pad = -n % FIXED_ROWS
    if pad:
        rows = torch.cat([rows, rows.new_zeros(pad, rows.shape[1])])
    return torch.cat([F.linear(block, layer.weight_bf16) for block in rows.split(FIXED_ROWS)])[:n]


@contextmanager
def prefill_way(layers: list[Int4Linear], way: str) -> Iterator[None]:
    """Inside, the layers' prompt rows (`prompt_rows`, which the target calls for prompt chunks) take
    `way`: the bfloat16 copy in one call (the layer's own), in calls of FIXED_ROWS, or the int4 kernel
    that decode rows take."""
    if way not in WAYS:
        raise ValueError(f"way {way!r}: one of {WAYS}")
    for layer in layers:
        if way == "fixed":
            layer.prompt_rows = lambda x, l=layer: l._apply(lambda rows: fixed_rows(l, rows), x)
        elif way == "kernel":
            layer.prompt_rows = layer.forward
    try:
        yield
    finally:
        for layer in layers:
            layer.__dict__.pop("prompt_rows", None)  # back to the class's own
