"""Row-invariant CPU kernels for decode and verify rows (cpu_rows.cpp), built once per machine.

Why they exist: aten's int4 kernel (`_weight_int4pack_mm_for_cpu`) re-does its de-quantization for
every row, and the engine's batch-invariant attention was one SDPA call per row, so a verify block
of 8 rows cost several one-row decodes (an int4 SPS profile; RESULTS_LOG, 'The engine's own CPU row
kernels'). Here:
- `q4_rows_mm`: GGUF Q4_1 weights times bfloat16 rows quantized per block of 32 to int8 (llama.cpp's
  Q8_1, the arithmetic llama.cpp's CPU backend uses for Q4_1), VNNI dot products; the weights
  stream from memory once per call whatever the row count.
- `rows_attention`: every decode or verify row of every request in one call, each row over exactly
  the keys it sees, float32 accumulation.
- `rows_rmsnorm`, `rows_add_rmsnorm`, `rows_rope_store` (RoPE on q and k, k and v written to the
  cache), `rows_silu_mul`: a decoder layer's elementwise parts, one call each, in float32 rounded
  once to bfloat16; a step of a small model on a CPU is dispatch-bound, and these had been about 30
  small torch ops a layer, half of a one-row step.
Each output row is computed by the same instructions in the same order whatever shares its call and
however the threads split it, so a verify block's rows equal the decodes they replace bit for bit
(tests/test_cpu_rows.py). `benchmarks/cpu_rows.py` times both against aten's paths.

They need AVX-512 (F, BW, VL, DQ) with BF16 and VNNI, and F16C (an AMD EPYC Zen 4+, an Intel Xeon
Cooper Lake+), g++ and ninja; the build (about 15 s) is cached by torch under
TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions). Elsewhere, where the build fails, or with
SGLANG_DSPARK_CPU_KERNELS=0, `ops()` is None and the engine keeps aten's kernels; the reason is
logged once and `status()` returns it.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_rows.cpp")
REQUIRED_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "avx512_vnni", "f16c")
# explicit ISA flags, not -march=native: a cached build must run on any CPU that has these
CFLAGS = ["-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16",
          "-mavx512vnni", "-mf16c"]
DISABLE_ENV = "SGLANG_DSPARK_CPU_KERNELS"
# SGLANG_DSPARK_CPU_KERNELS_CHECKED=1 builds the kernels with AddressSanitizer and libstdc++'s bounds
# assertions (a separate cached build; the process needs libasan preloaded): the slow suite's check
CHECKED_ENV = "SGLANG_DSPARK_CPU_KERNELS_CHECKED"
CHECKED_FLAGS = ["-fsanitize=address", "-fno-omit-frame-pointer", "-D_GLIBCXX_ASSERTIONS"]
LIBRARY = "dspark_cpu_rows"  # TORCH_LIBRARY namespace in cpu_rows.cpp


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo); empty where unknown."""
    try:
        with open(cpuinfo) as f:
            return set(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
    except OSError:
        return set()


@functools.cache
def _load() -> tuple[object | None, str]:
    """(torch.ops namespace or None, why), once per process, logged."""
    loaded, why = _build()
    if loaded is None:
        logger.warning("sglang_dspark CPU row kernels unavailable, aten's kernels instead: %s", why)
    else:
        logger.info("sglang_dspark CPU row kernels: %s", why)
    return loaded, why


def _build() -> tuple[object | None, str]:
    if os.environ.get(DISABLE_ENV, "1") == "0":
        return None, f"{DISABLE_ENV}=0"
    missing = [flag for flag in REQUIRED_FLAGS if flag not in cpu_flags()]
    if missing:
        return None, f"this CPU lacks {', '.join(missing)}"
    try:
        from torch.utils.cpp_extension import load

        checked = os.environ.get(CHECKED_ENV) == "1"
        cflags = CFLAGS + (CHECKED_FLAGS if checked else [])
        digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(cflags).encode()).hexdigest()[:12]
        load(name=f"sglang_dspark_cpu_rows_{digest}", sources=[str(SOURCE)], extra_cflags=cflags,
             extra_ldflags=["-fopenmp"] + (["-fsanitize=address"] if checked else []), is_python_module=False)
    except Exception as e:  # no compiler, no ninja, a build error: the engine keeps aten's kernels
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return None, f"building {SOURCE.name} failed ({type(e).__name__}: {first})"
    return getattr(torch.ops, LIBRARY), f"built {SOURCE.name} (AVX-512 BF16 + VNNI)"


def ops():
    """torch.ops.dspark_cpu_rows (the kernels above), or None where unavailable. Whether a model uses
    them is its weight format's decision (engine/cpu/formats.py `WeightFormat.kernels`)."""
    return _load()[0]


def status() -> str:
    """Why the kernels are or are not in use."""
    return _load()[1]


@torch.no_grad()
def pack_q4(q: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q4_rows_mm's operands from Q4_1 groups (q [N, K] in 0..15, scale and minimum [N, K/32],
    w = scale * q + minimum): (qweight uint8 [N/16, K/32, 4, 64], scale_min float16 [N/16, K/32, 2, 16]).
    Per block of 16 output features and group, byte 4n + b of vector j holds q[n][8j + b] in its low
    nibble and q[n][8j + 4 + b] in its high one. Scale and minimum in float16, as a GGUF stores them."""
    n, k = q.shape
    if n % 16 or k % 32:
        raise ValueError(f"q4_rows_mm needs out % 16 == 0 and in % 32 == 0, got {n} x {k}")
    blocks, groups = n // 16, k // 32
    nib = q.to(torch.uint8).view(blocks, 16, groups, 4, 2, 4)  # [block, n, group, j, low|high, b]
    packed = (nib[..., 0, :] | (nib[..., 1, :] << 4)).permute(0, 2, 3, 1, 4).reshape(blocks, groups, 4, 64)
    scale_min = torch.stack([scale.half(), minimum.half()]).view(2, blocks, 16, groups).permute(1, 3, 0, 2)
    return packed.contiguous(), scale_min.contiguous()


@torch.no_grad()
def pack_q8(q: torch.Tensor) -> torch.Tensor:
    """q8_rows_mm's weight operand from int8 q [N, K]: uint8 q + 128 as [N/16, K/32, 8, 64], byte 4n + b
    of vector t holding q[n][32g + 4t + b] + 128."""
    n, k = q.shape
    if n % 16 or k % 32:
        raise ValueError(f"q8_rows_mm needs out % 16 == 0 and in % 32 == 0, got {n} x {k}")
    shifted = (q.to(torch.int16) + 128).to(torch.uint8).view(n // 16, 16, k // 32, 8, 4)  # [block, n, group, t, b]
    return shifted.permute(0, 2, 3, 1, 4).reshape(n // 16, k // 32, 8, 64).contiguous()


def unpack_q8(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """pack_q8's inverse: int8 [n, k]."""
    shifted = packed.view(n // 16, k // 32, 8, 16, 4).permute(0, 3, 1, 2, 4).reshape(n, k)
    return (shifted.to(torch.int16) - 128).to(torch.int8)
