"""Property tests of the planners (hypothesis): lengths in range, prefix order, capacity bound,
determinism, and the agreement of the planner entry points with each other."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_dspark.core.schedule import AsyncPlanner, allocate_top_k, decide_budget, decide_budget_sla, plan_verify_lens
from sglang_dspark.core.sps import SpsTable

confs = st.integers(1, 12).flatmap(
    lambda r: st.integers(1, 8).flatmap(
        lambda g: st.lists(
            st.sampled_from([0.0, 1e-7, 0.1, 0.5, 0.5, 0.9, 0.99, 1.0]) | st.floats(0, 1),
            min_size=r * g,
            max_size=r * g,
        ).map(lambda xs: torch.tensor(xs, dtype=torch.float32).view(r, g))
    )
)
tables = st.lists(st.floats(0.05, 10.0), min_size=1, max_size=40).flatmap(
    lambda sps: st.integers(len(sps), len(sps) + 60).map(
        lambda cap: SpsTable.from_points(list(range(1, len(sps) + 1)), sps, max_batch_tokens=cap)
    )
)


@settings(max_examples=300, deadline=None)
@given(conf=confs, table=tables, early_stop=st.booleans())
def test_plan_lengths_in_range_capped_and_deterministic(conf, table, early_stop):
    lens = plan_verify_lens(conf, table, early_stop=early_stop)
    R, G = conf.shape
    assert lens.dtype == torch.int64 and lens.shape == (R,)
    assert bool(((lens >= 0) & (lens <= G)).all())
    assert R + int(lens.sum()) <= max(table.max_batch_tokens, R)
    assert torch.equal(lens, plan_verify_lens(conf.clone(), table, early_stop=early_stop))
    # Algorithm 1 stops no later than the global search.
    if early_stop:
        assert int(lens.sum()) <= int(plan_verify_lens(conf, table, early_stop=False).sum())


@settings(max_examples=300, deadline=None)
@given(conf=confs, budget=st.integers(0, 100))
def test_top_k_allocation_is_prefix_closed_and_takes_the_best(conf, budget):
    survival = torch.cumprod(conf, dim=1)
    lens = allocate_top_k(survival, budget)
    valid = int((survival >= 1e-6).sum())
    assert int(lens.sum()) == min(budget, valid)
    # Prefix order: every verified draft has survival >= every unverified candidate.
    taken = torch.arange(conf.shape[1]).unsqueeze(0) < lens.unsqueeze(1)
    if taken.any() and (~taken & (survival >= 1e-6)).any():
        assert survival[taken].min() >= survival[~taken & (survival >= 1e-6)].max()


@settings(max_examples=200, deadline=None)
@given(conf=confs, table=tables)
def test_plan_total_matches_decide_budget(conf, table):
    survival = torch.cumprod(conf, dim=1)
    decision = decide_budget(survival, table, early_stop=False)
    assert int(plan_verify_lens(conf, table, early_stop=False).sum()) == decision.budget
    assert decision.predicted_step_seconds > 0
    # Brute force, by the definition: verifying the k most likely drafts (survival >= 1e-6, within
    # the table's capacity) yields (R + their survivals' sum) tokens at SPS(R + k); the budget is
    # the k of the most throughput (ties within rounding may go either way).
    R = conf.shape[0]
    ranked = sorted(survival[survival >= 1e-6].tolist(), reverse=True)  # the floor in float32, as SGLang's
    ks = range(min(len(ranked), max(0, table.max_batch_tokens - R)) + 1)
    theta = [(R + sum(ranked[:k])) * table(R + k, num_requests=R) for k in ks]
    assert decision.budget in ks and theta[decision.budget] >= max(theta) * (1 - 1e-9)
    assert decision.predicted_theta == pytest.approx(theta[decision.budget], rel=1e-6)


@settings(max_examples=150, deadline=None)
@given(history=confs, now=st.integers(0, 10_000), table=tables, lag=st.integers(1, 3))
def test_async_planner_capacity_uses_only_lagged_history(history, now, table, lag):
    R, G = history.shape
    ids = [f"req{i}" for i in range(R)]
    a, b = AsyncPlanner(table, G, lag=lag), AsyncPlanner(table, G, lag=lag)
    for planner in (a, b):
        planner.observe(ids, history)
        for _ in range(lag - 1):
            planner.observe(ids, torch.rand(R, G, generator=torch.Generator().manual_seed(now)))
    # The newest lag-1 observations differ between a and b only after capacity is read.
    cap = a.capacity(ids)
    assert cap == b.capacity(ids)
    assert 0 <= cap <= R * G and R + cap <= max(table.max_batch_tokens, R)
    assert cap == decide_budget(torch.cumprod(history, 1), table).budget
    lens = a.allocate(torch.rand(R, G), cap)
    assert int(lens.sum()) <= cap and bool((lens <= G).all())


def test_async_planner_without_history_counts_survival_one_and_snaps_to_buckets():
    table = SpsTable.from_points([1, 3, 8, 16], [100.0, 60.0, 55.0, 30.0], max_batch_tokens=64)
    planner = AsyncPlanner(table, gamma=7, buckets=[4, 8, 16, 32])
    ids = ["a", "b"]
    # No history: survival 1 everywhere; theta = B * SPS(B) peaks at B = 15 (825) -> k = 13;
    # the bucket 16 then holds 14 drafts = R * G.
    assert planner.capacity(ids) == 14
    planner.observe(ids, torch.full((2, 7), 0.1))
    planner.observe(ids, torch.full((2, 7), 0.9))
    # Lagged row (0.1 everywhere): theta(0) = 200 beats 2.1 * 60 and all later -> k = 0, B = 2,
    # snapped up to bucket 4 -> 2 drafts.
    assert planner.capacity(ids) == 2
    planner.release("a")
    assert planner.capacity(["a"]) == 7  # no history again: survival 1, best B = 8 (440) -> 7 drafts


def test_async_planner_capacity_follows_a_new_table_and_new_history():
    """capacity() reuses its last decision only while nothing it reads has changed."""
    pays = SpsTable.from_points([1, 2, 8, 16], [100.0, 99.0, 98.0, 30.0], max_batch_tokens=64)
    never = SpsTable.from_points(list(range(1, 9)), [100.0 / b ** 1.2 for b in range(1, 9)], max_batch_tokens=64)
    planner = AsyncPlanner(pays, gamma=7)
    assert planner.capacity(["a"]) == 7  # no history: survival 1, B = 8 (784) beats B = 1 (100)
    planner.sps = never  # as the engine swaps in a refitted table
    assert planner.capacity(["a"]) == 0  # theta = 100 B^-0.2 falls from B = 1
    planner.sps = pays
    assert planner.capacity(["a"]) == 7
    planner.observe(["a"], torch.full((1, 7), 0.001))  # the same table and requests, new history
    planner.observe(["a"], torch.full((1, 7), 0.001))
    assert planner.capacity(["a"]) == 0  # its lagged confidences: 1.001 x SPS(2) = 99.6 < 100
    planner.release("a")
    assert planner.capacity(["a"]) == 7  # no history again
    assert planner.capacity(["b"]) == 7  # another request set


def _slowest_speed(survival, lens, table):
    R = survival.shape[0]
    per_user = 1.0 + torch.stack([survival[r, : lens[r]].double().sum() for r in range(R)])
    return float(per_user.min()) * table(R + int(lens.sum()), num_requests=R)


def test_sla_mode_trades_throughput_for_the_slowest_user():
    # One confident request and seven hopeless ones: maximum throughput verifies the confident
    # request deeply (k = 7), and the larger batch slows every user below 13 tok/s.
    table = SpsTable.from_points(list(range(1, 65)), [20.0 / (1 + 0.05 * b) for b in range(1, 65)])
    conf = torch.full((8, 7), 0.05)
    conf[0] = 0.99
    survival = torch.cumprod(conf, 1)
    free = decide_budget(survival, table)
    assert _slowest_speed(survival, allocate_top_k(survival, free.budget), table) < 13.0
    sla = decide_budget_sla(survival, table, 13.0)
    assert sla.budget < free.budget and sla.predicted_theta <= free.predicted_theta
    assert sla.budget == 2  # the largest budget whose slowest user still gets >= 13 tok/s
    assert _slowest_speed(survival, allocate_top_k(survival, sla.budget), table) >= 13.0
    # An unmeetable tier falls back to the budget that maximises the slowest user's speed.
    fallback = decide_budget_sla(survival, table, 1e6)
    speeds = [_slowest_speed(survival, allocate_top_k(survival, k), table) for k in range(0, 57)]
    assert fallback.budget == max(range(len(speeds)), key=lambda k: (speeds[k], -k))


@settings(max_examples=200, deadline=None)
@given(conf=confs, table=tables, target=st.floats(0.1, 50.0))
def test_sla_budget_meets_the_tier_whenever_any_budget_does(conf, table, target):
    survival = torch.cumprod(conf, 1)
    sla = decide_budget_sla(survival, table, target)
    free = decide_budget(survival, table)
    assert sla.predicted_theta <= free.predicted_theta + 1e-9
    k_max = min(int((survival >= 1e-6).sum()), max(0, table.max_batch_tokens - conf.shape[0]))
    meets = [_slowest_speed(survival, allocate_top_k(survival, k), table) >= target * (1 - 1e-9) for k in range(k_max + 1)]
    if any(meets):
        assert meets[sla.budget]


def test_observed_prior_prices_new_requests_like_the_ones_seen():
    table = SpsTable.from_points([1, 3, 8, 16], [100.0, 60.0, 55.0, 30.0], max_batch_tokens=64)
    planner = AsyncPlanner(table, gamma=7, prior="observed")
    assert planner.capacity(["a"]) == 7  # nothing observed yet: survival 1, as SGLang
    planner.observe(["a", "b"], torch.full((2, 7), 0.1))
    # a typical row (0.1): theta(1) = 1.1 * SPS(2) = 110 beats 100 and 2.11 * 60 -> 1 draft
    assert planner.capacity(["new"]) == 1
    assert AsyncPlanner(table, gamma=7).capacity(["new"]) == 7  # the default prior stays SGLang's
    with pytest.raises(ValueError, match="prior"):
        AsyncPlanner(table, gamma=7, prior="mean")


@pytest.mark.parametrize("num_requests,gamma", [(1, 7), (5, 3), (40, 7), (300, 7)])
def test_the_slowest_request_walk_equals_the_dense_sums(num_requests, gamma):
    """Large batches take the heap walk in _slowest_tokens; it must give exactly the dense answer."""
    from sglang_dspark.core import schedule

    survival = torch.cumprod(torch.rand(num_requests, gamma, generator=torch.Generator().manual_seed(num_requests)), 1)
    values, order = schedule._ranked_candidates(survival.numpy())
    k_max = values.size
    dense = schedule._slowest_tokens(values, order % num_requests, num_requests, k_max)
    saved = schedule.DENSE_SLOWEST_MAX
    try:
        schedule.DENSE_SLOWEST_MAX = 0
        walked = schedule._slowest_tokens(values, order % num_requests, num_requests, k_max)
    finally:
        schedule.DENSE_SLOWEST_MAX = saved
    assert np.array_equal(dense, walked)
