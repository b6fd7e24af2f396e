"""Price a budget at the CUDA-graph size SGLang runs it at.

In compact mode SGLang runs a step of R requests and budget k as the captured graph of
`round_up_grid(min(R + k, R * (gamma + 1)), capture_num_tokens)` tokens (80 tokens run as 96), and
pays for that graph, not for R + k. The captured sizes are the launcher's `--cuda-graph-bs-decode`
list times gamma + 1, passed in `SGLANG_DSPARK_GRAPH_TOKENS` (settings.py). The wrapper offers the
two prices the SLA decision reads (`step_seconds`, `steps_per_sec`, core/schedule.py).
"""

from __future__ import annotations

import numpy as np


class PaddedTable:
    def __init__(self, table, graph_tokens):
        self.table = table  # sglang_dspark.core.sps.SpsTable
        self.sizes = np.asarray(sorted(graph_tokens), dtype=np.int64)
        self.max_batch_tokens = table.max_batch_tokens

    def graph_tokens(self, batch_tokens: np.ndarray) -> np.ndarray:
        """round_up_grid per element (bisect_left over the sizes); past the last size SGLang falls
        back to a full verify, priced here at the tokens themselves."""
        idx = np.searchsorted(self.sizes, batch_tokens, side="left")
        return np.where(idx < self.sizes.size, self.sizes[np.minimum(idx, self.sizes.size - 1)], batch_tokens)

    def step_seconds(self, num_requests: int, count: int) -> np.ndarray:
        tokens = self.graph_tokens(num_requests + np.arange(count, dtype=np.int64))
        return self.table.seconds_at(np.full(count, num_requests), tokens, np.ones(count, dtype=bool))

    def steps_per_sec(self, num_requests: int, count: int) -> np.ndarray:
        return 1.0 / self.step_seconds(num_requests, count)
