"""bfloat16 Linear layers at one row: `torch.mv` where it keeps a row's bits batch-invariant, or runs faster.

A decode step at R = 1 multiplies every weight by one row. On an Intel Xeon with AMX `F.linear` in
bfloat16 at one row cost about what it cost at 4-8 rows and more than `torch.mv` on the same weights:
one-row bfloat16 was slower than float32 until then, so `auto` kept float32 and lost the flat
verify cost that bfloat16 has there (`benchmarks/target_forward.py` measures whole steps; the
figures are in benchmarks/RESULTS_LOG.md, "An Intel Xeon with AMX").

The kernel is chosen per weight shape at load. First by batch invariance: a one-row decode's output
must equal that row's output inside a multi-row verify block bit for bit (verify rows run `F.linear`),
or greedy speculative decoding could differ from plain decoding at a near-tie. Which kernel keeps
that depends on the CPU: on one of the project's CPUs `F.linear` at one row rounded SmolLM2's
down_proj (576 x 1536) differently from its rows at 2-16 rows in some rows while `mv` matched them
all; on the other both matched (RESULTS_LOG, 'Batch-invariant rows'). Among the kernels that keep it, the faster, timed
over every weight of that shape in turn (so they stream from memory, as in a step). Values, shapes
and state-dict names are unchanged.
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

logger = logging.getLogger(__name__)


class OneRowGemvLinear(nn.Linear):
    """An nn.Linear that sends a single row through `torch.mv` (or `addmv` with a bias) once
    `tune_one_row_kernels` enabled it for its shape. Made by `pack_one_row_gemv`."""

    gemv: bool = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gemv and x.numel() == self.in_features:
            return one_row(x.reshape(-1), self.weight, self.bias).view(*x.shape[:-1], self.out_features)
        return F.linear(x, self.weight, self.bias)


def one_row(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.mv(weight, x) if bias is None else torch.addmv(bias, weight, x)


@torch.no_grad()
def pack_one_row_gemv(module: nn.Module) -> int:
    """Make every CPU bfloat16 nn.Linear of `module` a OneRowGemvLinear (off until tuned); returns
    how many changed."""
    changed = 0
    for linear in module.modules():
        if type(linear) is nn.Linear and linear.weight.device.type == "cpu" and linear.weight.dtype == torch.bfloat16:
            linear.__class__ = OneRowGemvLinear  # keeps parameters, hooks and state-dict names
            changed += 1
    return changed


def _time_shape(linears: list[OneRowGemvLinear], x: torch.Tensor, gemv: bool) -> float:
    start = time.perf_counter()
    for layer in linears:
        if gemv:
            one_row(x, layer.weight, layer.bias)
        else:
            F.linear(x[None], layer.weight, layer.bias)
    return time.perf_counter() - start


VERIFY_ROWS = (2, 8, 16)  # block widths a one-row kernel's output is checked against


def _invariant_kernels(layer: OneRowGemvLinear, rows: int = 64) -> dict[bool, bool]:
    """{gemv: whether one row through F.linear (False) or mv (True) gives the bits that row gets in
    multi-row F.linear blocks}, on random rows of the layer's own weights at three scales. The
    blocks are computed once for both kernels; both are False where the blocks themselves depend
    on their width (nothing to match)."""
    g = torch.Generator().manual_seed(0)
    w, bias = layer.weight, layer.bias
    invariant = {False: True, True: True}
    for scale in (0.1, 1.0, 10.0):
        x = (torch.randn(rows, layer.in_features, generator=g) * scale).to(w.dtype)
        for start in range(0, rows, max(VERIFY_ROWS)):
            block = x[start:start + max(VERIFY_ROWS)]
            multi = F.linear(block, w, bias)
            if any(not torch.equal(F.linear(block[:width], w, bias), multi[:width]) for width in VERIFY_ROWS[:-1]):
                return {False: False, True: False}
            for i, row in enumerate(block):
                invariant[False] = invariant[False] and torch.equal(F.linear(row[None], w, bias)[0], multi[i])
                invariant[True] = invariant[True] and torch.equal(one_row(row, w, bias), multi[i])
            if not any(invariant.values()):
                return invariant
    return invariant


@torch.no_grad()
def tune_one_row_kernels(modules: Iterable[nn.Module], *, reps: int = 5,
                         timer: Callable[[list, torch.Tensor, bool], float] = _time_shape) -> dict:
    """Per distinct weight shape in `modules`: which one-row kernel (F.linear or mv) is batch-invariant
    (_invariant_kernels); where both are, time them over all its layers, interleaved (a warm-up, then
    medians of `reps`), and take the faster; where neither is, the faster, with a warning. Returns
    {(out, in): whether mv serves one row}. `timer(linears, x, gemv)` -> seconds (tests inject one)."""
    by_shape: dict[tuple, list[OneRowGemvLinear]] = {}
    for module in modules:
        for layer in module.modules():
            if isinstance(layer, OneRowGemvLinear):
                key = (layer.out_features, layer.in_features, layer.weight.dtype, layer.bias is not None)
                by_shape.setdefault(key, []).append(layer)
    chosen = {}
    for (out, inn, dtype, _), linears in by_shape.items():
        invariant = _invariant_kernels(linears[0])
        if invariant[False] != invariant[True]:
            use = invariant[True]
        else:
            x = torch.randn(inn).to(dtype)
            times = interleaved({gemv: (lambda gemv=gemv: timer(linears, x, gemv)) for gemv in (False, True)}, reps)
            use = statistics.median(times[True]) < statistics.median(times[False])
            if not invariant[False]:
                logger.warning("bfloat16 %dx%d: no one-row kernel gives the bits of a multi-row block on this "
                               "CPU; greedy speculative output may differ from plain output at near-ties",
                               out, inn)
        for layer in linears:
            layer.gemv = use
        chosen[(out, inn)] = chosen.get((out, inn), True) and use
    if chosen:
        logger.info("bfloat16 one-row kernel tuned: mv for %s", sorted(f"{o}x{i}" for (o, i), use in chosen.items() if use))
    return chosen
