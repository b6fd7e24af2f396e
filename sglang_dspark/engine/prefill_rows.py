"""How int4's prompt rows multiply by the bfloat16 copy so that a row's output does not depend on its chunk.

A prefill step packs up to `EngineConfig.prefill_chunk` prompt tokens of every prefilling request
into one forward, so how many rows a prompt row shares a GEMM with depends on the traffic. The
prompt's K/V, and so what it decodes, must not: the canary replays a request alone and compares
token for token, and greedy output should not change with the load. oneDNN's bfloat16 GEMM picks
its kernel by the row count, and its kernels round apart:

- on a 2-core AMD EPYC (Zen 5, torch 2.14) every row count from 2 to 256 gave a row the same bits,
  one row alone rounded SmolLM2's down_proj apart;
- on an Intel Xeon with AMX (2 cores, torch 2.14) 6-255 rows of down_proj (576 x 1536) rounded
  apart from 256 rows, 1-32 rows of gate/up (1536 x 576), 14-32 of o_proj, 96 and 128 of k/v_proj;
  at a fixed row count (48, 64, 128, 256) a row's bits did not depend on its position or on the
  rows beside it, zero rows included.

So one of three ways is taken per host, the cheapest that holds, checked at load on the model's own
shapes (`tune_prefill_rows`):

- `any`: one call whatever the rows (one row as two); where every row count gives the same bits.
- `fixed`: calls of exactly `FIXED_ROWS` rows, the last padded with zeros; a short chunk pays a
  full call (benchmarks/int4_prefill.py: 59 against 21 ms for SmolLM2's layers on the Intel Xeon).
- `kernel`: the int4 kernel, which computes each row on its own (the decode path: slow for many rows).

An `Int4Linear` not tuned (built outside `load_models`) takes `fixed`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger(__name__)

FIXED_ROWS = 256  # EngineConfig.prefill_chunk's default: a full chunk is one call
MODES = ("any", "fixed", "kernel")
# row counts a chunk is cut into when checking (tiling [0, FIXED_ROWS)); from the start `any` is
# compared at every count (the Intel Xeon's k/v_proj rounded apart at 96 and 128 rows only), the
# others, whose call does not change with the count, at a few
_TILINGS = (3, 16, 64, 100)
_SPARSE_COUNTS = (1, 2, 7, 33, 100, 255)


def bf16_rows(rows: torch.Tensor, weight: torch.Tensor, mode: str) -> torch.Tensor:
    """rows @ weight.T through oneDNN in `mode` ("any" or "fixed")."""
    n = rows.shape[0]
    if mode == "any":
        if n == 1:  # oneDNN's one-row path rounds apart from 2+ rows (the AMD EPYC's down_proj)
            return F.linear(rows.expand(2, -1), weight)[:1]
        return F.linear(rows, weight)
    pad = -n % FIXED_ROWS
    if pad:
        rows = torch.cat([rows, rows.new_zeros(pad, rows.shape[1])])
    return torch.cat([F.linear(block, weight) for block in rows.split(FIXED_ROWS)])[:n]


def rows_agree(weight: torch.Tensor, mode: str, kernel=None, seed: int = 0) -> bool:
    """Whether prompt rows get the same bits however they are chunked, in `mode`, for this weight
    ([out, in] bfloat16; `kernel(rows)` for mode "kernel"): FIXED_ROWS random rows at two scales,
    computed whole, then in fewer rows from the start (every count for "any") and tiled in chunks
    of _TILINGS rows."""
    def run(x):
        return kernel(x) if mode == "kernel" else bf16_rows(x, weight, mode)

    g = torch.Generator().manual_seed(seed)
    for scale in (1.0, 10.0):
        x = (torch.randn(FIXED_ROWS, weight.shape[1], generator=g) * scale).to(weight.dtype)
        whole = run(x)
        counts = range(1, FIXED_ROWS) if mode == "any" else _SPARSE_COUNTS
        if any(not torch.equal(run(x[:n]), whole[:n]) for n in counts):
            return False
        for size in _TILINGS:
            tiled = torch.cat([run(x[s:s + size]) for s in range(0, FIXED_ROWS, size)])
            if not torch.equal(tiled, whole):
                return False
    return True


@torch.no_grad()
def tune_prefill_rows(modules: Iterable[nn.Module]) -> str | None:
    """Set every `Int4Linear` of `modules` to the first of MODES in which its shape's prompt rows
    agree however chunked (`rows_agree`, one layer per distinct shape; all layers then take the
    mode every shape passed, so one prompt row takes one path through the model). Call after
    setting torch's thread count. Returns the mode (None: no int4 layers)."""
    from sglang_dspark.engine.quantized_linear import Int4Linear

    by_shape: dict[tuple, Int4Linear] = {}
    layers = [m for module in modules for m in module.modules() if isinstance(m, Int4Linear)]
    for layer in layers:
        by_shape.setdefault((layer.out_features, layer.in_features), layer)
    if not by_shape:
        return None
    mode = next(m for m in MODES if m == "kernel" or all(
        rows_agree(layer.weight_bf16, m) for layer in by_shape.values()))
    if mode == "kernel" and not all(rows_agree(layer.weight_bf16, "kernel", layer.kernel_rows) for layer in by_shape.values()):
        logger.warning("int4: no prefill path gives a prompt row the same bits whatever its chunk on this CPU; "
                       "a prompt's K/V may depend on what is prefilled beside it")
    for layer in layers:
        layer.prefill_rows = mode
    logger.info("int4 prefill rows: %s (%s)", mode, {
        "any": "oneDNN's bfloat16 GEMM rounds a row alike at every row count here",
        "fixed": f"oneDNN rounds apart across row counts here: calls of exactly {FIXED_ROWS} rows",
        "kernel": "oneDNN rounds apart even at a fixed row count here: prompt rows take the int4 kernel"}[mode])
    return mode
