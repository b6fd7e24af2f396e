"""Steps-per-second tables SPS(B): the engine's profiled speed at B verify tokens per step.

Both of SGLang 0.5.23's JSON formats are read and written field for field
(`srt/speculative/dspark_components/dspark_sps.py`), with its lookup semantics:
- `SpsCostTable`: SPS is a floor step function of the batch tokens, clamped at both ends.
- `SpsAdditiveCostTable`: step seconds = bias + interp(alpha, R) + interp(theta, R + budget),
  linear interpolation clamped at both ends. Told apart on disk by the key "bias_seconds".

Our engine skips the drafter on steps whose budget is 0, which SGLang never does; a table may
carry that saving per batch size (`draft_skip_seconds`, aligned with the additive table's
`bs_probes`), so budget 0 is priced as the step the engine really runs. SGLang's files never
hold it: they describe SGLang's always-drafting step. Between two probes the saving is at most
the interpolated *share* of the drafted step it is taken from: the seconds alone, interpolated,
can exceed a step that bends between the probes, and a price of zero or less is a crash (1 / 0)
or a planner that believes a step gains time. A probe's saving must be below its own step.

`SpsTable` wraps either and precomputes a dense curve over every batch size, as a numpy array: the
planner runs on the host (like SGLang's `HostConfidenceBudgetPlanner`) and a lookup becomes a
slice instead of a rebuild of tensors from lists, the cost that dominates upstream's planner.
"""

from __future__ import annotations

import bisect
from pathlib import Path

import numpy as np
import torch
from pydantic import model_validator

from sglang_dspark.core.schema import FieldError, StrictModel


class SpsCostTable(StrictModel):
    sample_batch_tokens: list[int]
    sample_steps_per_sec: list[float]
    max_batch_tokens: int

    @model_validator(mode="after")
    def _check(self) -> SpsCostTable:
        tokens = self.sample_batch_tokens
        if not tokens:
            raise FieldError("sample_batch_tokens", "at least one probe is required")
        if any(b < 1 for b in tokens) or any(b >= c for b, c in zip(tokens, tokens[1:])):
            raise FieldError("sample_batch_tokens", f"must be >= 1 and strictly increasing, got {tokens}")
        if len(tokens) != len(self.sample_steps_per_sec):
            raise FieldError("sample_steps_per_sec", f"length {len(self.sample_steps_per_sec)} != {len(tokens)} probes")
        if any(not s > 0 for s in self.sample_steps_per_sec):
            raise FieldError("sample_steps_per_sec", "every value must be > 0")
        if self.max_batch_tokens < tokens[-1]:
            raise FieldError("max_batch_tokens", f"{self.max_batch_tokens} is below the largest probe {tokens[-1]}")
        return self


class SpsAdditiveCostTable(StrictModel):
    bias_seconds: float
    bs_probes: list[int]
    alpha_seconds: list[float]
    m_probes: list[int]
    theta_seconds: list[float]

    @model_validator(mode="after")
    def _check(self) -> SpsAdditiveCostTable:
        for name, probes, values in (
            ("bs_probes", self.bs_probes, self.alpha_seconds),
            ("m_probes", self.m_probes, self.theta_seconds),
        ):
            if not probes or any(a >= b for a, b in zip(probes, probes[1:])):
                raise FieldError(name, f"must be non-empty and strictly increasing, got {probes}")
            if len(probes) != len(values):
                raise FieldError(name, f"length {len(probes)} != {len(values)} values")
        if not self.bias_seconds > 0:
            raise FieldError("bias_seconds", f"must be > 0, got {self.bias_seconds}")
        return self


def interp_clamped(xs: list[int], ys: list[float], x: float) -> float:
    """Linear interpolation clamped to the end values (SGLang's `_interp_clamped`)."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    hi = bisect.bisect_right(xs, x)
    lo = hi - 1
    frac = (x - xs[lo]) / (xs[hi] - xs[lo])
    return ys[lo] + frac * (ys[hi] - ys[lo])


class SpsTable:
    """SPS(B) in either SGLang format, with dense precomputed lookups.

    `steps_per_sec(num_requests, count)` and `step_seconds(...)` give the curve at batch tokens
    B = num_requests + k, k = 0..count-1 (k is the draft budget). For the 1-D table num_requests
    only offsets B; for the additive table it also sets the per-request term.
    """

    def __init__(self, table: SpsCostTable | SpsAdditiveCostTable, draft_skip_seconds: list[float] | None = None):
        self.table = table
        self.draft_skip_seconds = draft_skip_seconds
        if draft_skip_seconds is not None:
            if not isinstance(table, SpsAdditiveCostTable):
                raise ValueError("draft_skip_seconds: needs the additive table (it is per batch size R)")
            if len(draft_skip_seconds) != len(table.bs_probes):
                raise ValueError(f"draft_skip_seconds: length {len(draft_skip_seconds)} != "
                                 f"{len(table.bs_probes)} bs_probes")
            if any(not 0 <= s for s in draft_skip_seconds):
                raise ValueError("draft_skip_seconds: every value must be >= 0")
            at_probes = self._drafted_at_r(np.asarray(table.bs_probes, dtype=np.float64), table)
            if (np.asarray(draft_skip_seconds) >= at_probes).any():
                raise ValueError("draft_skip_seconds: each must be below the drafted step at its batch size "
                                 f"(steps {at_probes.round(9).tolist()}, skips {list(draft_skip_seconds)})")
            self._skip_share = (np.asarray(draft_skip_seconds) / at_probes).tolist()
        if isinstance(table, SpsCostTable):
            self.max_batch_tokens: int | None = table.max_batch_tokens
            b = torch.arange(table.max_batch_tokens + 1, dtype=torch.int64)
            probes = torch.tensor(table.sample_batch_tokens, dtype=torch.int64)
            idx = (torch.bucketize(b, probes, right=True) - 1).clamp_(0, probes.numel() - 1)
            self._dense_sps = torch.tensor(table.sample_steps_per_sec, dtype=torch.float64)[idx].numpy()
        else:
            self.max_batch_tokens = None
            self._m_probes = torch.tensor(table.m_probes, dtype=torch.float64)
            self._theta = torch.tensor(table.theta_seconds, dtype=torch.float64)
            m = torch.arange(table.m_probes[-1] + 1, dtype=torch.float64)
            self._dense_theta = self._theta_at(m).numpy()

    # -- construction and files -------------------------------------------------------------
    @classmethod
    def from_points(
        cls, batch_tokens: list[int], steps_per_sec: list[float], max_batch_tokens: int | None = None
    ) -> SpsTable:
        return cls(
            SpsCostTable(
                sample_batch_tokens=[int(b) for b in batch_tokens],
                sample_steps_per_sec=[float(s) for s in steps_per_sec],
                max_batch_tokens=int(max_batch_tokens if max_batch_tokens is not None else batch_tokens[-1]),
            )
        )

    @classmethod
    def flat(cls, max_batch_tokens: int) -> SpsTable:
        """SGLang's uninitialised table: constant SPS, so every planner verifies everything."""
        return cls.from_points([1], [1.0], max_batch_tokens)

    @property
    def is_flat(self) -> bool:
        return isinstance(self.table, SpsCostTable) and len(self.table.sample_batch_tokens) <= 1

    @classmethod
    def from_json(cls, text: str | bytes) -> SpsTable:
        data = text.encode() if isinstance(text, str) else text
        kind = SpsAdditiveCostTable if b'"bias_seconds"' in data else SpsCostTable
        return cls(kind.model_validate_json(data))

    def to_json(self) -> str:
        return self.table.model_dump_json()

    @classmethod
    def load(cls, path: str | Path) -> SpsTable:
        return cls.from_json(Path(path).read_bytes())

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    def to_dict(self) -> dict:
        """The table's fields and, when it has one, the drafter-skip saving (for /server_info)."""
        return {**self.table.model_dump(), "draft_skip_seconds": self.draft_skip_seconds}

    # -- lookups ----------------------------------------------------------------------------
    def _theta_at(self, m: torch.Tensor) -> torch.Tensor:
        # SGLang's `_additive_step_time_tensor` interpolation, op for op, so values are bit-equal.
        probes = self._m_probes
        m = m.clamp(min=float(probes[0]), max=float(probes[-1]))
        hi = torch.bucketize(m, probes, right=True).clamp_(1, max(probes.numel() - 1, 1))
        lo = hi - 1
        if probes.numel() == 1:
            return self._theta[lo.clamp(max=0)]
        span = (probes[hi] - probes[lo]).clamp_(min=1e-9)
        frac = (m - probes[lo]) / span
        return self._theta[lo] + frac * (self._theta[hi] - self._theta[lo])

    @staticmethod
    def _window(dense: np.ndarray, start: int, count: int) -> np.ndarray:
        """dense[start : start + count] with indices clamped to the last entry (a slice, no gather)."""
        stop = start + count
        if stop <= dense.size:
            return dense[start:stop]
        head = dense[min(start, dense.size - 1) : dense.size]
        return np.concatenate([head, np.full(count - head.size, dense[-1])])

    @staticmethod
    def _drafted_at_r(r: np.ndarray, t: SpsAdditiveCostTable) -> np.ndarray:
        """Seconds of a drafted step of R requests verifying no draft (B = R): what a skip saves from."""
        return t.bias_seconds + np.interp(r, t.bs_probes, t.alpha_seconds) + np.interp(r, t.m_probes, t.theta_seconds)

    def draft_skip(self, num_requests: int, drafted_seconds: float | None = None) -> float:
        """Seconds a step of `num_requests` saves when its budget is 0 and the drafter is skipped;
        `drafted_seconds` is that step's drafted price at B = R when the caller already has it."""
        if self.draft_skip_seconds is None:
            return 0.0
        t, r = self.table, float(num_requests)
        drafted = float(self._drafted_at_r(r, t)) if drafted_seconds is None else drafted_seconds
        return min(interp_clamped(t.bs_probes, self.draft_skip_seconds, r),
                   interp_clamped(t.bs_probes, self._skip_share, r) * drafted)

    def step_seconds(self, num_requests: int, count: int) -> np.ndarray:
        """Step seconds at batch tokens B = num_requests + k for k = 0..count-1."""
        if isinstance(self.table, SpsCostTable):
            return 1.0 / self.steps_per_sec(num_requests, count)
        t = self.table
        floor = t.bias_seconds + interp_clamped(t.bs_probes, t.alpha_seconds, float(num_requests))
        seconds = floor + self._window(self._dense_theta, num_requests, count)
        if self.draft_skip_seconds is not None and count:
            seconds[0] -= self.draft_skip(num_requests, float(seconds[0]))  # budget 0: no drafter in the step
        return seconds

    def steps_per_sec(self, num_requests: int, count: int) -> np.ndarray:
        """SPS at batch tokens B = num_requests + k for k = 0..count-1."""
        if isinstance(self.table, SpsCostTable):
            return self._window(self._dense_sps, num_requests, count)
        return 1.0 / self.step_seconds(num_requests, count)

    def seconds_at(self, num_requests, batch_tokens, drafted) -> np.ndarray:
        """Step seconds for arrays of steps at once (the online estimator's residuals): the same
        prices as 1 / self(batch_tokens, num_requests, drafted), vectorised."""
        r = np.asarray(num_requests, dtype=np.float64)
        b = np.asarray(batch_tokens, dtype=np.float64)
        if isinstance(self.table, SpsCostTable):
            idx = np.clip(np.searchsorted(self.table.sample_batch_tokens, b, side="right") - 1, 0, None)
            return 1.0 / np.asarray(self.table.sample_steps_per_sec)[idx]
        t = self.table
        seconds = t.bias_seconds + np.interp(r, t.bs_probes, t.alpha_seconds) + np.interp(b, t.m_probes, t.theta_seconds)
        if self.draft_skip_seconds is not None:
            skip = np.minimum(np.interp(r, t.bs_probes, self.draft_skip_seconds),
                              np.interp(r, t.bs_probes, self._skip_share) * self._drafted_at_r(r, t))
            seconds = seconds - np.where(np.asarray(drafted, dtype=bool), 0.0, skip)
        return seconds

    def __call__(self, batch_tokens: int, num_requests: int = 1, drafted: bool = True) -> float:
        """SPS at `batch_tokens` total verify tokens for a batch of `num_requests` requests;
        `drafted=False` prices a step that skipped the drafter (see `draft_skip`)."""
        if isinstance(self.table, SpsCostTable):
            return float(self._window(self._dense_sps, int(batch_tokens), 1)[0])
        t = self.table  # SGLang's `SpsAdditiveCostTable.step_time`
        alpha = interp_clamped(t.bs_probes, t.alpha_seconds, float(num_requests))
        seconds = t.bias_seconds + alpha + interp_clamped(t.m_probes, t.theta_seconds, float(batch_tokens))
        return 1.0 / (seconds - (0.0 if drafted else self.draft_skip(num_requests)))
