"""In-process SPS capture on a tiny engine, and the table fits on synthetic step times."""

import random

import pytest
from engine_fixtures import tiny_engine

from sglang_dspark.core.sps import SpsTable
from sglang_dspark.profile.capture import Probe, budget_grid, capture, fit_additive_table, fit_cost_table, fit_draft_skip


def test_budget_grid_covers_the_ends():
    assert budget_grid(1, 7, 9) == list(range(8))
    grid = budget_grid(16, 7, 9)
    assert grid[0] == 0 and grid[-1] == 112 and len(grid) == 9


def test_capture_measures_every_probe_at_the_forced_budget():
    engine = tiny_engine("scheduled", max_running=4)
    probes = capture(engine, [5, 6, 7, 8], requests=[1, 3], points=4, warmup=1, repeats=3, rounds=2)
    keys = [(p.num_requests, p.batch_tokens) for p in probes]
    assert keys == sorted(set(keys))  # pooled and sorted, as a profile requires
    assert {r for r, _ in keys} == {1, 3} and all(r <= b <= r * (1 + engine.gamma) for r, b in keys)
    assert all(p.median_ms > 0 for p in probes)
    assert sum(len(p.samples_ms) for p in probes) >= 2 * 3 * len(probes)  # every round measured each probe
    assert engine.forced_budget_frac is None and engine.num_running == 0
    table = SpsTable(fit_cost_table(probes, 32))
    assert table.max_batch_tokens == 32


def _bucketed_step_ms(r, b):
    # 10 + R + drafter (3R + 4, skipped at budget 0) + a verify cost of B that jumps every 8 tokens
    return 10 + r + (3 * r + 4 if b > r else 0) + 5 + 0.1 * b + 4 * ((b + 7) // 8)


def _probes(step_ms, noise=None):
    rng = random.Random(0)
    return [Probe(r, r + k, (step_ms(r, r + k) * (1 + (rng.uniform(-noise, noise) if noise else 0)),))
            for r in (1, 2, 4, 8) for k in range(0, 4 * r + 1, max(1, r // 2))]


def test_additive_fit_recovers_a_known_cost_model():
    probes = _probes(_bucketed_step_ms)
    additive = fit_additive_table(probes)
    table = SpsTable(additive, fit_draft_skip(probes, additive))
    for p in probes:
        predicted = 1000.0 / table(p.batch_tokens, num_requests=p.num_requests, drafted=p.batch_tokens > p.num_requests)
        # theta has a knot at every B <= 16; above, it interpolates between knots ~25 % apart, so
        # least squares trades a little accuracy below 16 for the staircase above it.
        assert predicted == pytest.approx(p.median_ms, rel=0.02 if p.batch_tokens <= 16 else 0.04)
    # the planner prices budget 0 as the step without the drafter
    assert 1000.0 * table.step_seconds(4, 3)[0] == pytest.approx(_bucketed_step_ms(4, 4), rel=0.01)
    assert 1000.0 * table.step_seconds(4, 3)[1] == pytest.approx(_bucketed_step_ms(4, 5), rel=0.01)


def test_additive_fit_is_monotone_and_positive_under_noise():
    probes = _probes(_bucketed_step_ms, noise=0.2)
    additive = fit_additive_table(probes)
    assert all(a <= b for a, b in zip(additive.alpha_seconds, additive.alpha_seconds[1:]))
    assert all(a <= b for a, b in zip(additive.theta_seconds, additive.theta_seconds[1:]))
    table = SpsTable(additive, fit_draft_skip(probes, additive))
    for r in (1, 2, 4, 8, 16):
        assert all(s > 0 for s in table.step_seconds(r, 8 * r))
    errors = sorted(abs(1000.0 / table(p.batch_tokens, num_requests=p.num_requests, drafted=p.batch_tokens > p.num_requests)
                        - p.median_ms) / p.median_ms for p in probes)
    assert errors[len(errors) // 2] < 0.1  # the median error stays inside the noise


def test_draft_skip_is_validated():
    additive = fit_additive_table([Probe(1, 2, (5.0,)), Probe(2, 3, (6.0,)), Probe(2, 4, (7.0,))])
    assert additive.bs_probes == [1, 2]
    with pytest.raises(ValueError, match="draft_skip_seconds"):
        SpsTable(additive, [0.001])
    with pytest.raises(ValueError, match="draft_skip_seconds"):
        SpsTable(SpsTable.flat(8).table, [0.001])
