"""How much to speculate: the capacity decision of each decode step and the state it learns from.

`SpeculationPolicy` owns everything that decides a step's verify budget and feeds on the steps that
ran: the SPS table (a profile's, corrected or learned online, core/sps_online.py), the AsyncPlanner
over it, probes, the drafting guard (engine/guard.py), the profiler's forced budget, and SLA mode's
measured overhead and time scale. The engine asks `plan()` before a decode step and `allocate()` once
the drafts exist, and reports `observe()` and `on_step()` afterwards; nothing else writes its state.

Every decision reads only what earlier steps produced (lagged confidences, measured times), never
this step's samples, so whatever it decides the output stays the target's distribution
(docs/ALGORITHM.md, scheduling).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from sglang_dspark.core.schedule import AsyncPlanner
from sglang_dspark.core.sps import SpsTable
from sglang_dspark.core.sps_online import OnlineSpsEstimator, untested_table
from sglang_dspark.engine.guard import DraftingGuard, bucket

MODES = ("target", "full", "scheduled")
# where the table the planner reads comes from (/server_info, /metrics)
SOURCES = ("flat", "profile", "profile+online", "seeded+online", "online")
EXPLORE_SLACK = 0.9  # explore unless the best case is >10 % short of paying: noise must not prune

SCALE_MIN_STEPS = 8  # SLA mode rescales the table by measured / predicted step times from this many on
MARGIN_MIN_STEPS = 4  # drafted steps measured before their pricing error sets the planner's time margin
LEARNER_FIT_SHARE = 0.002  # the learner's refits take at most 0.2 % of the engine thread's step time

@dataclass(frozen=True)
class DraftPlan:
    capacity: int  # draft tokens to verify this step, over all requests
    draft: bool  # run the drafter (False: every request verifies its anchor only)
    verify_all: bool = False  # full mode: every draft is verified whatever the capacity
    probe: bool = False  # drafted to measure (confidences, an unexplored budget), not because it pays


NO_DRAFT = DraftPlan(capacity=0, draft=False)


class SpeculationPolicy:
    """`mode`: "target" never drafts, "full" verifies every draft, "scheduled" plans per step.

    Tables: `sps` is the profile's table or None. With `learn` the table is learned from this
    engine's own steps, seeded by `sps` when given ("profile+online" for a profile of this very
    deployment, "seeded+online" for one measured elsewhere, whose times are scaled to the measured
    steps); without `learn` it is `sps` as is, or a flat table (verify everything, SGLang's default).

    Probes: when the planner budgets nothing, every `probe_every`-th such step drafts anyway, to keep
    the confidences fresh and to measure a budget the table has not seen at this batch size (the
    smallest unexplored of 1, 2, 4, ... R * gamma, unless no budget could pay: `_cannot_pay`; else
    one draft, an outcome for the lag calibration); the interval doubles after each probe up to
    `probe_max`, and drops back to `probe_every` while the current batch-size bucket (1, 2-3, 4-7,
    ...: the table interpolates within one) has fewer than `explore_until` drafted steps on record.

    `calibrate_lag` corrects the lagged confidences the planner reads by how they have held up
    (core/lag_calibration.py). `time_margin` (default: while learning, since with learning off the
    table is taken as it is) prices drafted steps in the throughput planner by how much dearer than
    the table they have run (`_time_margin`).
    """

    def __init__(self, mode: str, gamma: int, sps: SpsTable | None, *, learn: bool = False, seeded: bool = False,
                 max_batch_tokens: int = 64, lag: int = 2, buckets: Sequence[int] = (),
                 sla_tok_s_per_user: float | None = None, probe_every: int = 32, probe_max: int = 256,
                 explore_until: int = 3, warmup_steps: int = 8, clock: Callable[[], float] | None = None, guard: DraftingGuard | None = None,
                 calibrate_lag: bool = True, time_margin: bool | None = None):
        if mode not in MODES:
            raise ValueError(f"mode: must be one of {MODES}, got {mode!r}")
        self.mode, self.gamma = mode, gamma
        self.sla_tok_s_per_user = sla_tok_s_per_user
        self.probe_every, self.probe_max, self.explore_until = probe_every, probe_max, explore_until
        self.warmup_steps = warmup_steps
        self.clock = clock or (lambda: 0.0)
        self._price_memo: tuple = (None, {})  # (table, {(tokens, requests, drafted): seconds})
        # refits on the engine's thread take at most LEARNER_FIT_SHARE of its step time (timed on its clock)
        self.learner = (OnlineSpsEstimator(prior=sps, fit_share=LEARNER_FIT_SHARE, clock=self.clock)
                        if learn and gamma and mode == "scheduled" else None)
        if self.learner is not None:
            self.source = "online" if sps is None else ("seeded+online" if seeded else "profile+online")
            self.sps = self.learner.table() or untested_table()
        else:
            self.source = "flat" if sps is None else "profile"
            self.sps = sps or SpsTable.flat(max_batch_tokens)
        self.planner = AsyncPlanner(self.sps, gamma, lag=lag, buckets=buckets or None,
                                    sla_tok_s_per_user=sla_tok_s_per_user, prior="observed",
                                    calibrate_lag=calibrate_lag) if gamma else None
        self.guard = guard or DraftingGuard()
        self.time_margin = learn if time_margin is None else time_margin
        self.forced_budget_frac: float | None = None  # the profiler's knob (SGLang's dspark_force_budget_frac)
        self.table_since = self.clock()  # when the table in use was (re)fitted
        self.probes = self.steps = 0
        self._undrafted_steps = 0
        self._probe_interval = probe_every
        self._explore_key: tuple[int, int] | None = None  # (batch size, drafted steps) _explore_pays is for
        self._explore_pays = False
        self._last_decode_end: float | None = None  # SLA mode: the gap between decode steps
        self._step_ratios: deque[float] = deque(maxlen=64)  # measured / predicted step time
        # the last plain and drafted steps apart, (tokens, requests, seconds): how much dearer drafted
        # steps run than the table in use says (`_time_margin`)
        self._plain_steps: deque[tuple[int, int, float]] = deque(maxlen=64)
        self._drafted_steps: deque[tuple[int, int, float]] = deque(maxlen=64)
        self._errors: deque[float] = deque(maxlen=100)  # |predicted - measured| / measured

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
            return DraftPlan(capacity=capacity, draft=capacity > 0)
        trusted = not self.sps.is_flat and (self.learner is None or self.learner.prior is not None)
        if trusted and self.planner.rows_observed == 0:
            # A table that may say drafting pays, and no confidence seen yet: the planner would count
            # every draft as sure to survive (SGLang's prior). Measure them first, with one probe (a
            # learner also gets a drafted step time). A learner first times `warmup_steps` plain
            # steps, so that one probe prices drafting against this host's plain step, not the
            # prior's. Learning from nothing, the table itself says no until drafting was measured.
            if self.learner is not None and self.learner.steps < self.warmup_steps:
                return NO_DRAFT
            self.probes += 1
            return DraftPlan(capacity=self._probe_budget(request_ids), draft=True, probe=True)
        capacity = self.planner.capacity(request_ids)
        if self.planner.last_decision.budget > 0 and self.guard.allows(num):
            self._undrafted_steps, self._probe_interval = 0, self.probe_every
            return DraftPlan(capacity=capacity, draft=True)
        return self._probe_or_skip(request_ids)

    def _probe_or_skip(self, request_ids: Sequence[str]) -> DraftPlan:
        # a bucket is explored quickly only while a probe there could still measure a budget that
        # pays; once its prices say none can, probes refresh confidences and verify one draft, at the
        # doubling interval
        if self._probe_interval > self.probe_every and self._exploring(request_ids):
            self._probe_interval = self.probe_every
        if self._undrafted_steps < self._probe_interval:
            self._undrafted_steps += 1
            return NO_DRAFT
        self._undrafted_steps = 0
        self._probe_interval = min(2 * self._probe_interval, self.probe_max)
        self.probes += 1
        return DraftPlan(capacity=self._probe_budget(request_ids), draft=True, probe=True)

    def _exploring(self, request_ids: Sequence[str]) -> bool:
        """The batch size's bucket has fewer than `explore_until` drafted steps and a probe there
        could measure a budget that pays. Decided once per batch size and drafted-step count: the
        answer's scan of up to 2048 samples (`_ladder_budget`) would otherwise run on every plain step."""
        num = len(request_ids)
        drafted = self.learner.drafted_in_bucket(bucket(num)) if self.learner is not None else self.explore_until
        if drafted >= self.explore_until:
            return False
        if self._explore_key != (num, drafted):
            self._explore_key, self._explore_pays = (num, drafted), self._ladder_budget(request_ids) > 0
        return self._explore_pays

    def _probe_budget(self, request_ids: Sequence[str]) -> int:
        """The unexplored budget to measure (`_ladder_budget`), else 1: the probe verifies the one
        draft the planner ranks first. Where the planner has stopped drafting, that draft is the only
        outcome the lag calibration still learns from: a probe that verified nothing taught it nothing,
        so a few unlucky first outcomes stopped drafting for good (benchmarks/planned_drafts.py). One
        verify row on a step every `probe_every`..`probe_max` steps is the price."""
        return self._ladder_budget(request_ids) or 1

    def _ladder_budget(self, request_ids: Sequence[str]) -> int:
        """The smallest budget of 1, 2, 4, ... R * gamma with no drafted step on record at this
        batch size (learning), else 0; also 0 when no budget could pay (`_cannot_pay`)."""
        if self.learner is None:
            return 0
        num = len(request_ids)
        seen = {s.batch_tokens - num for s in self.learner.samples if s.drafted and s.num_requests == num}
        budget = 1
        while budget <= num * self.gamma:
            if budget not in seen:
                return 0 if self._cannot_pay(request_ids, budget) else budget
            budget *= 2
        return 0

    def _cannot_pay(self, request_ids: Sequence[str], budget: int) -> bool:
        """Exploring `budget` and beyond is not worth its price: even verifying every draft, at the
        cost of the cheapest drafted step already measured here (a lower bound: cost grows with the
        budget), the lagged confidences promise fewer tokens per second than a plain step delivers,
        by a margin of `EXPLORE_SLACK`. On a host where one verified draft doubles the step, a weak
        drafter then pays for one measuring probe, not for a ladder of ever larger ones."""
        num = len(request_ids)
        # Prices from the batch sizes of `num`'s bucket (R wanders under load; a batch size seen
        # for the first time is no new question), each drafted step against a plain one of its own R.
        here = [s for s in self.learner.samples if bucket(s.num_requests) == bucket(num)]
        plain: dict[int, list[float]] = {}
        for s in here:
            if not s.drafted:
                plain.setdefault(s.num_requests, []).append(s.seconds)
        ratios = [s.seconds / statistics.median(plain[s.num_requests]) for s in here
                  if s.drafted and s.num_requests in plain and 0 < s.batch_tokens - s.num_requests <= budget]
        if not ratios or self.planner.rows_observed == 0:
            return False
        cost_ratio = min(ratios)
        yield_ratio = self.planner.expected_tokens(request_ids, num * self.gamma) / num
        return yield_ratio < EXPLORE_SLACK * cost_ratio

    def can_admit(self, running_ids: Sequence[str], slowest_speed: float | None) -> bool:
        """SLA admission (always yes outside SLA mode); see AsyncPlanner.can_admit."""
        if not self.sla_mode or not running_ids:
            return True
        return self.planner.can_admit(running_ids, slowest_speed)

    # ---- during a step -----------------------------------------------------------------------
    def draft_block(self, plan: DraftPlan) -> int:
        """Positions the drafter drafts a request this step: no more than the step can verify. A
        step of capacity c verifies at most c drafts a request, so the block is cut to c (on a CPU
        the drafter's cost grows with its rows; a cut block keeps the first positions' acceptance:
        benchmarks/block_truncation.py). Probes cut too, so that the price they measure for a budget
        is the price a planned step of that budget pays; full mode drafts the whole block."""
        if plan.verify_all:
            return self.gamma
        return max(1, min(self.gamma, plan.capacity))

    def allocate(self, conf: torch.Tensor, plan: DraftPlan) -> torch.Tensor:
        """Verify lengths [R] for this step's calibrated confidences conf [R, G]."""
        if plan.verify_all:
            return torch.full((conf.shape[0],), self.gamma, dtype=torch.int64)
        return self.planner.allocate(conf, plan.capacity)

    def observe(self, request_ids: Sequence[str], conf: torch.Tensor, verify_lens, num_accepted) -> None:
        """A drafted step's outcome: its verified drafts against what the lagged rows promised (the
        lag calibration), then its confidences, for the capacity `lag` steps later."""
        self.planner.verified(request_ids, verify_lens, num_accepted)
        self.planner.observe(request_ids, conf)

    # ---- after a step ------------------------------------------------------------------------
    def on_step(self, plan: DraftPlan, num_requests: int, num_tokens: int, emitted: int, drafted: bool,
                start: float, end: float) -> float | None:
        """Feed back a finished decode step; returns the seconds the table predicted for it (None
        for a flat table, which predicts nothing)."""
        seconds = end - start
        gap = None if self._last_decode_end is None else start - self._last_decode_end
        self._last_decode_end = end
        self.steps += 1
        predicted = None if self.sps.is_flat else self._predicted_seconds(num_tokens, num_requests, drafted)
        if predicted is not None:
            self._errors.append(abs(predicted - seconds) / seconds)
            self._step_ratios.append(seconds / predicted)
            if self.time_margin and self.planner is not None:
                (self._drafted_steps if drafted else self._plain_steps).append((num_tokens, num_requests, seconds))
        if self.speculates:
            undrafted = None if self.sps.is_flat else self._predicted_seconds(num_requests, num_requests, False)
            self.guard.observe(num_requests, emitted, seconds, undrafted, planned_draft=drafted and not plan.probe
                               and self.forced_budget_frac is None and self.mode == "scheduled")
        if self.learner is not None and self.forced_budget_frac is None:
            self.learner.observe(num_requests, num_tokens, drafted, seconds)
            table = self.learner.table()
            if table is not self.sps and table is not None:
                self.sps = self.planner.sps = table
                self.table_since = end
        if self._drafted_steps and (drafted or self.table_since == end):  # a drafted step, or a new table
            self.planner.time_margin = self._time_margin()
        if self.sla_mode and predicted is not None:
            if gap is not None:  # the EWMA of time between decode steps: prefills, streaming
                self.planner.overhead_seconds += 0.1 * (gap - self.planner.overhead_seconds)
            # a tier is a promise: price steps at the 90th percentile of measured / predicted, once
            # there are enough steps for a percentile (one odd step, a probe, must not rescale the table)
            if len(self._step_ratios) >= SCALE_MIN_STEPS:
                self.planner.time_scale = float(np.quantile(np.fromiter(self._step_ratios, float), 0.9))
        return predicted

    def _time_margin(self) -> float:
        """How much dearer than the table in use says drafted steps have run, relative to plain steps
        (the medians of measured / priced over the last 64 of each, priced by the current table, so
        that what learning has absorbed leaves the margin; a host that slows every step alike changes
        nothing; before any plain step the table's plain price is taken as right): the throughput
        planner prices drafted steps that much higher. 0 until `MARGIN_MIN_STEPS` drafted steps are
        measured, and where the table over-prices them."""
        if len(self._drafted_steps) < MARGIN_MIN_STEPS or self.sps.is_flat:
            return 0.0

        def ratio(steps, drafted: bool) -> float:
            return statistics.median(s / self._predicted_seconds(t, r, drafted) for t, r, s in steps)

        plain = ratio(self._plain_steps, False) if self._plain_steps else 1.0
        return max(0.0, ratio(self._drafted_steps, True) / plain - 1.0)

    def _predicted_seconds(self, num_tokens: int, num_requests: int, drafted: bool) -> float:
        """The table's price of a step (the guard's plain step too: B = R, not drafted), memoised per
        table: a busy server repeats the same few (tokens, requests, drafted) steps, and pricing each
        anew was a visible share of a plain step."""
        if self._price_memo[0] is not self.sps:
            self._price_memo = (self.sps, {})
        prices, key = self._price_memo[1], (num_tokens, num_requests, drafted)
        if key not in prices:
            if len(prices) > 4096:
                prices.clear()
            prices[key] = 1.0 / self.sps(num_tokens, num_requests=num_requests, drafted=drafted)
        return prices[key]

    def on_idle(self) -> None:
        """Nothing runs: the time until the next request is nobody's wait."""
        self._last_decode_end = None

    def release(self, request_id: str) -> None:
        if self.planner is not None:
            self.planner.release(request_id)

    # ---- introspection -----------------------------------------------------------------------
    @property
    def prediction_error(self) -> float | None:
        """Median |predicted - measured| / measured over the last 100 steps."""
        return statistics.median(self._errors) if self._errors else None

    def describe(self) -> dict:
        """The policy's state for /server_info."""
        learner = self.learner
        return {
            "mode": self.mode, "sps_table": "flat" if self.sps.is_flat else "profiled", "sps_source": self.source,
            "sps_table_age_s": round(self.clock() - self.table_since, 3),
            "sps_prediction_error": None if self.prediction_error is None else round(self.prediction_error, 4),
            "sps_samples": len(learner.samples) if learner else 0, "sps_refits": learner.refits if learner else 0,
            "probe_steps": self.probes, "decode_steps": self.steps,
            "guard_blocked_from_bs": self.guard.blocked_buckets(), "guard_blocks": self.guard.blocks,
            "guard_realised_gain_from_bs": self.guard.gains(),
            "planner_time_margin": None if self.planner is None else round(self.planner.time_margin, 4),
            "forced_budget_frac": self.forced_budget_frac,
            "sps": None if self.sps.is_flat else self.sps.to_dict(),
            "sps_drafted_samples": sum(s.drafted for s in learner.samples) if learner else 0,
            "sps_step_times_ms": [[r, b, [round(t, 3) for t in times]]
                                  for (r, b), times in sorted(learner.step_times().items())] if learner else [],
        }
