"""In-process SPS capture on a tiny engine, and the table fits on synthetic step times."""

import pytest
from engine_fixtures import tiny_engine

from sglang_dspark.core.sps import SpsTable
from sglang_dspark.profile.capture import Probe, budget_grid, capture, fit_additive_table, fit_cost_table


def test_budget_grid_covers_the_ends():
    assert budget_grid(1, 7, 9) == list(range(8))
    grid = budget_grid(16, 7, 9)
    assert grid[0] == 0 and grid[-1] == 112 and len(grid) == 9


def test_capture_measures_every_probe_at_the_forced_budget():
    engine = tiny_engine("scheduled", max_running=4)
    probes = capture(engine, [5, 6, 7, 8], requests=[1, 3], points=4, warmup=1, repeats=3)
    keys = [(p.num_requests, p.batch_tokens) for p in probes]
    assert keys == sorted(set(keys))  # pooled and sorted, as a profile requires
    assert {r for r, _ in keys} == {1, 3} and all(r <= b <= r * (1 + engine.gamma) for r, b in keys)
    assert all(len(p.samples_ms) >= 1 and p.median_ms > 0 for p in probes)
    assert engine.forced_budget_frac is None and engine.num_running == 0
    table = SpsTable(fit_cost_table(probes, 32))
    assert table.max_batch_tokens == 32


def test_additive_fit_recovers_a_known_cost_model():
    # step_ms = 10 + 3 * R (drafting) + jagged verify cost of B
    verify = {b: 5 + 0.5 * b + (4 if b % 8 else 0) for b in range(1, 40)}
    probes = [Probe(r, r + k, (10 + 3 * r + verify[r + k],)) for r in (1, 2, 4, 8) for k in range(0, 4 * r, max(1, r // 2)) if r + k < 40]
    table = SpsTable(fit_additive_table(probes))
    for p in probes:
        assert 1000.0 / table(p.batch_tokens, num_requests=p.num_requests) == pytest.approx(p.median_ms, rel=1e-6)
