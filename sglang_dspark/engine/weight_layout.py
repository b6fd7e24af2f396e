"""Weight layouts for the CPU GEMMs of decode and verify.

`F.linear(x, W)` computes `x @ W.T`. With PyTorch's default [out, in] row-major weight, the CPU
BLAS switches at 4 rows to a path that is 1.4-6x slower than a plain GEMM on the same numbers
(M = 4..32 tokens: exactly the rows of batched decode and speculative verify). Stored input-major
(W.T contiguous), the weight gets the plain path from 4 rows up, but 1-3 rows (single-request
decode, short verifies) run up to 20 % slower than row-major does. So a packed Linear keeps both:
row-major for 1-3 rows, input-major from 4 (benchmarks/target_forward.py measures both). Values,
shapes and state-dict names are unchanged. The cost is a second copy of every Linear weight (538 MB
for SmolLM2-135M in float32). GPU weights are left alone: there SGLang (or cuBLAS) chooses its
own layout. The engine packs both models it runs, the target and the drafter.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def input_major(weight: torch.Tensor) -> torch.Tensor:
    """The same [out, in] values, stored so that weight.T is contiguous (a no-op if already so)."""
    return weight.t().contiguous().t()


def is_input_major(weight: torch.Tensor) -> bool:
    return weight.dim() == 2 and weight.t().is_contiguous()


# The smallest row count at which the input-major copy is faster (measured on x86 with MKL).
INPUT_MAJOR_MIN_ROWS = 4


class DualLayoutLinear(nn.Linear):
    """An nn.Linear whose weight is stored input-major, plus a row-major copy used below
    INPUT_MAJOR_MIN_ROWS rows. Made by `pack_linears_for_cpu`, never constructed directly."""

    row_major_weight: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        weight = self.row_major_weight if rows < INPUT_MAJOR_MIN_ROWS else self.weight
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
