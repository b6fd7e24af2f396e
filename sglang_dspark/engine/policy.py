"""How much to speculate: the capacity decision of each decode step and the state it learns from.

`SpeculationPolicy` owns everything that decides a step's verify budget and feeds on the steps
that ran: the AsyncPlanner over the SPS table, the drafter-skip rule with its probes, the
profiler's forced budget, and SLA mode's measured overhead and time scale. The engine asks it
`plan()` before a decode step, `allocate()` once the drafts exist, and tells it `observe()` and
`on_step()` afterwards; nothing else writes its state.

Every decision reads only what earlier steps produced (lagged confidences, measured times), never
this step's samples, so whatever it decides the output stays the target's distribution
(docs/ALGORITHM.md, scheduling).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from sglang_dspark.core.schedule import AsyncPlanner
from sglang_dspark.core.sps import SpsTable

MODES = ("target", "full", "scheduled")


@dataclass(frozen=True)
class DraftPlan:
    capacity: int  # draft tokens to verify this step, over all requests
    draft: bool  # run the drafter (False: every request verifies its anchor only)
    verify_all: bool  # full mode: every draft is verified whatever the capacity


NO_DRAFT = DraftPlan(capacity=0, draft=False, verify_all=False)


class SpeculationPolicy:
    """`mode`: "target" never drafts, "full" verifies every draft, "scheduled" plans per step.

    In scheduled mode a step whose budget is 0 skips the drafter (the budget came from lagged
    confidences, so skipping cannot bias the output); every `probe_every`-th such step drafts
    anyway to keep the confidences fresh, doubling the interval after each probe that changes
    nothing, up to `probe_max`. The very first step drafts with capacity 0 only to measure, so
    later capacities rest on observed confidences (not with a flat table, which verifies
    everything whatever the confidences).
    """

    def __init__(self, mode: str, gamma: int, sps: SpsTable, *, lag: int = 2, buckets: Sequence[int] = (),
                 sla_tok_s_per_user: float | None = None, probe_every: int = 16, probe_max: int = 128):
        if mode not in MODES:
            raise ValueError(f"mode: must be one of {MODES}, got {mode!r}")
        self.mode, self.gamma, self.sps = mode, gamma, sps
        self.sla_tok_s_per_user = sla_tok_s_per_user
        self.probe_every, self.probe_max = probe_every, probe_max
        self.planner = AsyncPlanner(sps, gamma, lag=lag, buckets=buckets or None,
                                    sla_tok_s_per_user=sla_tok_s_per_user, prior="observed") if gamma else None
        self.forced_budget_frac: float | None = None  # the profiler's knob (SGLang's dspark_force_budget_frac)
        self._undrafted_steps = 0
        self._probe_interval = probe_every
        self._last_decode_end: float | None = None  # SLA mode: the gap between decode steps
        self._step_ratios: deque[float] = deque(maxlen=64)  # SLA mode: measured / predicted step time

    @property
    def speculates(self) -> bool:
        return self.planner is not None and self.mode != "target"

    @property
    def sla_mode(self) -> bool:
        return self.speculates and self.sla_tok_s_per_user is not None

    # ---- before a step -----------------------------------------------------------------------
    def plan(self, request_ids: Sequence[str]) -> DraftPlan:
        """The capacity of a decode step over `request_ids`, from history only."""
        if not self.speculates:
            return NO_DRAFT
        num = len(request_ids)
        if self.mode == "full":
            return DraftPlan(capacity=num * self.gamma, draft=True, verify_all=True)
        if self.forced_budget_frac is not None:
            capacity = int(self.forced_budget_frac * num * self.gamma)
            return DraftPlan(capacity=capacity, draft=capacity > 0, verify_all=False)
        if self._measuring_first:
            return DraftPlan(capacity=0, draft=True, verify_all=False)
        capacity = self.planner.capacity(request_ids)
        return DraftPlan(capacity=capacity, draft=self._should_draft(self.planner.last_decision.budget),
                         verify_all=False)

    @property
    def _measuring_first(self) -> bool:
        return not self.sps.is_flat and self.planner.rows_observed == 0

    def _should_draft(self, budget: int) -> bool:
        worthless = budget == 0
        if worthless and self._undrafted_steps < self._probe_interval:
            self._undrafted_steps += 1
            return False
        # a probe that follows a zero budget doubles the next interval; any other draft resets it
        self._probe_interval = min(2 * self._probe_interval, self.probe_max) if worthless else self.probe_every
        self._undrafted_steps = 0
        return True

    def can_admit(self, running_ids: Sequence[str], slowest_speed: float | None) -> bool:
        """SLA admission (always yes outside SLA mode); see AsyncPlanner.can_admit."""
        if not self.sla_mode or not running_ids:
            return True
        return self.planner.can_admit(running_ids, slowest_speed)

    # ---- during a step -----------------------------------------------------------------------
    def allocate(self, conf: torch.Tensor, plan: DraftPlan) -> torch.Tensor:
        """Verify lengths [R] for this step's calibrated confidences conf [R, G]."""
        if plan.verify_all:
            return torch.full((conf.shape[0],), self.gamma, dtype=torch.int64)
        return self.planner.allocate(conf, plan.capacity)

    def observe(self, request_ids: Sequence[str], conf: torch.Tensor) -> None:
        self.planner.observe(request_ids, conf)

    # ---- after a step ------------------------------------------------------------------------
    def on_step(self, num_requests: int, num_tokens: int, drafted: bool, start: float, end: float) -> float | None:
        """Feed back a finished decode step; returns the seconds the table predicted for it (None
        with a flat table, which predicts nothing)."""
        gap = None if self._last_decode_end is None else start - self._last_decode_end
        self._last_decode_end = end
        if self.sps.is_flat:
            return None
        predicted = 1.0 / self.sps(num_tokens, num_requests=num_requests, drafted=drafted)
        if self.sla_mode:
            if gap is not None:  # the EWMA of time between decode steps: prefills, streaming
                self.planner.overhead_seconds += 0.1 * (gap - self.planner.overhead_seconds)
            # a tier is a promise: price steps at the 90th percentile of measured / predicted
            self._step_ratios.append((end - start) / predicted)
            self.planner.time_scale = float(np.quantile(np.fromiter(self._step_ratios, float), 0.9))
        return predicted

    def on_idle(self) -> None:
        """Nothing runs: the time until the next request is nobody's wait."""
        self._last_decode_end = None

    def release(self, request_id: str) -> None:
        if self.planner is not None:
            self.planner.release(request_id)

    def describe(self) -> dict:
        """The policy's state for /server_info."""
        return {"mode": self.mode, "sps_table": "flat" if self.sps.is_flat else "profiled",
                "forced_budget_frac": self.forced_budget_frac}
