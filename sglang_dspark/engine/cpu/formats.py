"""The weight format of the models the reference engine runs: the one place that decides it.

A decode or verify step of a small model on a CPU streams every weight from memory once, so the
bytes per weight set the step's floor, and the GEMM library's path for a few rows sets how fast a
verify width grows. On a CPU with AVX-512 BF16, float32's step grows steeply from 1 row to 2-4,
while bfloat16 (oneDNN) stays nearly flat up to 8 rows: the flat-then-rising cost of a GPU that
DSpark's scheduler is built for (benchmarks/target_forward.py; figures in benchmarks/RESULTS_LOG.md,
"Weight formats").

Formats:
- `float32`: the checkpoint's values; Linear weights in two layouts (engine/cpu/weight_layout.py).
- `bfloat16`: weights, activations and the KV cache in bfloat16, logits in float32; the same
  arithmetic as transformers loaded with `dtype=torch.bfloat16`.
- `int8`: int8 weights with one float scale per output row (symmetric, round to nearest); half the
  bytes of bfloat16. Lossless speculation still holds: the engine serves this quantized model and
  verifies against it.
- `int4`: the decoder layers' weights in 4-bit groups of 32 with a scale and minimum each (GGUF's
  Q4_1 block); the lm_head (the tied embedding, which GGUF keeps at 8 bits) in int8. For a
  checkpoint converted from a Q4_1 GGUF these are the GGUF's own integers (engine/cpu/quantized_linear.py).
  Where the CPU has AVX-512 BF16 + VNNI both quantized formats run the engine's own row kernels
  (engine/cpu/cpu_rows.py): rows quantized to int8 per block of 32 and VNNI dot products (the class
  of arithmetic llama.cpp's CPU backend uses for Q4_1), one attention call for every decode and
  verify row, and fused norms, RoPE and SiLU; elsewhere aten's weight-only kernels with bfloat16
  rows and SDPA.
- `auto`: on a CPU with native bfloat16 dot products (its flags), int4 where the checkpoint's decoder
  weights already are Q4_1 values (a 4-bit GGUF's, de-quantized: int4 then serves the file's own
  integers; with the row kernels it moves next-token distributions 0.0040 nats per token from
  float32's, aten's kernels 0.0018, bfloat16 0.00086, benchmarks/format_fidelity.py), else
  bfloat16; elsewhere bfloat16 where it runs clearly faster than float32 (timed at load on the
  model's own weight shapes), else float32. Never int8, nor int4 for weights trained in floating
  point: those change the model's outputs.

A format is decided once into a `WeightFormat` (the capability object: its activation dtype, the row
kernels it runs or None, how far its rounding may move a logit), which prepares the target and the
drafter and which the rest of the package asks instead of naming a format: no format- or
kernel-specific branch lives outside engine/cpu/ (tests/test_architecture.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from sglang_dspark.engine.cpu import cpu_rows
from sglang_dspark.engine.cpu.draft_rows import DraftRows
from sglang_dspark.engine.cpu.limits import fits_attention
from sglang_dspark.engine.cpu.names import WEIGHT_FORMATS
from sglang_dspark.engine.cpu.one_row_gemv import one_row, pack_one_row_gemv, tune_one_row_kernels
from sglang_dspark.engine.cpu.quantized_linear import Int4Linear, Int8Linear, int4_fits_shape, int4_grid_share, quantize_linears
from sglang_dspark.engine.cpu.row_layer import RowWeights
from sglang_dspark.engine.cpu.timing import interleaved
from sglang_dspark.engine.cpu.weight_layout import pack_drafter_for_cpu, pack_linears_for_cpu, tune_layouts

logger = logging.getLogger(__name__)

# auto takes bfloat16 only when it is clearly faster: a close call keeps the checkpoint's values
AUTO_MIN_SPEEDUP = 1.2
# ... and on a CPU with bfloat16 dot-product instructions (AVX512_BF16, AMX) auto takes bfloat16 (int4
# for a 4-bit checkpoint) without timing: bfloat16 halves the bytes a step streams and computes
# natively, and every idle measurement found it faster, while a timing at start measures the
# neighbours too (four servers starting at once once timed bfloat16 slower than float32 in two of
# them, which then served float32: benchmarks/RESULTS_LOG.md, "Weight formats")
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# bfloat16 ulps at a logit within which the canary counts a replay's first different token as a near
# tie of the format's rounding (engine/canary.py); float32 keeps the checkpoint's arithmetic: none
NEAR_TIE_ULPS = 4.0
QUANTIZED = ("int8", "int4")


@dataclass(frozen=True)
class WeightFormat:
    """One model's weight format, decided once (`WeightFormat.of`): what the engine outside this wing
    may ask of it."""

    name: str
    kernels: object | None = None  # torch.ops of cpu_rows.cpp where this format runs them, else None

    @classmethod
    def of(cls, name: "str | WeightFormat", *, row_kernels: bool = True) -> "WeightFormat":
        """The format `name`; int8 and int4 take the row kernels where they run (`row_kernels=False`:
        aten's kernels and SDPA, as on a CPU without them; the side-by-side benchmarks use it)."""
        if isinstance(name, WeightFormat):
            return name
        _check(name)
        return cls(name, cpu_rows.ops() if row_kernels and name in QUANTIZED else None)

    @classmethod
    def running_in(cls, dtype: torch.dtype) -> "WeightFormat":
        """The unquantized format whose activations are `dtype` (a transformers model's)."""
        return cls.of("bfloat16" if dtype == torch.bfloat16 else "float32")

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of activations, norms, embeddings and the KV cache."""
        return activation_dtype(self.name)

    @property
    def quantized(self) -> bool:
        """Weights changed from the checkpoint's values: served against themselves, so no
        transformers model computes the same arithmetic."""
        return self.name in QUANTIZED

    @property
    def batch_invariant(self) -> bool:
        """Whether a request's decode and verify rows are bitwise the same whatever shares its step:
        the row kernels compute every row on its own (tests/test_batch_invariance.py)."""
        return self.kernels is not None

    @property
    def near_tie_ulps(self) -> float | None:
        """How far (bfloat16 ulps at the logit) this format's rounding may move a greedy choice: not at
        all in float32 or on the batch-invariant row kernels, where a replay computes the original's
        very bits and any difference is a defect."""
        return None if self.name == "float32" or self.batch_invariant else NEAR_TIE_ULPS

    @torch.no_grad()
    def prepare_target(self, model: nn.Module) -> None:
        """Put a target model (loaded in `self.dtype`) into this format."""
        if self.name == "float32":
            pack_linears_for_cpu(model)  # float32's fast CPU GEMM layout per row count
        elif self.name == "bfloat16":
            # oneDNN's row-major path, and at one row torch.mv where tuned faster (engine/cpu/one_row_gemv.py);
            # attention stays SDPA's, as transformers calls it, so greedy output equals transformers'
            pack_one_row_gemv(model)
        else:  # served against themselves, so the row kernel's own rounding is theirs
            if self.name == "int4":
                model.lm_head = Int8Linear(model.lm_head, self.kernels)  # GGUF's Q4_1 files keep the (tied) embedding at 8 bits
            quantize_linears(model, Int4Linear if self.name == "int4" else Int8Linear, self.kernels)
            layer = model.layers[0]
            if self.kernels is not None and fits_attention(layer.num_heads, layer.num_kv_heads, layer.head_dim):
                model.row_kernels = self.kernels
                for layer in model.layers:
                    layer.row_weights = RowWeights.of_target_layer(layer)
        model.fmt = self

    @torch.no_grad()
    def prepare_drafter(self, drafter: nn.Module) -> None:
        """Put a drafter (loaded in `self.dtype`) into this format. Where the target runs the row
        kernels, drafting runs them too (engine/cpu/draft_rows.py: int8 copies of its Linear layers,
        the module's own weights kept for any other use); elsewhere it stays in the activation dtype."""
        if self.name == "float32":
            pack_drafter_for_cpu(drafter)
        else:
            pack_one_row_gemv(drafter)  # its per-position Markov layers run one row at C = 1
        if self.kernels is not None and DraftRows.fits(drafter):
            drafter.rows = DraftRows(drafter, self.kernels)

    def tune(self, models: list[nn.Module]) -> None:
        """Time this host's choices for the models' CPU weights: float32's layouts per row count,
        bfloat16's one-row kernel (call after setting torch's thread count, which changes the answers)."""
        tune_layouts(models)
        tune_one_row_kernels(models)

    def describe(self, model: nn.Module) -> str:
        """What runs a prepared target's decode and verify rows, for the load log."""
        if not self.quantized:
            return f"{self.name}: torch's ops"
        linears = sorted({m.kernel for m in model.modules() if hasattr(m, "kernel")})
        rows = "the row kernels" if getattr(model, "row_kernels", None) is not None else "torch's ops, SDPA"
        return f"{self.name} decode and verify rows: {', '.join(linears)}; norms, RoPE, attention: {rows} ({cpu_rows.status()})"


def native_bf16_flags(cpuinfo: str = "/proc/cpuinfo") -> list[str]:
    """The CPU's bfloat16 dot-product flags (Linux /proc/cpuinfo); [] where unknown."""
    flags = cpu_rows.cpu_flags(cpuinfo)
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


# a checkpoint counts as Q4_1 when this share of every sampled weight's groups is on the grid
# (a de-quantized GGUF: all of them; weights trained in floating point: about none)
INT4_GRID_MIN_SHARE = 0.99


def checkpoint_int4_grid(weights: dict[str, torch.Tensor], shapes: dict[str, tuple] | None = None) -> str | None:
    """Why these decoder Linear weights (name -> [rows, in], a sample of the checkpoint's; `shapes`:
    their full shapes, default theirs) count as Q4_1 values, or None where any of them is off the
    grid or not a shape int4's kernel serves (it would fall back to int8, which auto never takes)."""
    shapes = shapes or {name: tuple(w.shape) for name, w in weights.items()}
    if not weights or not all(w.ndim == 2 and len(shapes[n]) == 2 and int4_fits_shape(*shapes[n])
                              for n, w in weights.items()):
        return None
    shares = {name: int4_grid_share(w) for name, w in weights.items()}
    if min(shares.values()) < INT4_GRID_MIN_SHARE:
        return None
    return f"{len(shares)} sampled weights, each with {min(shares.values()):.1%} or more of its groups of 32 on the grid"


def _time_stack(weights: list[torch.Tensor], rows: int, dtype: torch.dtype) -> float:
    x = {w.shape[1]: torch.randn(rows, w.shape[1], dtype=dtype) for w in weights}
    kernels = [F.linear]
    if rows == 1 and dtype == torch.bfloat16:  # the engine may serve one row by torch.mv (engine/cpu/one_row_gemv.py)
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
                native: list[str] | None = None, int4_grid: str | None = None) -> tuple[str, str]:
    """(format, reason) for `auto`. Where the CPU has native bfloat16 (`native`: its flags, default
    read from /proc/cpuinfo): int4 where `int4_grid` (what showed the checkpoint's weights to be Q4_1
    values, `checkpoint_int4_grid`; None: they are not), else bfloat16, untimed. Elsewhere every float32 Linear weight of the target
    in turn (so they stream from memory as in a real step) against the same weights in bfloat16, at
    1 and 8 rows, interleaved, the fastest of `reps` each (a busy neighbour only ever adds time; on a
    loaded 2-core host medians of 3 once made bfloat16 look slower than float32): bfloat16 from
    `AUTO_MIN_SPEEDUP` at both. `timer(weights, rows, dtype)` -> seconds (tests inject one)."""
    native = native_bf16_flags() if native is None else native
    if native and int4_grid is not None:
        return "int4", (f"this CPU computes bfloat16 natively ({', '.join(native)}) and the checkpoint's decoder weights "
                        f"are Q4_1 values ({int4_grid}), so auto serves their own 4-bit integers")
    if native:
        return "bfloat16", (f"this CPU computes bfloat16 natively ({', '.join(native)}), so auto takes bfloat16 "
                            f"without timing it (a timing at start also measures whatever else starts)")
    bf16 = [w.to(torch.bfloat16) for w in weights]
    ratios = []
    for rows in (1, 8):
        times = interleaved({"float32": lambda: timer(weights, rows, torch.float32),
                             "bfloat16": lambda: timer(bf16, rows, torch.bfloat16)}, reps)
        ratios.append(min(times["float32"]) / min(times["bfloat16"]))
    fmt = "bfloat16" if all(r >= AUTO_MIN_SPEEDUP for r in ratios) else "float32"
    return fmt, (f"bfloat16 Linear layers timed {ratios[0]:.2f}x (1 row) and {ratios[1]:.2f}x (8 rows) float32's "
                 f"speed on this CPU; auto takes bfloat16 from {AUTO_MIN_SPEEDUP:.1f}x")
