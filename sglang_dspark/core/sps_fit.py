"""Fitting SPS tables to measured step times: the one fit behind the offline profiler, `profile
refit` and the engine's online estimator.

SGLang's additive table prices a drafted step as `bias + alpha(R) + theta(B)` (R requests, B verify
tokens). The fit is non-negative least squares on increments, so alpha and theta never decrease
(more requests or tokens never make a step cheaper), and theta is piecewise linear between knots
(SGLang interpolates linearly between `m_probes`). A free value per B would let a B seen by one R
absorb that R's cost and swing with noise.

Our engine also runs steps without the drafter (budget 0); their saving per R is
`draft_skip_seconds`, the drafted step the table predicts at B = R minus the undrafted step
measured there.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import nnls

from sglang_dspark.core.sps import SpsAdditiveCostTable, SpsCostTable, SpsTable


def theta_knots(batch_tokens) -> list[int]:
    """Where theta(B) gets a free value: every measured B up to 16 (small batches are where the
    curve bends), then measured B at least ~25 % apart, and the largest."""
    bs = sorted({int(b) for b in batch_tokens})
    knots = [b for b in bs if b <= 16]
    for b in bs:
        if b > 16 and (not knots or b >= 1.25 * knots[-1]):
            knots.append(b)
    if knots[-1] != bs[-1]:
        knots.append(bs[-1])
    return knots


def _knot_weights(knots: list[int], b: float) -> np.ndarray:
    """theta(b) = sum_j w_j theta(knot_j), linear between knots and clamped at the ends."""
    weights = np.zeros(len(knots))
    if b <= knots[0]:
        weights[0] = 1.0
    elif b >= knots[-1]:
        weights[-1] = 1.0
    else:
        hi = next(i for i, k in enumerate(knots) if k >= b)
        frac = (b - knots[hi - 1]) / (knots[hi] - knots[hi - 1])
        weights[hi - 1], weights[hi] = 1.0 - frac, frac
    return weights


def fit_additive(num_requests, batch_tokens, seconds, weights=None) -> SpsAdditiveCostTable:
    """The additive table from drafted steps (B > R): arrays of equal length, optional
    per-sample weights (the online estimator's forgetting factor)."""
    r = np.asarray(num_requests, dtype=np.int64)
    b = np.asarray(batch_tokens, dtype=np.int64)
    y = np.asarray(seconds, dtype=np.float64)
    if r.size == 0:
        raise ValueError("no drafted step to fit (every budget was 0)")
    rs = sorted(set(r.tolist()))
    knots = theta_knots(b)
    # columns: alpha increments (R_1..), theta base, theta increments (knot_1..)
    design = np.zeros((r.size, len(rs) - 1 + len(knots)))
    rank = np.searchsorted(rs, r)
    for i in range(r.size):
        design[i, : rank[i]] = 1.0
        design[i, len(rs) - 1 :] = np.cumsum(_knot_weights(knots, b[i])[::-1])[::-1]
    if weights is not None:
        w = np.sqrt(np.asarray(weights, dtype=np.float64))
        design, y = design * w[:, None], y * w
    coef, _ = nnls(design, y)
    alpha = np.concatenate([[0.0], np.cumsum(coef[: len(rs) - 1])])
    theta = np.cumsum(coef[len(rs) - 1 :])
    bias = max(float(theta[0]) * 0.5, 1e-5)  # SGLang requires bias > 0
    return SpsAdditiveCostTable(bias_seconds=bias, bs_probes=rs, alpha_seconds=alpha.tolist(),
                                m_probes=knots, theta_seconds=(theta - bias).tolist())


def fit_draft_skip(additive: SpsAdditiveCostTable, undrafted: dict[int, float]) -> list[float] | None:
    """Per R of `additive`: the drafted step it predicts at budget 0 (B = R) minus the undrafted
    step measured at the nearest R (`undrafted`: R -> seconds). None without undrafted steps."""
    if not undrafted:
        return None
    table = SpsTable(additive)
    skips = []
    for r in additive.bs_probes:
        nearest = min(undrafted, key=lambda m: (abs(m - r), m))
        predicted = float(table.step_seconds(r, 1)[0])
        skips.append(round(min(max(predicted - undrafted[nearest], 0.0), 0.9 * predicted), 6))
    return skips


def fit_cost_table(batch_tokens, seconds, max_batch_tokens: int) -> SpsCostTable:
    """SGLang's 1-D form: SPS at each measured B, from the median step time over everything
    measured at that B."""
    by_tokens: dict[int, list[float]] = {}
    for b, s in zip(batch_tokens, seconds):
        by_tokens.setdefault(int(b), []).append(float(s))
    tokens = sorted(by_tokens)
    return SpsCostTable(sample_batch_tokens=tokens,
                        sample_steps_per_sec=[round(1.0 / float(np.median(by_tokens[b])), 6) for b in tokens],
                        max_batch_tokens=max(max_batch_tokens, tokens[-1]))
