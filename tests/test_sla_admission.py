"""SLA mode beyond the budget: overhead-aware speed predictions and admission control."""

import pytest
import torch

from engine_fixtures import TickClock, tiny_engine
from sglang_dspark.core.schedule import AsyncPlanner, decide_budget_sla, sla_speed
from sglang_dspark.core.sps import SpsTable
from sglang_dspark.engine.sampling import SamplingParams

# 100 steps/s up to B = 2 tokens, then a cliff to 5 steps/s
CLIFF = SpsTable.from_points([1, 2, 3], [100.0, 100.0, 5.0], max_batch_tokens=64)


def test_overhead_lowers_the_predicted_speed_and_the_budget():
    table = SpsTable.from_points(list(range(1, 65)), [20.0 / (1 + 0.05 * b) for b in range(1, 65)])
    conf = torch.full((4, 7), 0.6)
    survival = torch.cumprod(conf, 1)
    fast = sla_speed(survival, table, 5.0)
    slow = sla_speed(survival, table, 5.0, overhead_seconds=0.1)
    assert slow < fast
    # a tier met without overhead and missed with it: the budget moves to the best slowest speed
    target = (fast + slow) / 2
    assert sla_speed(survival, table, target) >= target > sla_speed(survival, table, target, overhead_seconds=0.1)
    met = decide_budget_sla(survival, table, target)
    missed = decide_budget_sla(survival, table, target, overhead_seconds=0.1)
    assert missed.budget != met.budget and missed.predicted_theta < met.predicted_theta


def test_can_admit_stops_where_the_tier_would_break():
    planner = AsyncPlanner(CLIFF, gamma=4, lag=1, sla_tok_s_per_user=50.0)
    low = torch.full((1, 4), 0.01)  # hopeless drafts: budget 0, one token per step
    planner.observe(["a"], low)
    assert planner.can_admit(["a"])  # two requests: B = 2, 100 tok/s each
    planner.observe(["b"], low)
    assert not planner.can_admit(["a", "b"])  # a third means B >= 3: 5 steps/s
    assert AsyncPlanner(CLIFF, gamma=4, lag=1).can_admit(["a", "b", "c"])  # no SLA: no gate
    assert planner.can_admit([])  # an empty engine always admits


def test_measured_speed_below_the_tier_closes_admission_unless_the_tier_is_out_of_reach():
    planner = AsyncPlanner(CLIFF, gamma=4, lag=1, sla_tok_s_per_user=50.0)
    planner.observe(["a"], torch.full((1, 4), 0.01))
    assert planner.can_admit(["a"], measured_slowest=None)  # predicted: 100 tok/s at B = 2
    assert planner.can_admit(["a"], measured_slowest=60.0)
    assert not planner.can_admit(["a"], measured_slowest=40.0)  # the running user already misses it
    unreachable = AsyncPlanner(CLIFF, gamma=4, lag=1, sla_tok_s_per_user=1e6)
    unreachable.observe(["a"], torch.full((1, 4), 0.01))
    assert unreachable.can_admit(["a"], measured_slowest=1.0)  # fallback: admission not limited


def test_engine_measures_the_slowest_running_speed():
    clock = TickClock()
    engine = tiny_engine("scheduled", max_running=2, sps=CLIFF, sla_tok_s_per_user=50.0, clock=clock, learn_sps=False)
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    engine.submit([5, 6, 7], params, lambda out: None)
    for _ in range(12):
        engine.step()
    (req,) = engine.scheduler.running
    n = len(req.output_ids)
    speed = engine.slowest_speed([req])  # reading the clock advances it by one tick
    assert n >= 8 and speed == pytest.approx((n - 1) / (clock.now - req.first_token_at))
    young = engine.slowest_speed([])  # nobody running: no measurement
    assert young is None


def test_time_scale_corrects_an_optimistic_table():
    table = SpsTable.from_points([1, 2, 3], [100.0, 70.0, 5.0], max_batch_tokens=64)
    planner = AsyncPlanner(table, gamma=4, lag=1, sla_tok_s_per_user=40.0)
    planner.observe(["a"], torch.full((1, 4), 0.01))
    assert planner.can_admit(["a"])  # the table: 70 steps/s at B = 2
    planner.time_scale = 2.0  # steps measured twice as slow: 35 tok/s < 40 (alone: 50, reachable)
    assert not planner.can_admit(["a"])
    survival = torch.cumprod(torch.full((2, 4), 0.01), 1)
    assert sla_speed(survival, CLIFF, 60.0, time_scale=2.0) == pytest.approx(sla_speed(survival, CLIFF, 60.0) / 2)


def test_unmeetable_tier_does_not_limit_admission():
    planner = AsyncPlanner(CLIFF, gamma=4, lag=1, sla_tok_s_per_user=1e6)
    planner.observe(["a", "b"], torch.full((2, 4), 0.01))
    assert planner.can_admit(["a", "b"])  # even one request alone misses it: documented fallback


def test_engine_in_sla_mode_caps_running_requests_and_finishes_all():
    """On a clock that reads the same on every host: a step costs a few ticks of 1 ms against the
    table's 10 ms, so the measured time scale is below 1 and two users at B = 2 stay far above the
    tier, while a third would put every user on the cliff."""
    engine = tiny_engine("scheduled", max_running=6, sps=CLIFF, sla_tok_s_per_user=50.0, clock=TickClock(),
                         learn_sps=False)
    most = [0]
    step = engine.step

    def counting_step():
        step()
        most[0] = max(most[0], engine.num_running)

    engine.step = counting_step
    outs = engine.generate([[5, 6, 7]] * 6, [SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)] * 6)
    assert all(len(o) == 12 for o in outs)  # queued requests are served, nothing is lost
    assert most[0] <= 2  # B = R >= 3 would drop every user to <= 5 * (1 + 4) tok/s
    planner = engine.policy.planner
    assert planner.overhead_seconds > 0  # measured between decode steps
    assert 0 < planner.time_scale < 1  # measured against the table's predictions


def test_engine_without_sla_fills_every_slot():
    engine = tiny_engine("scheduled", max_running=6, sps=CLIFF, learn_sps=False)
    engine.generate([[5, 6, 7]] * 6, [SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)] * 6)
    planner = engine.policy.planner
    assert planner.overhead_seconds == 0.0 and planner.time_scale == 1.0  # only SLA mode measures them
    engine.submit([5, 6], SamplingParams(max_tokens=3, ignore_eos=True), lambda out: None)
    for _ in range(3):
        engine.submit([5, 6], SamplingParams(max_tokens=3, ignore_eos=True), lambda out: None)
    engine.step()
    assert engine.num_running == 4
