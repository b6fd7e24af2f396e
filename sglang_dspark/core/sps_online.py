"""The SPS table learned online from the engine's own steps.

No offline profile is right for every host: a CPU model the profile never saw, a neighbour on the
machine, a longer context all move step times. `OnlineSpsEstimator` refits the same additive form
the profile uses from what each decode step measured (R requests, B verify tokens, drafter run or
skipped, seconds):

- drafted and undrafted steps are fitted together by the profile's own monotone NNLS fit
  (core/sps_fit.py), weighted: `bias + alpha(R) + theta(B)`, less `skip(R)` when the drafter did
  not run; the frequent undrafted steps move the shared terms, so drafted prices follow a host
  that slows down too.

Memory is bounded (the last `capacity` steps), old steps fade with a half-life of `half_life` steps,
every step's time is rescaled by how fast the host ran around it (the running median of measured /
fitted over `HOST_WINDOW` steps) to today's speed, so the table follows a host that slows down, and
a step whose time is more than `outlier_mads` robust deviations from the fit is left out of the
refit (one stall does not move the table).
Before any drafted step has been seen the table prices drafting as prohibitive, so a planner on it
starts target-only; a `prior` table (a profile, possibly from other hardware) fills what the steps
have not covered yet, with the weight of `prior_weight` steps in all: its undrafted prices scaled by
the median measured / prior ratio of undrafted steps, its drafted prices by that of drafted steps
(hosts differ in both: two CPUs with the same BLAS priced a 2-token verify far apart against a
1-token step; RESULTS_LOG, 'Online SPS learning'); steps 1, 2, 4, ... 16, and the first few drafted ones, each trigger a refit.
After that a refit is due every `refit_every` steps, and with `fit_share` no sooner than when the
steps since the last one took `1 / fit_share` times as long as that fit took, or `MAX_REFIT_DELAY`
intervals passed (a fit every 16 steps would take a measurable share of a CPU engine's time).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.ndimage import median_filter
from scipy.optimize import isotonic_regression

from sglang_dspark.core.sps import SpsAdditiveCostTable, SpsTable
from sglang_dspark.core.sps_fit import fit_step_table

PROHIBITIVE_SECONDS = 10.0  # what a drafted step costs in a table that has never seen one
HOST_WINDOW = 33  # steps over which the host's speed (measured / fitted) is taken as constant
EAGER_DRAFTED_REFITS = 8  # up to this many drafted samples held, each one refits the table at once
MAX_REFIT_DELAY = 8  # with a fit_share, a regular refit still comes after this many refit_every intervals


@dataclass(frozen=True)
class StepSample:
    num_requests: int
    batch_tokens: int
    drafted: bool
    seconds: float
    index: int  # the estimator's step counter when it was observed


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    order = np.argsort(values)
    cumulative = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cumulative, 0.5 * cumulative[-1])])


class OnlineSpsEstimator:
    def __init__(self, *, prior: SpsTable | None = None, prior_weight: float = 16.0, capacity: int = 2048,
                 half_life: float = 64.0, refit_every: int = 16, outlier_mads: float = 4.0,
                 fit_share: float | None = None, clock: Callable[[], float] = time.perf_counter):
        self.prior, self.prior_weight = prior, prior_weight
        self.fit_share, self.clock = fit_share, clock
        self._fit_seconds = 0.0  # how long table()'s last fit took (0 where fits run elsewhere)
        self._seconds_since_fit = 0.0  # step time observed since the last refit
        self.half_life, self.refit_every, self.outlier_mads = half_life, refit_every, outlier_mads
        self.samples: deque[StepSample] = deque(maxlen=capacity)
        self.steps = 0  # steps observed, ever
        self.refits = 0
        self.fitted_at = -1  # self.steps at the last refit
        self.prior_scale = 1.0  # measured / prior for undrafted steps, the last refit's
        self.prior_draft_scale = 1.0  # the same for drafted steps (the undrafted one until one is seen)
        self._drafted_at_fit = 0  # drafted samples held at the last refit
        self._table: SpsTable | None = None
        self._drafted_by_r: Counter[int] = Counter()  # drafted samples held, per batch size

    # ---- feeding -----------------------------------------------------------------------------
    def observe(self, num_requests: int, batch_tokens: int, drafted: bool, seconds: float) -> None:
        if seconds > 0 and num_requests >= 1 and batch_tokens >= num_requests:
            if len(self.samples) == self.samples.maxlen and self.samples[0].drafted:
                self._drafted_by_r[self.samples[0].num_requests] -= 1  # about to fall out
            self.samples.append(StepSample(num_requests, batch_tokens, drafted, seconds, self.steps))
            if drafted:
                self._drafted_by_r[num_requests] += 1
            self._seconds_since_fit += seconds
        self.steps += 1

    @property
    def has_drafted(self) -> bool:
        return any(n > 0 for n in self._drafted_by_r.values())

    def drafted_in_bucket(self, bucket: int) -> int:
        """Drafted samples held whose batch size R has bit_length `bucket` (1, 2-3, 4-7, ...)."""
        return sum(n for r, n in self._drafted_by_r.items() if r.bit_length() == bucket)

    # ---- reading -----------------------------------------------------------------------------
    @property
    def refit_due(self) -> bool:
        # Steps 1, 2, 4, ... up to `refit_every` and the first few drafted ones each refit at once:
        # they tell the planner within a step or two what this host's plain and drafted steps cost,
        # before it bets on a prior measured elsewhere. (A fit takes a few ms on the engine's
        # thread: refitting at each of the first 16 steps showed in a short run's speed.)
        drafted = sum(self._drafted_by_r.values())
        early = self.steps <= self.refit_every and self.steps & (self.steps - 1) == 0
        since = self.steps - self.fitted_at
        regular = since >= self.refit_every and (
            self.fit_share is None or self._seconds_since_fit * self.fit_share >= self._fit_seconds
            or since >= MAX_REFIT_DELAY * self.refit_every)  # one stalled fit must not hold the table for long
        return (self._table is None or regular or early or self._drafted_at_fit < drafted <= EAGER_DRAFTED_REFITS)

    def table(self) -> SpsTable | None:
        """The current table (refit after every `refit_every` new steps); None before any step."""
        if self.refit_due:
            start = self.clock()
            table = self.fit(self.snapshot())
            self._fit_seconds = self.clock() - start
            self.adopt(table, self.steps)
        return self._table

    # A caller whose thread must not wait for a fit (SGLang's scheduler) takes a snapshot there,
    # fits it elsewhere, and adopts the result: `adopt(fit(snapshot()), steps_at_snapshot)`.
    def snapshot(self) -> list[StepSample]:
        self._drafted_at_fit = sum(self._drafted_by_r.values())  # what the coming fit will have seen
        return list(self.samples)

    def adopt(self, table: SpsTable | None, steps: int) -> None:
        self._table, self.fitted_at, self.refits = table, steps, self.refits + 1
        self._seconds_since_fit = 0.0

    def fit(self, samples: list[StepSample]) -> SpsTable | None:
        """A table fitted to `samples` (a snapshot) and the prior; None with neither."""
        return self._fit(samples)

    def _weights(self, samples) -> np.ndarray:
        newest = samples[-1].index + 1 if samples else self.steps  # a snapshot ages from its own end
        age = newest - np.array([s.index for s in samples], dtype=np.float64)
        return 0.5 ** (age / self.half_life)

    def _fit(self, samples: list[StepSample]) -> SpsTable | None:
        if not samples and self.prior is None:
            return None
        if self.prior is not None:
            self.prior_scale, self.prior_draft_scale = self._prior_scales(samples)
        elif not any(s.drafted for s in samples):
            return untested_table(self._undrafted_costs(samples))
        r = [s.num_requests for s in samples]
        b = [s.batch_tokens for s in samples]
        y = [s.seconds for s in samples]
        d = [s.drafted for s in samples]
        w = self._weights(samples).tolist() if samples else []
        if self.prior is not None:  # pseudo-steps from the scaled prior, where the steps are thin
            grid = _prior_grid(self.prior)
            for pr, pb, drafted in grid:
                r.append(pr)
                b.append(pb)
                d.append(drafted)
                y.append((self.prior_draft_scale if drafted else self.prior_scale) / self.prior(pb, pr, drafted=drafted))
                w.append(self.prior_weight / len(grid))
        n = len(samples)
        if n < 16:
            return SpsTable(*fit_step_table(r, b, y, d, w))
        r, b, y, d, w = (np.asarray(x) for x in (r, b, y, d, w))
        table = self._robust_fit(r, b, y, d, w, n)
        # The host's speed drifts (a neighbour, thermal limits): bring every step to the speed of the
        # latest ones, so a drafted step measured before a slowdown prices the drafter at today's speed.
        ratio = y[:n] / table.seconds_at(r[:n], b[:n], d[:n])
        speed = median_filter(ratio, size=HOST_WINDOW, mode="reflect")  # reflect: no edge value repeated
        y = y.copy()
        y[:n] *= float(np.median(ratio[-HOST_WINDOW:])) / speed
        return self._robust_fit(r, b, y, d, w, n)

    def _robust_fit(self, r, b, y, d, w, n: int) -> SpsTable:
        """Fit, leave out the first `n` steps the fit cannot explain (a stall, a GC pause: more than
        `outlier_mads` robust deviations), fit again. The rest are prior pseudo-steps, always kept."""
        table = SpsTable(*fit_step_table(r, b, y, d, w))
        residual = y[:n] - table.seconds_at(r[:n], b[:n], d[:n])
        scale = 1.4826 * _weighted_median(np.abs(residual), w[:n]) + 1e-9
        keep = np.concatenate([np.abs(residual) <= self.outlier_mads * scale, np.ones(len(r) - n, dtype=bool)])
        if not keep.all() and d[keep].any():
            table = SpsTable(*fit_step_table(r[keep], b[keep], y[keep], d[keep], w[keep]))
        return table

    def _undrafted_costs(self, samples) -> dict[int, float]:
        """R -> seconds of a budget-0 step: weighted medians, made non-decreasing in R."""
        if not samples:
            return {}
        weights = self._weights(samples)
        rs = sorted({s.num_requests for s in samples})
        medians, totals = [], []
        for r in rs:
            idx = [i for i, s in enumerate(samples) if s.num_requests == r]
            medians.append(_weighted_median(np.array([samples[i].seconds for i in idx]), weights[idx]))
            totals.append(float(weights[idx].sum()))
        smooth = isotonic_regression(np.array(medians), weights=np.array(totals), increasing=True).x
        return dict(zip(rs, smooth.tolist()))

    def _prior_scales(self, samples) -> tuple[float, float]:
        """How much slower (> 1) or faster this host runs than the prior says, for undrafted and
        for drafted steps: weighted medians of measured / prior over the recent steps of each kind
        (all steps stand in for a kind with none)."""
        if not samples:
            return self.prior_scale, self.prior_draft_scale
        r, b, d, y = (np.array([getattr(s, f) for s in samples])
                      for f in ("num_requests", "batch_tokens", "drafted", "seconds"))
        ratio, weights = y / self.prior.seconds_at(r, b, d), self._weights(samples)
        undrafted, drafted = (_weighted_median(ratio[kind], weights[kind]) if kind.any()
                              else _weighted_median(ratio, weights) for kind in (~d, d))
        return undrafted, drafted

    # ---- for a profile snapshot --------------------------------------------------------------
    def step_times(self) -> dict[tuple[int, int], list[float]]:
        """Recent step times (ms) keyed by (R, B), the shape a profile's measurements summarise:
        drafted steps with B > R and undrafted ones with B = R (a drafted step that verified
        nothing, a measuring probe, is neither kind a profile records)."""
        out: dict[tuple[int, int], list[float]] = {}
        for s in self.samples:
            if s.drafted == (s.batch_tokens > s.num_requests):
                out.setdefault((s.num_requests, s.batch_tokens), []).append(s.seconds * 1e3)
        return out


def _prior_grid(prior: SpsTable) -> list[tuple[int, int, bool]]:
    """(R, B, drafted) points that pin the prior's shape: each of its batch sizes undrafted and
    drafted at a few budgets."""
    table = prior.table
    rs = getattr(table, "bs_probes", None) or [1]
    top = getattr(table, "m_probes", None) or table.sample_batch_tokens
    points = []
    for r in rs:
        points.append((r, r, prior.draft_skip_seconds is None))  # a prior without the skip always drafts
        points += [(r, b, True) for b in sorted({r + 1, 2 * r, 4 * r, 8 * r, max(top)}) if b > r]
    return points


def untested_table(undrafted: dict[int, float] | None = None) -> SpsTable:
    """A table for an engine that has never drafted: a budget-0 step costs what was measured
    (R -> seconds; `{1: 0.01}` before any step), any draft costs PROHIBITIVE_SECONDS more, so a planner
    on it verifies nothing until drafting has been measured."""
    undrafted = undrafted or {1: 0.01}
    rs = sorted(undrafted)
    costs = [undrafted[r] for r in rs]
    bias = 1e-5
    additive = SpsAdditiveCostTable(bias_seconds=bias, bs_probes=rs, alpha_seconds=costs, m_probes=[1],
                                    theta_seconds=[PROHIBITIVE_SECONDS])
    return SpsTable(additive, [PROHIBITIVE_SECONDS + bias] * len(rs))
