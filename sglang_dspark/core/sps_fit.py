"""Fitting SPS tables to measured step times: the one fit behind the offline profiler, `profile
refit` and the engine's online estimator.

SGLang's additive table prices a drafted step as `bias + alpha(R) + theta(B)` (R requests, B verify
tokens). Our engine also runs steps without the drafter (budget 0), which save `skip(R)`: an
undrafted step costs `bias + alpha(R) + theta(R) - skip(R)`. All three are fitted jointly, by
non-negative least squares on increments, so alpha, theta and skip never decrease (more requests or
tokens never make a step cheaper, and a bigger batch never drafts for less); theta is piecewise
linear between knots (SGLang interpolates linearly between `m_probes`), skip between the batch
sizes that drafted. A free value per B would let a B seen by one R absorb that R's cost and swing
with noise between them.

Fitting both kinds of step at once is what lets a table follow a host that slows down: the shared
alpha and theta move with the (frequent) undrafted steps, and the (rarer) drafted steps only have
to pin the drafter's own cost.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import nnls

from sglang_dspark.core.sps import SpsAdditiveCostTable, SpsCostTable, SpsTable

MAX_SKIP_SHARE = 0.99  # a fitted undrafted step is never priced below 1 % of the drafted one
MIN_BIAS_SECONDS = 1e-5  # SGLang requires bias > 0; it is also the floor of every fitted price


def theta_knots(batch_tokens) -> list[int]:
    """Where theta(B) gets a free value: every measured B up to 16 (small batches are where the
    curve bends), then measured B at least a quarter apart, and the largest."""
    bs = sorted({int(b) for b in batch_tokens})
    knots = [b for b in bs if b <= 16]
    for b in bs:
        if b > 16 and (not knots or b >= 1.25 * knots[-1]):
            knots.append(b)
    if knots[-1] != bs[-1]:
        knots.append(bs[-1])
    return knots


def _knot_weights(knots: list[int], x) -> np.ndarray:
    """Rows [len(x), len(knots)]: f(x) = sum_j w_j f(knot_j), linear between knots, clamped."""
    x = np.clip(np.asarray(x, dtype=np.float64), knots[0], knots[-1])
    k = np.asarray(knots, dtype=np.float64)
    hi = np.clip(np.searchsorted(k, x, side="left"), 1, max(len(k) - 1, 1))
    weights = np.zeros((x.size, len(k)))
    if len(k) == 1:
        weights[:, 0] = 1.0
        return weights
    frac = (x - k[hi - 1]) / (k[hi] - k[hi - 1])
    rows = np.arange(x.size)
    weights[rows, hi - 1] = 1.0 - frac
    weights[rows, hi] += frac
    return weights


def _increments(knots: list[int], x) -> np.ndarray:
    """Design rows of a non-decreasing piecewise-linear function stored as a base value plus
    non-negative increments: f(knot_j) = base + sum_{i <= j} increment_i."""
    return np.cumsum(_knot_weights(knots, x)[:, ::-1], axis=1)[:, ::-1]


def fit_step_table(num_requests, batch_tokens, seconds, drafted=None, weights=None
                   ) -> tuple[SpsAdditiveCostTable, list[float] | None]:
    """(additive table, drafter-skip seconds per additive.bs_probes or None) for step times: arrays
    of equal length; `drafted` marks the steps that ran the drafter (default: all, SGLang's case);
    `weights` optionally weigh each step (the online estimator's forgetting factor)."""
    r = np.asarray(num_requests, dtype=np.int64)
    b = np.asarray(batch_tokens, dtype=np.int64)
    d = np.ones(r.size, dtype=bool) if drafted is None else np.asarray(drafted, dtype=bool)
    if not d.any():
        raise ValueError("no drafted step to fit (every budget was 0)")
    # Steps of the same (R, B, drafted) share a design row: their weighted mean with their summed
    # weight gives the same least-squares fit, on a handful of rows instead of thousands.
    # One int64 key per (R, B, drafted): a 1-D unique, several times faster than unique over columns.
    keys, inverse = np.unique((r << 33) | (b << 1) | d, return_inverse=True)
    w = np.ones(r.size) if weights is None else np.asarray(weights, dtype=np.float64)
    total = np.bincount(inverse, weights=w)
    y = np.bincount(inverse, weights=w * np.asarray(seconds, dtype=np.float64)) / total
    r, b, d = keys >> 33, (keys >> 1) & ((1 << 32) - 1), (keys & 1).astype(bool)
    rs = sorted(set(r.tolist()))
    knots = theta_knots(b)
    skip_rs = sorted(set(r[d].tolist())) if not d.all() else []  # skip is pinned where the drafter ran
    n_alpha, n_theta = len(rs) - 1, len(knots)
    design = np.zeros((r.size, n_alpha + n_theta + len(skip_rs)))
    design[:, :n_alpha] = np.searchsorted(rs, r)[:, None] > np.arange(n_alpha)[None, :]
    design[:, n_alpha : n_alpha + n_theta] = _increments(knots, b)
    if skip_rs:
        design[~d, n_alpha + n_theta :] = -_increments(skip_rs, r[~d])
    root = np.sqrt(total)
    coef, _ = nnls(design * root[:, None], y * root)
    alpha = np.concatenate([[0.0], np.cumsum(coef[:n_alpha])])
    theta = np.cumsum(coef[n_alpha : n_alpha + n_theta])
    # Half of theta's base becomes the bias. Where the fit put the base at zero (the steps seen let
    # alpha carry all of it), theta - bias must not go below zero: a region no step measured would
    # then cost bias + alpha + theta = 0 seconds, and SPS there 1 / 0.
    bias = max(float(theta[0]) * 0.5, MIN_BIAS_SECONDS)
    additive = SpsAdditiveCostTable(bias_seconds=bias, bs_probes=rs, alpha_seconds=alpha.tolist(),
                                    m_probes=knots, theta_seconds=np.maximum(theta - bias, 0.0).tolist())
    if not skip_rs:
        return additive, None
    skip_values = np.cumsum(coef[n_alpha + n_theta :])
    drafted_price = SpsTable(additive)
    skip = []
    values = _knot_weights(skip_rs, rs) @ skip_values
    for x, value in zip(rs, values):  # per bs_probe, never so large that an undrafted step would cost nothing
        skip.append(round(min(float(value), MAX_SKIP_SHARE * float(drafted_price.step_seconds(x, 1)[0])), 9))
    return additive, skip


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
