"""Simulated noisy steps at C = 1 that the drafting guard is judged on (tests/test_guard.py and
benchmarks/guard_verdicts.py): every time is given, so nothing depends on the host's speed."""

from __future__ import annotations

import random

from sglang_dspark.engine.guard import DraftingGuard

GAMMA = 7
UNDRAFTED_S = 0.040


def first_block(seed: int, cost: float, accept: float, steps: int = 150, guard: DraftingGuard | None = None):
    """The judged step at which the guard first stops batch size 1, or None: each step verifies
    GAMMA drafts, each accepted with probability `accept` until the first rejection, and costs
    `cost` undrafted steps with log-normal noise of sigma 0.1."""
    rng = random.Random(seed)
    guard = guard or DraftingGuard()
    for step in range(steps):
        accepted = 0
        while accepted < GAMMA and rng.random() < accept:
            accepted += 1
        seconds = UNDRAFTED_S * cost * rng.lognormvariate(0.0, 0.1)
        guard.observe(1, 1 + accepted, seconds, UNDRAFTED_S, planned_draft=True)
        if guard.blocks:
            return step
    return None
