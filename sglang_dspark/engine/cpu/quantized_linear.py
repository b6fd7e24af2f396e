"""Quantized Linear layers for the CPU reference engine (bfloat16 activations in and out).

- `Int8Linear`: int8 weights, one scale per output row (symmetric, round to nearest).
- `Int4Linear`: 4-bit weights in groups of 32 along the input, each group with its own scale and
  minimum: GGUF's Q4_1 block. A checkpoint converted from a Q4_1 GGUF (the zoo's SmolLM2) holds
  exactly d * q + m per block, with q = 0 at the block's minimum and q = 15 at its maximum, so
  min-max quantization recovers the GGUF's own integers.

Two kernel paths, chosen per layer at construction (`kernel` names it):
- The engine's own (engine/cpu/cpu_rows.py), where the CPU has AVX-512 BF16 + VNNI: the rows are
  quantized to int8 per block of 32 (llama.cpp's Q8_1) and multiplied by VNNI integer dot
  products, the weights streaming from memory once per call whatever the row count; int4 keeps the
  scale and minimum in float16, as the GGUF does. This is the class of arithmetic llama.cpp's CPU
  backend uses for Q4_1 weights (its Q8_1 blocks keep float16 scales and round half away from zero;
  ours keep float32 and round half to even); int8 weights keep one scale per output row. They
  beat aten's int4 kernel at every row count, the more the more rows (benchmarks/cpu_rows.py).
- aten's weight-only kernels elsewhere (`_weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`),
  bfloat16 rows; aten's int4 kernel takes each group's scale and zero point (minimum + 8 scales)
  in bfloat16, so those two are rounded (a group far from zero relative to its range loses
  resolution: 100 + U(0, 0.01) comes back as 100.0; weights sit around zero).

Every kernel computes each row of x on its own: a row's output does not depend on how many rows it
shares a call with (tests/test_weight_format.py, tests/test_cpu_rows.py), which keeps a verify
block's rows equal to the one-row decodes they replace.

Both int4 kernels are GEMVs at heart: for a prompt's many rows oneDNN's bfloat16 GEMM over the same
values is faster (several times aten's kernel at 1,024 rows; benchmarks/int4_prefill.py, RESULTS_LOG),
so an `Int4Linear` keeps its weight de-quantized in bfloat16 too (the grid the kernel reads, rounded
once) and multiplies a prompt chunk's rows by it (`prompt_rows`, which the target's layers call for
prompt chunks only). Decode and verify rows always go through the kernel (`forward`), so they do not
depend on what shares their call. Prompt rows always go through the copy, one call per chunk (a one-row chunk as two rows: on a
2-core AMD EPYC oneDNN's one-row path rounded down_proj rows apart from 2+ rows, which all agreed).
On an Intel Xeon with AMX oneDNN rounded rows apart at most row counts below 256, so there a prompt
row's bits depend on the chunk it was prefilled in, as they do anyway through the masked attention
call a packed chunk shares. Calls of exactly 256 rows would avoid the first part and cost
more than a prompt's own prefill there, with no consistent gain in how often a packed request's output
equals its own (benchmarks/prefill_invariance.py); the canary tells such rounding from corruption
(engine/canary.py). The copy costs 2 bytes per weight of resident memory, which the decode step
never reads.
"""

from __future__ import annotations

import abc

import torch
import torch.nn.functional as F
from torch import nn

from sglang_dspark.engine.cpu import cpu_rows
from sglang_dspark.engine.cpu.limits import fits_linear

INT4_GROUP = 32  # Q4_1's block size
ATEN_INT8_K_MULTIPLE = 16  # in_features aten._weight_int8pack_mm reads safely (Int8Linear)
INT4_LEVELS = 15
# the kernel dequantizes (q - 8) * scale + zero; packing needs N divisible by 16
_INT4_OFFSET, _INT4_N_MULTIPLE, _INT4_INNER_K_TILES = 8, 16, 8


class _WeightOnlyLinear(nn.Module, metaclass=abc.ABCMeta):
    """What both formats share: bfloat16 rows in, one kernel call (`_mm`), the bias, the shape back.
    Each format implements `_mm` and `dequantized`."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().to(torch.bfloat16),
                                                                  requires_grad=False)

    @abc.abstractmethod
    def _mm(self, rows: torch.Tensor) -> torch.Tensor:
        """rows W^T for contiguous bfloat16 rows [M, in] (`_apply` adds the bias)."""

    @abc.abstractmethod
    def dequantized(self) -> torch.Tensor:
        """The weight this layer multiplies by, as bfloat16 [out, in]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Decode and verify rows: each row on its own, whatever shares the call."""
        return self._apply(self._mm, x)

    def prompt_rows(self, x: torch.Tensor) -> torch.Tensor:
        """A prompt chunk's rows (the same as `forward` unless a format keeps a faster copy for many rows)."""
        return self.forward(x)

    def _apply(self, mm, x: torch.Tensor) -> torch.Tensor:
        out = mm(x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous())  # the kernels refuse strided rows
        if self.bias is not None:
            out = out + self.bias
        return out.view(*x.shape[:-1], self.out_features)


class Int8Linear(_WeightOnlyLinear):
    """y = x W^T + b with W stored as int8 [out, in] and one scale per output row. Rows go through
    the engine's own Q8 x Q8 kernel where `ops` (cpu_rows.ops(), or None) is given and the shape fits
    it (rows quantized to int8 per block of 32, as llama.cpp does), else through aten's int8 kernel
    (bfloat16 rows). `kernel` names the one this layer took."""

    def __init__(self, linear: nn.Linear, ops=None):
        super().__init__(linear)
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127.0
        q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
        self.register_buffer("scales", scale.to(torch.bfloat16))
        self._ops = ops if fits_linear(self.out_features, self.in_features) else None
        if self._ops is not None:
            self.kernel = "q8_rows_mm"
            self.register_buffer("weight_q8", cpu_rows.pack_q8(q))
            self.register_buffer("scales_f32", self.scales.float(), persistent=False)
        else:
            self.kernel = "aten._weight_int8pack_mm"
            self.register_buffer("weight_int8", q)
            # aten's kernel (torch 2.14) reads past a row whose length is not a multiple of 16 from 4
            # rows on (a segfault at in = 8, 24, 40): zero columns make the length one, same products
            self._pad = -self.in_features % ATEN_INT8_K_MULTIPLE
            if self._pad:
                self.register_buffer("_weight_int8_padded", F.pad(q, (0, self._pad)), persistent=False)

    def _mm(self, rows: torch.Tensor) -> torch.Tensor:
        if self._ops is not None:
            return self._ops.q8_rows_mm(rows, self.weight_q8, self.scales_f32)
        if self._pad:
            return torch.ops.aten._weight_int8pack_mm(F.pad(rows, (0, self._pad)), self._weight_int8_padded, self.scales)
        return torch.ops.aten._weight_int8pack_mm(rows, self.weight_int8, self.scales)

    def int8_weight(self) -> torch.Tensor:
        """The int8 weight [out, in], from whichever layout the kernel reads."""
        if self._ops is None:
            return self.weight_int8
        n, k = self.out_features, self.in_features
        return cpu_rows.unpack_q8(self.weight_q8, n, k)

    def dequantized(self) -> torch.Tensor:
        """q * scale rounded once to bfloat16: what aten's kernel multiplies by, in closed form (the
        identity through the kernel would cost a GEMM of in x in x out: the lm_head's is 3e10 FLOP)."""
        return (self.int8_weight().float() * self.scales.float()[:, None]).to(torch.bfloat16)


def int4_groups(w: torch.Tensor, group: int = INT4_GROUP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q [out, in] int32 in 0..15, scale [out, in/group], minimum [out, in/group]) with
    w ~= q * scale + minimum per group: min-max, round to nearest."""
    n, k = w.shape
    g = w.float().view(n, k // group, group)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = ((hi - lo) / INT4_LEVELS).clamp_min(1e-12)  # a constant group: q = 0, its value in the minimum
    q = torch.round((g - lo[..., None]) / scale[..., None]).clamp(0, INT4_LEVELS).to(torch.int32)
    return q.view(n, k), scale, lo


# a value on the grid comes back within float32 rounding (and its storage dtype's); off the grid
# the worst of a group's 32 errors is close to scale / 2
GRID_TOLERANCE = 1e-3


def int4_grid_share(w: torch.Tensor, group: int = INT4_GROUP) -> float:
    """The share of `w`'s groups that are exactly q * scale + minimum with q in 0..15 (to float
    rounding): 1.0 for a checkpoint de-quantized from a Q4_1 GGUF, whose integers int4 then serves
    unchanged; about 0 for weights trained in floating point, which int4 would move."""
    q, scale, lo = int4_groups(w, group)
    g = w.float().view(q.shape[0], -1, group)
    error = (g - (q.view_as(g) * scale[..., None] + lo[..., None])).abs().amax(-1)
    # a checkpoint stored in bfloat16 or float16 rounded each grid value once more
    stored = 2 * torch.finfo(w.dtype).eps * g.abs().amax(-1) if w.is_floating_point() else 0.0
    return float((error <= torch.maximum(GRID_TOLERANCE * scale, torch.as_tensor(stored))).float().mean())


def int4_fits_shape(out_features: int, in_features: int) -> bool:
    """Whether int4's kernel serves a weight of this shape (else quantize_linears falls back to int8)."""
    return in_features % INT4_GROUP == 0 and out_features % _INT4_N_MULTIPLE == 0


def int4_fits(linear: nn.Linear) -> bool:
    return int4_fits_shape(linear.out_features, linear.in_features)


class Int4Linear(_WeightOnlyLinear):
    """y = x W^T + b with W stored as 4-bit groups of 32 (scale and minimum per group). Decode and
    verify rows go through the engine's own Q4_1 x Q8_1 kernel where `ops` (cpu_rows.ops(), or None)
    is given (the rows are quantized to int8 per block of 32, as llama.cpp does; weights stream once
    per call whatever the rows), else through aten's int4 kernel (bfloat16 rows; its scale and zero in
    bfloat16). Prompt rows multiply the bfloat16 copy (`prompt_rows`). `kernel` names the kernel
    decode rows take."""

    def __init__(self, linear: nn.Linear, ops=None):
        if not int4_fits(linear):
            raise ValueError(f"int4 needs in_features % {INT4_GROUP} == 0 and out_features % {_INT4_N_MULTIPLE} == 0, "
                             f"got {linear.in_features} -> {linear.out_features}")
        super().__init__(linear)
        q, scale, lo = int4_groups(linear.weight.detach())
        self._ops = ops
        if self._ops is not None:
            self.kernel = "q4_rows_mm"
            qweight, scale_min = cpu_rows.pack_q4(q, scale, lo)
            self.register_buffer("weight_q4", qweight)
            self.register_buffer("scale_min", scale_min)
            # the prefill copy: scale * q + minimum from the float16 scale and minimum the kernel reads
            grid = q.view(q.shape[0], -1, INT4_GROUP).float() * scale.half().float()[..., None] + lo.half().float()[..., None]
        else:
            self.kernel = "aten._weight_int4pack_mm_for_cpu"
            zero = lo + _INT4_OFFSET * scale
            self.register_buffer("weight_int4", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, _INT4_INNER_K_TILES))
            # [in/group, out, 2], as the kernel reads it
            self.register_buffer("scales_and_zeros",
                                 torch.stack([scale, zero], -1).transpose(0, 1).contiguous().to(torch.bfloat16))
            # the prefill copy: the same grid values (q - 8) * scale + zero from the rounded scale and
            # zero the kernel reads, rounded once to bfloat16
            sz = self.scales_and_zeros.float().transpose(0, 1)  # [out, in/group, 2]
            grid = (q.view(q.shape[0], -1, INT4_GROUP).float() - _INT4_OFFSET) * sz[..., :1] + sz[..., 1:]
        self.register_buffer("weight_bf16", grid.view_as(q).to(torch.bfloat16), persistent=False)

    def prompt_rows(self, x: torch.Tensor) -> torch.Tensor:
        """Every prompt row through the copy whatever its chunk's size, never a mix of copy and kernel
        by size (a short chunk pays: at 8 rows the kernel is faster, benchmarks/int4_prefill.py)."""
        return self._apply(self._copy_mm, x)

    def _copy_mm(self, rows: torch.Tensor) -> torch.Tensor:
        if rows.shape[0] == 1:  # oneDNN's one-row path rounds some rows apart from 2+ rows (down_proj's shape)
            return F.linear(rows.expand(2, -1), self.weight_bf16)[:1]
        return F.linear(rows, self.weight_bf16)

    def _mm(self, rows: torch.Tensor) -> torch.Tensor:
        if self._ops is not None:
            return self._ops.q4_rows_mm(rows, self.weight_q4, self.scale_min)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.weight_int4, INT4_GROUP, self.scales_and_zeros)

    def dequantized(self) -> torch.Tensor:
        """The weight as bfloat16 [out, in]: the prefill copy. aten's kernel multiplies by exactly
        these values (its output on the identity, tests/test_int4_checkpoints.py); the Q4_1 x Q8_1
        kernel by the same grid in float32, and it rounds the rows to int8 too."""
        return self.weight_bf16


@torch.no_grad()
def quantize_linears(module: nn.Module, kind: type[nn.Module], ops=None) -> int:
    """Replace every plain nn.Linear of `module` by `kind(linear, ops)` (Int4Linear falls back to
    Int8Linear where the shape does not fit its kernel); returns how many."""
    targets = [(parent, name, child) for parent in module.modules() for name, child in parent.named_children()
               if type(child) is nn.Linear]
    for parent, name, child in targets:
        layer_kind = Int8Linear if kind is Int4Linear and not int4_fits(child) else kind
        setattr(parent, name, layer_kind(child, ops))
    return len(targets)
