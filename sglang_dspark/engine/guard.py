"""The last line of "never slower than no speculation": a decision-level guard.

The planner drafts when its table and its confidences say drafting pays. Both can be wrong: a weak
drafter, confidences that are not calibrated for this traffic, a host the table does not describe.
The guard watches what drafting actually delivered. For every step the planner chose to draft it
takes the step's gain g: the tokens it emitted over what undrafted steps at the same batch size
would have emitted in the same seconds (seconds * R / u(R), u the table's price of a budget-0 step:
with online learning, fitted to the engine's own measured undrafted steps).

One step's gain is noisy: at C = 1 a step emits 1 token or several, and a step's time varies widely
on a shared host. So a bucket (batch sizes 1, 2-3, 4-7, ...) stops drafting only on
evidence: once it has `min_steps` judged steps, when the upper confidence bound of its mean gain,
mean + z * standard error, falls below `1 - margin`. A drafter that truly loses is stopped (the
standard error shrinks with every step), one that wins by 10 % is rarely stopped by a bad start
(tests/test_guard.py, benchmarks/guard_verdicts.py measure both over many seeds). A stopped bucket drafts again after
`cooldown` steps, with fresh statistics. The statistics forget with `decay` per judged step, so
they follow a host or traffic that changes. Probes (exploration) are not counted: their budgets are
chosen to measure, not to win.

It reads only finished steps, so whatever it decides, the output stays the target's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def bucket(num_requests: int) -> int:
    """Batch sizes 1, 2-3, 4-7, 8-15, ... share a bucket."""
    return max(1, num_requests).bit_length()


@dataclass
class _Bucket:
    # decayed sums over judged steps: weights, squared weights, gains, squared gains
    w: float = 0.0
    w2: float = 0.0
    g: float = 0.0
    g2: float = 0.0
    steps: int = 0  # judged since the last block
    blocked_until: int = -1

    def mean(self) -> float:
        return self.g / self.w

    def standard_error(self, prior_variance: float, prior_steps: float) -> float:
        """Of the weighted mean, with the effective sample size n = w^2 / w2 of decayed weights. The
        variance is shrunk toward `prior_variance` as if it had been seen over `prior_steps` steps:
        a few steps' sample variance is far too small whenever they happen to agree (eight steps at
        C = 1 that each emit one token), and a test on it would stop a winning drafter."""
        n = self.w * self.w / self.w2
        sample = max(0.0, self.g2 / self.w - self.mean() ** 2)
        variance = (prior_steps * prior_variance + n * sample) / (prior_steps + n)
        return math.sqrt(variance / n)


class DraftingGuard:
    def __init__(self, *, margin: float = 0.02, min_steps: int = 4, z: float = 2.0, prior_sd: float = 0.6,
                 prior_steps: float = 8.0, cooldown: int = 256, decay: float = 0.99):
        self.margin, self.min_steps, self.z, self.cooldown, self.decay = margin, min_steps, z, cooldown, decay
        self.prior_variance, self.prior_steps = prior_sd ** 2, prior_steps
        self._buckets: dict[int, _Bucket] = {}
        self.step = 0
        self.blocks = 0  # how many times a bucket was stopped, ever

    def allows(self, num_requests: int) -> bool:
        b = self._buckets.get(bucket(num_requests))
        return b is None or self.step >= b.blocked_until

    def observe(self, num_requests: int, tokens: int, seconds: float, undrafted_seconds: float | None,
                planned_draft: bool) -> None:
        """Every decode step; `planned_draft`: the planner chose to draft it (not a probe)."""
        self.step += 1
        if not planned_draft or not undrafted_seconds or seconds <= 0:
            return
        b = self._buckets.setdefault(bucket(num_requests), _Bucket())
        if self.step < b.blocked_until:
            return
        gain = tokens / (seconds * num_requests / undrafted_seconds)
        d = self.decay
        b.w, b.w2 = d * b.w + 1.0, d * d * b.w2 + 1.0
        b.g, b.g2 = d * b.g + gain, d * b.g2 + gain * gain
        b.steps += 1
        upper = b.mean() + self.z * b.standard_error(self.prior_variance, self.prior_steps)
        if b.steps >= self.min_steps and upper < 1.0 - self.margin:
            self._buckets[bucket(num_requests)] = _Bucket(blocked_until=self.step + self.cooldown)
            self.blocks += 1

    def blocked_buckets(self) -> list[int]:
        """Buckets (by their smallest batch size) that may not draft now."""
        return sorted(1 << (k - 1) for k, b in self._buckets.items() if self.step < b.blocked_until)

    def realised_gain(self, num_requests: int) -> float | None:
        """Mean gain of drafted steps at this bucket (None before data or since a block)."""
        b = self._buckets.get(bucket(num_requests))
        return b.mean() if b is not None and b.w > 0 else None

    def gains(self) -> dict[int, float]:
        """Smallest batch size of each judged bucket -> its realised gain (for /server_info)."""
        return {1 << (k - 1): round(gain, 4) for k in sorted(self._buckets)
                if (gain := self.realised_gain(1 << (k - 1))) is not None}
