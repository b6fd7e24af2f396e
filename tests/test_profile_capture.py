"""In-process SPS capture on a tiny engine, and the table fits on synthetic step times."""

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
    probes = capture(engine, [5, 6, 7, 8], requests=[1, 3], points=4, warmup=1, repeats=3)
    keys = [(p.num_requests, p.batch_tokens) for p in probes]
    assert keys == sorted(set(keys))  # pooled and sorted, as a profile requires
    assert {r for r, _ in keys} == {1, 3} and all(r <= b <= r * (1 + engine.gamma) for r, b in keys)
    assert all(len(p.samples_ms) >= 1 and p.median_ms > 0 for p in probes)
    assert engine.forced_budget_frac is None and engine.num_running == 0
    table = SpsTable(fit_cost_table(probes, 32))
    assert table.max_batch_tokens == 32


def test_additive_fit_recovers_a_known_cost_model():
    # step_ms = 10 + R + drafter (3R + 4, skipped at budget 0) + jagged verify cost of B
    verify = {b: 5 + 0.5 * b + (4 if b % 8 else 0) for b in range(1, 40)}

    def step_ms(r, b):
        return 10 + r + (3 * r + 4 if b > r else 0) + verify[b]

    probes = [Probe(r, r + k, (step_ms(r, r + k),)) for r in (1, 2, 4, 8) for k in range(0, 4 * r, max(1, r // 2)) if r + k < 40]
    additive = fit_additive_table(probes)
    table = SpsTable(additive, fit_draft_skip(probes, additive))
    for p in probes:
        predicted = 1000.0 / table(p.batch_tokens, num_requests=p.num_requests, drafted=p.batch_tokens > p.num_requests)
        # B = R = 1 is the one batch size no drafted probe reached: its theta is extrapolated
        assert predicted == pytest.approx(p.median_ms, rel=0.05 if p.batch_tokens == 1 else 1e-6)
    # the planner prices budget 0 as the step without the drafter
    assert 1000.0 * table.step_seconds(4, 3)[0] == pytest.approx(step_ms(4, 4), rel=1e-6)
    assert 1000.0 * table.step_seconds(4, 3)[1] == pytest.approx(step_ms(4, 5), rel=1e-6)


def test_draft_skip_is_validated():
    additive = fit_additive_table([Probe(1, 2, (5.0,)), Probe(2, 3, (6.0,)), Probe(2, 4, (7.0,))])
    with pytest.raises(ValueError, match="draft_skip_seconds"):
        SpsTable(additive, [0.001])
    with pytest.raises(ValueError, match="draft_skip_seconds"):
        SpsTable(SpsTable.flat(8).table, [0.001])
