"""Weight layouts for the CPU GEMMs of decode and verify.

`F.linear(x, W)` computes `x @ W.T`. With PyTorch's default [out, in] row-major weight, the CPU
BLAS can switch at a few rows to a path several times slower than a plain GEMM on the same numbers
(M = 2..32 tokens: exactly the rows of batched decode and speculative verify). Stored input-major
(W.T contiguous), the weight gets the plain path, but at some row counts the row-major copy is
faster. Which layout wins where depends on the CPU and its BLAS: on an Intel Xeon with MKL row-major
won at 1-3 rows and lost from 4 (benchmarks/target_forward.py measures both); on an AMD EPYC with the
same MKL the lm_head was slower row-major at 1-3 rows too, and a greedy 2-token verify cost about
twice a 1-token step until the layouts were timed here (benchmarks/decode_speed.py). So a
packed Linear keeps both copies and a per-shape set of row counts that use the row-major one:
rows 1-3 until `tune_layouts` has timed both layouts on this host. Values, shapes and state-dict names
are unchanged. The cost is a second copy of every Linear weight (538 MB for SmolLM2-135M in float32).
GPU weights are left alone: there SGLang (or cuBLAS) chooses its own layout. The engine packs both
models it runs, the target and the drafter, and tunes them at load (engine/factory.py).
"""
from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from sglang_dspark.engine.cpu.timing import interleaved


def input_major(weight: torch.Tensor) -> torch.Tensor:
    """The same [out, in] values, stored so that weight.T is contiguous (a no-op if already so)."""
    return weight.t().contiguous().t()


def is_input_major(weight: torch.Tensor) -> bool:
    return weight.dim() == 2 and weight.t().is_contiguous()


logger = logging.getLogger(__name__)

# Until tuned on this host: the row counts that use the row-major copy (measured on an Intel Xeon, MKL).
DEFAULT_ROW_MAJOR_ROWS = frozenset({1, 2, 3})
TUNED_ROWS = 8  # tune_layouts times 1..8 rows; from 9 rows the input-major copy is used


class DualLayoutLinear(nn.Linear):
    """An nn.Linear whose weight is stored input-major, plus a row-major copy used at the row
    counts in `row_major_rows`. Made by `pack_linears_for_cpu`, never constructed directly."""

    row_major_weight: torch.Tensor
    row_major_rows: frozenset[int] = DEFAULT_ROW_MAJOR_ROWS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        weight = self.row_major_weight if rows in self.row_major_rows else self.weight
        return F.linear(x, weight, self.bias)


@torch.no_grad()
def pack_linears_for_cpu(module: nn.Module) -> int:
    """Turn every CPU nn.Linear in `module` into a DualLayoutLinear; returns how many changed.

    The row-major copy is the original tensor, so a weight tied to an nn.Embedding costs only its
    input-major copy, and the embedding keeps the rows its lookups read.
    """
    changed = 0
    for linear in module.modules():
        if type(linear) is not nn.Linear or linear.weight.device.type != "cpu":
            continue
        row_major = linear.weight.data.contiguous()  # the same storage when already row-major
        linear.__class__ = DualLayoutLinear  # keeps parameters, hooks and state-dict names
        linear.register_buffer("row_major_weight", row_major, persistent=False)
        linear.weight = nn.Parameter(input_major(row_major), requires_grad=linear.weight.requires_grad)
        changed += 1
    return changed


@torch.no_grad()
def pack_drafter_for_cpu(drafter) -> None:
    """Pack a DSpark drafter: its Linear layers, and the shared lm_head buffer (and the rows of a
    hot draft vocabulary), whose [R * gamma, V] logits GEMM is the drafter's largest."""
    pack_linears_for_cpu(drafter)
    for name in ("lm_head_weight", "_vocab_lm_head", "_vocab_markov_w2"):
        weight = getattr(drafter, name, None)
        if weight is not None and weight.device.type == "cpu":
            setattr(drafter, name, input_major(weight))


def _time_linear(x: torch.Tensor, weight: torch.Tensor) -> float:
    start = time.perf_counter()
    F.linear(x, weight)
    return time.perf_counter() - start


@torch.no_grad()
def tune_layouts(modules: Iterable[nn.Module], *, max_rows: int = TUNED_ROWS, reps: int = 5,
                 timer: Callable[[torch.Tensor, torch.Tensor], float] = _time_linear) -> dict:
    """Time both copies of each distinct packed weight shape in `modules` at 1..`max_rows` rows,
    interleaved (one warm-up, medians of `reps`), and let every packed Linear of that shape use the
    row-major copy exactly where it was faster. Returns {(out, in): row counts using row-major}.
    `timer(x, weight)` -> seconds of one F.linear (tests inject one). About 1-2 s for SmolLM2-135M:
    the lm_head dominates."""
    by_shape: dict[tuple, list[DualLayoutLinear]] = {}
    for module in modules:
        for linear in module.modules():
            if isinstance(linear, DualLayoutLinear):
                by_shape.setdefault((linear.out_features, linear.in_features, linear.weight.dtype), []).append(linear)
    chosen = {}
    for (out, inn, dtype), linears in by_shape.items():
        sample = linears[0]
        row_major = set()
        for rows in range(1, max_rows + 1):
            x = torch.randn(rows, inn, dtype=dtype)
            times = interleaved({"row": lambda: timer(x, sample.row_major_weight),
                                 "input": lambda: timer(x, sample.weight)}, reps)
            if statistics.median(times["row"]) < statistics.median(times["input"]):
                row_major.add(rows)
        for linear in linears:
            linear.row_major_rows = frozenset(row_major)
        chosen[(out, inn)] = frozenset(row_major)
    if chosen:  # only float32 models carry two layouts
        logger.info("CPU weight layouts tuned: row-major at rows %s",
                    {f"{o}x{i}": sorted(r) for (o, i), r in chosen.items()})
    return chosen
