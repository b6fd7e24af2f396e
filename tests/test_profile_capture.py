"""In-process SPS capture on a tiny engine, and the table fits on synthetic step times."""

import random

import pytest
from engine_fixtures import tiny_engine

from sglang_dspark.core.sps import SpsTable
from sglang_dspark.core.sps_fit import fit_step_table
from sglang_dspark.profile.capture import budget_grid, capture
from sglang_dspark.profile.measure import fit_section, summarize


def test_budget_grid_covers_the_ends():
    assert budget_grid(1, 7, 9) == list(range(8))
    grid = budget_grid(16, 7, 9)
    assert grid[0] == 0 and grid[-1] == 112 and len(grid) == 9


def test_capture_measures_every_probe_at_the_forced_budget():
    engine = tiny_engine("scheduled", max_running=4)
    samples = capture(engine, [5, 6, 7, 8], requests=[1, 3], points=4, warmup=1, repeats=3, rounds=2)
    rows = summarize(samples)
    keys = [(m.num_requests, m.batch_tokens) for m in rows]
    assert keys == sorted(set(keys))  # pooled and sorted, as a profile requires
    assert {r for r, _ in keys} == {1, 3} and all(r <= b <= r * (1 + engine.gamma) for r, b in keys)
    assert all(m.median_ms > 0 for m in rows)
    assert sum(m.repeats for m in rows) >= 2 * 3 * len(rows)  # every round measured each probe
    assert engine.policy.forced_budget_frac is None and engine.num_running == 0 and engine.num_waiting == 0
    section = fit_section(rows, 32, skips_drafter_at_budget_0=True)
    assert section.table().table == section.additive and section.cost.max_batch_tokens == 32


def test_capture_probes_with_greedy_requests_unless_told_otherwise():
    """Greedy probe requests draft through the greedy chain, the path greedy traffic takes; seeded
    sampled ones draft position by position and priced a drafted step higher than greedy serving paid."""
    submitted = []
    for temperature in (0.0, 0.8):
        engine = tiny_engine("scheduled", max_running=2)
        submit = engine.submit
        engine.submit = lambda ids, params, cb, **kw: submitted.append(params) or submit(ids, params, cb, **kw)
        capture(engine, [5, 6, 7, 8], requests=[2], points=2, warmup=0, repeats=1, temperature=temperature)
    greedy, sampled = submitted[: len(submitted) // 2], submitted[len(submitted) // 2:]
    assert greedy and all(p.temperature == 0.0 and p.seed is None for p in greedy)
    assert sampled and all(p.temperature == 0.8 and p.seed is not None for p in sampled)


def _bucketed_step_ms(r, b):
    # 10 + R + drafter (3R + 4, skipped at budget 0) + a verify cost of B that jumps every 8 tokens
    return 10 + r + (3 * r + 4 if b > r else 0) + 5 + 0.1 * b + 4 * ((b + 7) // 8)


def _points(step_ms, noise=None):
    rng = random.Random(0)
    return [(r, r + k, step_ms(r, r + k) * (1 + (rng.uniform(-noise, noise) if noise else 0)))
            for r in (1, 2, 4, 8) for k in range(0, 4 * r + 1, max(1, r // 2))]


def _fit(points):
    r, b, ms = zip(*points)
    additive, skip = fit_step_table(r, b, [x / 1e3 for x in ms], [bb > rr for rr, bb in zip(r, b)])
    return additive, SpsTable(additive, skip)


def test_additive_fit_recovers_a_known_cost_model():
    points = _points(_bucketed_step_ms)
    _, table = _fit(points)
    for r, b, ms in points:
        predicted = 1000.0 / table(b, num_requests=r, drafted=b > r)
        # theta has a knot at every B <= 16; above, it interpolates between knots ~25 % apart, so
        # least squares trades a little accuracy below 16 for the staircase above it.
        assert predicted == pytest.approx(ms, rel=0.02 if b <= 16 else 0.04)
    # the planner prices budget 0 as the step without the drafter
    assert 1000.0 * table.step_seconds(4, 3)[0] == pytest.approx(_bucketed_step_ms(4, 4), rel=0.01)
    assert 1000.0 * table.step_seconds(4, 3)[1] == pytest.approx(_bucketed_step_ms(4, 5), rel=0.01)


def test_additive_fit_is_monotone_and_positive_under_noise():
    points = _points(_bucketed_step_ms, noise=0.2)
    additive, table = _fit(points)
    assert all(a <= b for a, b in zip(additive.alpha_seconds, additive.alpha_seconds[1:]))
    assert all(a <= b for a, b in zip(additive.theta_seconds, additive.theta_seconds[1:]))
    for r in (1, 2, 4, 8, 16):
        assert all(s > 0 for s in table.step_seconds(r, 8 * r))
    errors = sorted(abs(1000.0 / table(b, num_requests=r, drafted=b > r) - ms) / ms for r, b, ms in points)
    assert errors[len(errors) // 2] < 0.1  # the median error stays inside the noise


def test_weights_let_recent_steps_win():
    """Two regimes of the same steps: weighted towards the second, the fit follows the second."""
    points = [(r, b, s) for r in (1, 2) for b in range(r + 1, r + 6) for s in (0.010 * b, 0.020 * b)]
    r, b, s = zip(*points)
    weights = [1.0 if i % 2 else 1e-4 for i in range(len(points))]  # odd rows: the slow regime
    table = SpsTable(fit_step_table(r, b, s, weights=weights)[0])
    assert 1.0 / table(4, num_requests=2) == pytest.approx(0.080, rel=0.05)


def test_draft_skip_is_validated():
    additive, skip = fit_step_table([1, 2, 2], [2, 3, 4], [0.005, 0.006, 0.007])
    assert skip is None  # every step drafted: no saving to fit
    assert additive.bs_probes == [1, 2]
    with pytest.raises(ValueError, match="draft_skip_seconds"):
        SpsTable(additive, [0.001])
    with pytest.raises(ValueError, match="draft_skip_seconds"):
        SpsTable(SpsTable.flat(8).table, [0.001])
