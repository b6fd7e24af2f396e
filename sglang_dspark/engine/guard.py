"""The last line of "never slower than no speculation": a decision-level guard.

The planner drafts when its table and its confidences say drafting pays. Both can be wrong: a weak
drafter, confidences that are not calibrated for this traffic, a host the table does not describe.
The guard watches what drafting actually delivered: for every step the planner chose to draft, the
tokens it emitted per second against what an undrafted step at the same batch size emits per
second (R / u(R), u the table's price of a budget-0 step: with online learning, fitted to the
engine's own measured undrafted steps). When drafted steps of a batch-size bucket have delivered
less than `1 - margin` of that over at least `min_steps` steps, the bucket stops drafting for
`cooldown` steps, then tries again with fresh statistics. Until a bucket has been judged
(probation), the policy caps a step's drafts at R in all, so learning costs little. Probes
(exploration) are not counted: their budgets are chosen to measure, not to win.

It reads only finished steps, so whatever it decides, the output stays the target's.
"""

from __future__ import annotations

from dataclasses import dataclass


def bucket(num_requests: int) -> int:
    """Batch sizes 1, 2-3, 4-7, 8-15, ... share a bucket."""
    return max(1, num_requests).bit_length()


@dataclass
class _Bucket:
    tokens: float = 0.0  # emitted by drafted steps (decayed)
    baseline: float = 0.0  # what undrafted steps would have emitted in the same seconds (decayed)
    steps: int = 0
    blocked_until: int = -1


class DraftingGuard:
    def __init__(self, *, margin: float = 0.02, min_steps: int = 4, cooldown: int = 256, decay: float = 0.95):
        self.margin, self.min_steps, self.cooldown, self.decay = margin, min_steps, cooldown, decay
        self._buckets: dict[int, _Bucket] = {}
        self.step = 0
        self.blocks = 0  # how many times a bucket was stopped, ever

    def allows(self, num_requests: int) -> bool:
        b = self._buckets.get(bucket(num_requests))
        return b is None or self.step >= b.blocked_until

    def on_probation(self, num_requests: int) -> bool:
        """Fewer than `min_steps` planned drafted steps judged at this bucket yet (first, or since the
        last block): the planner should bet small until drafting has shown it pays here."""
        b = self._buckets.get(bucket(num_requests))
        return b is None or b.steps < self.min_steps

    def observe(self, num_requests: int, tokens: int, seconds: float, undrafted_seconds: float | None,
                planned_draft: bool) -> None:
        """Every decode step; `planned_draft`: the planner chose to draft it (not a probe)."""
        self.step += 1
        if not planned_draft or not undrafted_seconds or seconds <= 0:
            return
        b = self._buckets.setdefault(bucket(num_requests), _Bucket())
        if self.step < b.blocked_until:
            return
        b.tokens = self.decay * b.tokens + tokens
        b.baseline = self.decay * b.baseline + seconds * num_requests / undrafted_seconds
        b.steps += 1
        if b.steps >= self.min_steps and b.tokens < (1.0 - self.margin) * b.baseline:
            b.blocked_until = self.step + self.cooldown
            b.tokens = b.baseline = 0.0
            b.steps = 0
            self.blocks += 1

    def blocked_buckets(self) -> list[int]:
        """Buckets (by their smallest batch size) that may not draft now."""
        return sorted(1 << (k - 1) for k, b in self._buckets.items() if self.step < b.blocked_until)

    def realised_gain(self, num_requests: int) -> float | None:
        """Drafted tokens per second over the undrafted rate, at this bucket (None before data)."""
        b = self._buckets.get(bucket(num_requests))
        return b.tokens / b.baseline if b is not None and b.baseline > 0 else None

    def gains(self) -> dict[int, float]:
        """Smallest batch size of each judged bucket -> its realised gain (for /server_info)."""
        return {1 << (k - 1): round(gain, 4) for k in sorted(self._buckets)
                if (gain := self.realised_gain(1 << (k - 1))) is not None}
