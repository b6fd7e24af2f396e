"""What the row kernels (cpu_rows.cpp) accept: the one Python owner of their limits.

Every caller that asks "does this shape run on the row kernels?" asks `fits`; the C++ checks the
same limits again with TORCH_CHECK (cpu_rows.cpp `kMaxGroup`, `kMaxHeadDim`, `kGroup`, `kLanes`), and
tests/test_cpu_rows.py holds the two sides to each other.
"""

from __future__ import annotations

GROUP = 32  # input values per quantization block (Q4_1's and the rows' Q8_1 blocks)
LANES = 16  # output features per kernel block (one float32 vector)
MAX_GROUP = 16  # query heads per kv head that rows_attention handles
MAX_HEAD_DIM = 256
# rows per request that take rows_attention, each over exactly the keys it sees: decode rows, verify
# blocks of gamma <= 15, a drafter's block; a longer segment (a prompt chunk) takes masked SDPA
EXACT_ROWS = 16


def fits_linear(out_features: int, in_features: int) -> bool:
    """Whether q4_rows_mm and q8_rows_mm serve a weight [out_features, in_features]."""
    return in_features % GROUP == 0 and out_features % LANES == 0


def fits_attention(num_heads: int, num_kv_heads: int, head_dim: int, rows: int = 1) -> bool:
    """Whether rows_attention (and rows_rope_store) serve these heads, `rows` rows per request."""
    return (num_heads % num_kv_heads == 0 and num_heads // num_kv_heads <= MAX_GROUP
            and head_dim <= MAX_HEAD_DIM and head_dim % 2 == 0 and rows <= EXACT_ROWS)
