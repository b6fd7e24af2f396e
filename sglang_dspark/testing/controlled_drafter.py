"""A drafter whose acceptance is set, not learned: the scheduler measured apart from the drafter.

`ControlledDrafter` proposes the target's own greedy continuation of each request (precomputed, as
SGLang's `SGLANG_SIMULATE_ACC_LEN` stands in for a drafter), and replaces each block position's token,
independently, with another token with probability 1 - `acceptance`: a greedy request's draft k then
survives with probability `acceptance` once drafts 1..k-1 did, so its first j drafts all do with
`acceptance` ** j. Every position's confidence says `acceptance + calibration_error` (after the
engine's STS temperatures, so the planner reads that number), the same for every position: calibrated
when the error is 0, and no more informative than the set rate.

It costs what the drafter it wraps costs (the wrapped drafter drafts first, its tokens discarded), or
`cost_multiple` of that: 0 skips the wrapped draft (a free drafter); another multiple sleeps the
difference, measured on the wrapped drafter's last call (a sleep, not a spin: the CPU is free, as when a
drafter runs on another device). Verification is unchanged and exact: sampled rows get their block's
one-hot distribution, so the output is the target's distribution whatever is proposed (a sampled
row's acceptance is then the target's probability of the token, not the set rate).

The engine gives a drafter slots, not requests, so `bind(engine)` lets it read which request holds a
slot; a request whose tokens are not its reference's prefix (it never should be, greedy and exact) keeps
the wrapped drafter's block.
"""

from __future__ import annotations

import math
import time

import torch

from sglang_dspark.drafter.model import DraftOutput
from sglang_dspark.drafter.sampling import is_argmax


class ControlledDrafter:
    def __init__(self, drafter, references: dict[tuple[int, ...], list[int]], acceptance: float, *,
                 calibration_error: float = 0.0, cost_multiple: float = 1.0, seed: int = 0):
        """`references`: prompt token ids -> the target's greedy continuation (at least as long as the
        longest reply plus the block size, for full-length drafts to the end)."""
        if not 0.0 <= acceptance <= 1.0:
            raise ValueError(f"acceptance must be in [0, 1], got {acceptance}")
        if cost_multiple < 0:
            raise ValueError(f"cost_multiple must be >= 0, got {cost_multiple}")
        self.inner, self.references, self.acceptance = drafter, references, acceptance
        self.calibration_error, self.cost_multiple = calibration_error, cost_multiple
        self.generator = torch.Generator().manual_seed(seed)
        self._engine = None
        self._last_inner_s: float | None = None
        self.blocks = self.placed = 0  # rows drafted, and rows given their reference's block

    def __getattr__(self, name):  # the cache, the engine and the checkpoint see the wrapped drafter
        return getattr(self.inner, name)

    def bind(self, engine) -> "ControlledDrafter":
        """Read slot -> request from `engine` (its scheduler's running requests) at every draft."""
        self._engine = engine
        return self

    def _inner_draft(self, cache, slots, anchors, anchor_pos, sampler, generator, block) -> DraftOutput | None:
        """The wrapped drafter's block where this drafter costs at least as much (its cost measured),
        else None after keeping the context current and sleeping `cost_multiple` of the last
        measured draft."""
        if self.cost_multiple == 0 or self._last_inner_s is not None and self.cost_multiple < 1:
            cache.flush(slots)  # the context stays current, as a real draft keeps it
            if self.cost_multiple > 0:
                time.sleep(self.cost_multiple * self._last_inner_s)
            return None
        t0 = time.perf_counter()
        out = self.inner.draft(cache, slots, anchors, anchor_pos, sampler=sampler, generator=generator, block=block)
        self._last_inner_s = time.perf_counter() - t0
        if self.cost_multiple > 1:
            time.sleep((self.cost_multiple - 1) * self._last_inner_s)
        return out

    def draft(self, cache, slots, anchors, anchor_pos, sampler=None, generator=None, block=None) -> DraftOutput:
        out = self._inner_draft(cache, slots, anchors, anchor_pos, sampler, generator, block)
        gamma, vocab = self.inner.gamma if block is None else block, self.inner.lm_head_weight.shape[0]
        r = len(slots)
        tokens = out.tokens.clone() if out is not None else torch.zeros(r, gamma, dtype=torch.long)
        by_slot = {req.slot: req for req in self._engine.scheduler.running} if self._engine is not None else {}
        for row, (slot, p) in enumerate(zip(slots, anchor_pos.tolist())):
            self.blocks += 1
            req = by_slot.get(slot)
            ref = None if req is None else self.references.get(tuple(req.prompt_ids))
            if ref is None:
                continue
            seq = list(req.prompt_ids) + ref
            if p + 1 + gamma > len(seq) or req.tokens[: p + 1] != seq[: p + 1]:
                continue
            tokens[row] = torch.tensor(seq[p + 1: p + 1 + gamma])
            self.placed += 1
        wrong = torch.rand(r, gamma, generator=self.generator) >= self.acceptance
        tokens[wrong] = (tokens[wrong] + 1) % vocab  # another token: the target's greedy choice is the reference
        # the wrapped drafter's own default (no sampler) samples at temperature 1, reporting probs
        sampled = out.probs is not None if out is not None else sampler is None or not is_argmax(sampler)
        probs = torch.nn.functional.one_hot(tokens, vocab).float() if sampled else None
        conf = min(max(self.acceptance + self.calibration_error, 1e-4), 1 - 1e-4)
        logits = torch.full((r, gamma), math.log(conf / (1 - conf)))
        sts = getattr(self._engine, "sts", None)
        if sts is not None:  # the engine divides by its STS temperatures: the planner reads `conf`
            logits = logits * sts.to(torch.float32)[:gamma]
        return DraftOutput(tokens=tokens, probs=probs, conf_logits=logits)
