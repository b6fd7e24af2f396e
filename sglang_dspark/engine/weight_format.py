"""The weight format of the models the reference engine runs: the one place that decides it.

A decode or verify step of a small model on a CPU streams every weight from memory once, so the
bytes per weight set the step's floor, and the GEMM library's path for a few rows sets how fast a
verify width grows. Measured on a 2-core AMD EPYC (Zen 5, AVX-512 BF16) for SmolLM2-135M, every
Linear of the 30 layers plus the lm_head (benchmarks/target_forward.py): float32 costs 36 ms at
1 row and 50-65 ms at 2-4 rows; bfloat16 (oneDNN) 11 ms at 1 row and 13 ms at 8, the flat-then-rising
cost of a GPU that DSpark's scheduler is built for.

Formats:
- `float32`: the checkpoint's values; Linear weights in two layouts (engine/weight_layout.py).
- `bfloat16`: weights, activations and the KV cache in bfloat16, logits in float32; the same
  arithmetic as transformers loaded with `dtype=torch.bfloat16`.
- `int8`: weight-only int8 with one float scale per output row (symmetric, round to nearest), bf16
  activations (`aten._weight_int8pack_mm`); half the bytes of bfloat16. Lossless speculation still
  holds: the engine serves this quantized model and verifies against it.
- `auto`: bfloat16 where this CPU runs it faster than float32 (timed at load on the model's own
  weight shapes), else float32. Never int8, which changes the model's outputs.

Everything else in the engine reads the activation dtype from the model (`model_dtype`), so no
format-specific branch lives outside this file.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from sglang_dspark.engine.one_row_gemv import one_row, pack_one_row_gemv
from sglang_dspark.engine.weight_layout import pack_drafter_for_cpu, pack_linears_for_cpu

logger = logging.getLogger(__name__)

WEIGHT_FORMATS = ("float32", "bfloat16", "int8")
FORMAT_CHOICES = ("auto",) + WEIGHT_FORMATS
# auto takes bfloat16 only when it is clearly faster: a close call keeps the checkpoint's values
AUTO_MIN_SPEEDUP = 1.2
# ... unless the CPU has bfloat16 dot-product instructions (AVX512_BF16, AMX): there bfloat16 halves
# the bytes a step streams and computes natively, and a timing that only fails to show 1.2x is a busy
# neighbour (under a concurrent test run, 1.2x failed here where an idle host measured 2.2-2.7x):
# bfloat16 unless timed slower than float32: at 8 rows (batched decode, verify) at all, at 1 row by more
# than 5 %, the spread of the fastest of 5 timings on a shared host (an Intel Xeon with AMX timed 1.03-1.10x
# at 1 row and 1.77x at 8 within minutes: a 1-row threshold of 1.0 would throw the 8 rows away on noise)
NATIVE_BF16_MIN_SPEEDUP = {1: 0.95, 8: 1.0}
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def native_bf16_flags(cpuinfo: str = "/proc/cpuinfo") -> list[str]:
    """The CPU's bfloat16 dot-product flags (Linux /proc/cpuinfo); [] where unknown."""
    try:
        with open(cpuinfo) as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []
    return [flag for flag in NATIVE_BF16_FLAGS if flag in flags]


def activation_dtype(fmt: str) -> torch.dtype:
    """The dtype of activations, norms, embeddings and the KV cache in format `fmt`."""
    _check(fmt)
    return torch.float32 if fmt == "float32" else torch.bfloat16


def model_dtype(module: nn.Module) -> torch.dtype:
    """The activation dtype a loaded model runs in (its first floating-point parameter's)."""
    for p in module.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def _check(fmt: str) -> None:
    if fmt not in WEIGHT_FORMATS:
        raise ValueError(f"weight format {fmt!r}: expected one of {', '.join(WEIGHT_FORMATS)}")


class Int8Linear(nn.Module):
    """y = x W^T + b with W stored as int8 [out, in] and one scale per output row."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127.0
        self.register_buffer("weight_int8", torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scales", scale.to(torch.bfloat16))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().to(torch.bfloat16),
                                                                   requires_grad=False)

    def dequantized(self) -> torch.Tensor:
        """The weight this layer multiplies by, as bfloat16 [out, in]."""
        return (self.weight_int8.float() * self.scales.float()[:, None]).to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        out = torch.ops.aten._weight_int8pack_mm(rows, self.weight_int8, self.scales)
        if self.bias is not None:
            out = out + self.bias
        return out.view(*x.shape[:-1], self.out_features)


@torch.no_grad()
def quantize_linears_int8(module: nn.Module) -> int:
    """Replace every nn.Linear of `module` by an Int8Linear; returns how many."""
    targets = [(parent, name, child) for parent in module.modules() for name, child in parent.named_children()
               if type(child) is nn.Linear]
    for parent, name, child in targets:
        setattr(parent, name, Int8Linear(child))
    return len(targets)


@torch.no_grad()
def apply_to_target(model: nn.Module, fmt: str) -> None:
    """Put a target model (loaded in `activation_dtype(fmt)`) into format `fmt`."""
    _check(fmt)
    if fmt == "float32":
        pack_linears_for_cpu(model)  # float32's fast CPU GEMM layout per row count
    elif fmt == "int8":
        quantize_linears_int8(model)
    else:  # bfloat16: oneDNN's row-major path, and at one row torch.mv where tuned faster (engine/one_row_gemv.py)
        pack_one_row_gemv(model)


@torch.no_grad()
def apply_to_drafter(drafter: nn.Module, fmt: str) -> None:
    """Put a drafter (loaded in `activation_dtype(fmt)`) into format `fmt`. Its Linear layers are
    small and its largest GEMM reads the shared lm_head's rows, so it stays in the activation dtype
    under int8 too."""
    _check(fmt)
    if fmt == "float32":
        pack_drafter_for_cpu(drafter)
    else:
        pack_one_row_gemv(drafter)  # its per-position Markov layers run one row at C = 1


def _time_stack(weights: list[torch.Tensor], rows: int, dtype: torch.dtype) -> float:
    x = {w.shape[1]: torch.randn(rows, w.shape[1], dtype=dtype) for w in weights}
    kernels = [F.linear]
    if rows == 1 and dtype == torch.bfloat16:  # the engine may serve one row by torch.mv (engine/one_row_gemv.py)
        kernels.append(lambda x, w: one_row(x[0], w, None))
    best = float("inf")
    for kernel in kernels:
        start = time.perf_counter()
        for w in weights:
            kernel(x[w.shape[1]], w)
        best = min(best, time.perf_counter() - start)
    return best


@torch.no_grad()
def choose_auto(weights: list[torch.Tensor], *, reps: int = 5,
                timer: Callable[[list[torch.Tensor], int, torch.dtype], float] = _time_stack,
                native: list[str] | None = None) -> tuple[str, str]:
    """(format, reason) for `auto`: every float32 Linear weight of the target in turn (so they stream
    from memory as in a real step) against the same weights in bfloat16, at 1 and 8 rows,
    interleaved, the fastest of `reps` each: a busy neighbour only ever adds time, and on a loaded
    2-core host the medians of 3 once made bfloat16 look slower than float32.
    bfloat16 from `AUTO_MIN_SPEEDUP` at both, or from `NATIVE_BF16_MIN_SPEEDUP`'s per-row-count
    ratios where the CPU has native bfloat16 (`native`: its flags, default read from /proc/cpuinfo).
    `timer(weights, rows, dtype)` -> seconds (tests inject one)."""
    native = native_bf16_flags() if native is None else native
    bf16 = [w.to(torch.bfloat16) for w in weights]
    ratios = []
    row_counts = (1, 8)
    for rows in row_counts:
        times = {"float32": [], "bfloat16": []}
        for i in range(reps + 1):
            for name, ws, dt in (("float32", weights, torch.float32), ("bfloat16", bf16, torch.bfloat16)):
                seconds = timer(ws, rows, dt)
                if i:  # the first round warms both up
                    times[name].append(seconds)
        ratios.append(min(times["float32"]) / min(times["bfloat16"]))
    thresholds = [NATIVE_BF16_MIN_SPEEDUP[rows] if native else AUTO_MIN_SPEEDUP for rows in row_counts]
    fmt = "bfloat16" if all(r >= t for r, t in zip(ratios, thresholds)) else "float32"
    reason = (f"bfloat16 Linear layers timed {ratios[0]:.2f}x (1 row) and {ratios[1]:.2f}x (8 rows) float32's speed "
              f"on this CPU; " + (f"it has native bfloat16 ({', '.join(native)}), so auto takes bfloat16 unless "
                                  f"timed slower (at 1 row by more than 5 %)" if native
                                  else f"auto takes bfloat16 from {AUTO_MIN_SPEEDUP:.1f}x"))
    return fmt, reason
