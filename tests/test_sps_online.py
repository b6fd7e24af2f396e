"""The online SPS estimator on simulated steps with a known cost: it learns the table, follows a host
that slows down, ignores stalls, starts target-only, and scales a profile from other hardware."""

from __future__ import annotations

import random

import pytest
import torch

from sglang_dspark.core.schedule import decide_budget
from sglang_dspark.core.sps import SpsAdditiveCostTable, SpsTable
from sglang_dspark.core.sps_online import PROHIBITIVE_SECONDS, OnlineSpsEstimator, untested_table


def true_seconds(r: int, b: int, drafted: bool, scale: float = 1.0) -> float:
    """A step: 20 ms + 2 ms per request, a drafter of 6 ms + 1 ms per request, verify tokens
    at 0.5 ms each with a 4 ms jump every 8 tokens."""
    return scale * (0.020 + 0.002 * r + (0.006 + 0.001 * r if drafted else 0.0) + 0.0005 * b + 0.004 * ((b - 1) // 8))


def feed(est: OnlineSpsEstimator, steps: int, rng: random.Random, scale: float = 1.0, noise: float = 0.05,
         drafted_share: float = 0.25, stall_every: int = 0) -> None:
    for i in range(steps):
        r = rng.choice([1, 2, 4, 8])
        drafted = rng.random() < drafted_share
        b = r + (rng.randint(1, r * 7) if drafted else 0)
        seconds = true_seconds(r, b, drafted, scale) * (1 + rng.uniform(-noise, noise))
        if stall_every and i % stall_every == stall_every - 1:
            seconds *= 10  # a GC pause or a neighbour's burst
        est.observe(r, b, drafted, seconds)


def median_error(table: SpsTable, scale: float = 1.0) -> float:
    errors = []
    for r in (1, 2, 4, 8):
        for b in range(r, r * 8 + 1):
            drafted = b > r
            predicted = 1.0 / table(b, num_requests=r, drafted=drafted)
            errors.append(abs(predicted - true_seconds(r, b, drafted, scale)) / true_seconds(r, b, drafted, scale))
    return sorted(errors)[len(errors) // 2]


def test_learns_a_known_cost_model_from_steps():
    est = OnlineSpsEstimator()
    feed(est, 400, random.Random(0))
    table = est.table()
    assert median_error(table) < 0.05
    undrafted = [1.0 / table(r, num_requests=r, drafted=False) for r in (1, 2, 4, 8)]
    assert undrafted == pytest.approx([true_seconds(r, r, False) for r in (1, 2, 4, 8)], rel=0.05)


def test_follows_a_host_that_slows_down_within_two_half_lives():
    est = OnlineSpsEstimator(half_life=64)
    rng = random.Random(1)
    feed(est, 400, rng)
    feed(est, 2 * 64, rng, scale=2.0)  # twice as slow from now on
    assert median_error(est.table(), scale=2.0) < 0.15


def test_drafted_prices_follow_the_undrafted_steps_after_a_slowdown():
    """Drafted steps are rare (probes); after the host slows down the undrafted ones, fitted with
    them, carry the shared terms: drafted prices rise before many drafted steps were seen again."""
    est = OnlineSpsEstimator(half_life=64)
    rng = random.Random(6)
    feed(est, 400, rng, drafted_share=0.05)
    feed(est, 150, rng, scale=1.6, drafted_share=0.02)
    table = est.table()
    for r in (1, 4, 8):
        assert 1.0 / table(r, num_requests=r, drafted=False) == pytest.approx(true_seconds(r, r, False, 1.6), rel=0.1)
        assert 1.0 / table(r + 2, num_requests=r) > 1.3 * true_seconds(r, r + 2, True)  # no longer the old price


def test_stalls_do_not_move_the_table():
    clean, stalled = OnlineSpsEstimator(), OnlineSpsEstimator()
    feed(clean, 400, random.Random(2))
    feed(stalled, 400, random.Random(2), stall_every=25)  # 4 % of steps take 10x longer
    assert median_error(stalled.table()) < 0.08
    assert median_error(stalled.table()) < 2 * median_error(clean.table()) + 0.02


def test_memory_is_bounded():
    est = OnlineSpsEstimator(capacity=100)
    feed(est, 1000, random.Random(3))
    assert len(est.samples) == 100 and est.steps == 1000


def test_before_any_drafted_step_drafting_is_prohibitive():
    est = OnlineSpsEstimator()
    feed(est, 50, random.Random(4), drafted_share=0.0)
    table = est.table()
    survival = torch.ones(4, 7)  # even a perfect drafter
    assert decide_budget(survival, table).budget == 0
    assert 1.0 / table(4, num_requests=4, drafted=False) == pytest.approx(true_seconds(4, 4, False), rel=0.05)
    assert 1.0 / table(5, num_requests=4) > PROHIBITIVE_SECONDS
    assert decide_budget(survival, untested_table()).budget == 0


def test_a_profile_from_other_hardware_is_scaled_to_the_measured_steps():
    """The prior says every step costs half of what this host measures; after undrafted steps only,
    drafted steps are predicted at the prior's shape times the measured ratio."""
    from sglang_dspark.core.sps_fit import fit_step_table

    truth = []
    for r in (1, 2, 4, 8):
        for b in range(r, 8 * r + 1, max(1, r)):
            truth.append((r, b, b > r, true_seconds(r, b, b > r, 0.5)))
    r, b, d, s = zip(*truth)
    prior = SpsTable(*fit_step_table(r, b, s, d))
    est = OnlineSpsEstimator(prior=prior)
    feed(est, 200, random.Random(5), drafted_share=0.0)  # this host: full scale, never drafted yet
    table = est.table()
    assert est.prior_scale == pytest.approx(2.0, rel=0.05)
    drafted = [(1.0 / table(b, num_requests=r), true_seconds(r, b, True)) for r, b in ((1, 4), (4, 12), (8, 40))]
    for predicted, actual in drafted:
        assert predicted == pytest.approx(actual, rel=0.10)


def test_snapshot_shape_keeps_consistent_steps_only():
    est = OnlineSpsEstimator()
    est.observe(2, 2, False, 0.02)
    est.observe(2, 6, True, 0.03)
    est.observe(2, 2, True, 0.025)  # a measuring probe: drafted, nothing verified
    assert est.step_times() == {(2, 2): [20.0], (2, 6): [30.0]}


def test_additive_table_validation_still_applies():
    with pytest.raises(ValueError, match="bias_seconds"):
        SpsAdditiveCostTable(bias_seconds=0.0, bs_probes=[1], alpha_seconds=[0.0], m_probes=[1], theta_seconds=[0.0])


def test_drafted_prices_of_a_prior_follow_this_hosts_drafted_steps_at_once():
    """Hosts differ in what a draft costs relative to a plain step, not only in speed: the prior's
    drafted prices get their own scale, and each of the first drafted steps refits the table at
    once, so one probe corrects what the planner believes drafting costs."""
    from sglang_dspark.core.sps_fit import fit_step_table

    prior_rows = [(r, b, b > r, 0.040 + 0.002 * (b - r) + (0.010 if b > r else 0.0))
                  for r in (1, 2, 4) for b in range(r, 8 * r + 1)]
    r, b, d, s = zip(*prior_rows)
    est = OnlineSpsEstimator(prior=SpsTable(*fit_step_table(r, b, s, d)))
    for _ in range(20):  # this host runs plain steps at the prior's speed
        est.observe(1, 1, False, 0.040)
    before = 1.0 / est.table()(2, num_requests=1)
    assert before == pytest.approx(0.052, rel=0.1)
    est.observe(1, 2, True, 0.080)  # but a drafted step costs 2x a plain one here, not 1.3x
    assert est.refit_due  # the first drafted step refits before the 16-step interval is up
    after = 1.0 / est.table()(2, num_requests=1)
    assert after == pytest.approx(0.080, rel=0.15)
    assert est.prior_scale == pytest.approx(1.0, rel=0.05)
    assert est.prior_draft_scale == pytest.approx(0.080 / 0.052, rel=0.1)
    assert 1.0 / est.table()(1, num_requests=1, drafted=False) == pytest.approx(0.040, rel=0.05)


def test_with_a_fit_share_regular_refits_wait_until_the_steps_paid_for_the_last_fit():
    """Refits run on the engine's thread: with `fit_share` a regular refit waits until the steps
    since the last one took 1 / fit_share times as long as that fit. The clock here makes every
    fit take 50 ms against steps of 10 ms: at 1 % a refit would wait 500 steps; it comes after
    MAX_REFIT_DELAY x 16 = 128 (a stalled fit must not hold the table for long), not after 16."""
    now = [0.0]

    def clock():
        now[0] += 0.050  # a fit reads it twice: 50 ms each
        return now[0]

    def refits(**kwargs):
        est = OnlineSpsEstimator(**kwargs)
        for _ in range(1020):
            est.observe(1, 1, False, 0.010)
            est.table()
        return est.refits

    early = 5  # steps 1 (the first table), 2, 4, 8 and 16
    assert refits() == early + (1008 - 16) // 16  # steps 32, 48, ..., 1008
    assert refits(fit_share=0.01, clock=clock) == early + 7  # steps 144, 272, ..., 912
    assert refits(fit_share=0.01, clock=lambda: 0.0) == refits()  # fits that take no time: every 16 steps


def _sparse_noisy_stream(rng: random.Random, steps: int):
    """Steps as a loaded host gives them early on: few, of mixed batch sizes, log-normal noise and
    an occasional 10x stall, a host 1-6x slower than the cost model."""
    slow = rng.uniform(1, 6)
    for _ in range(steps):
        r = rng.randint(1, 8)
        drafted = rng.random() < 0.3
        b = r + (rng.randint(0, 8 * r) if drafted else 0)
        seconds = (0.005 + 0.001 * r + 0.0006 * (b - r) + (0.003 if drafted else 0.0)) * slow
        seconds *= rng.lognormvariate(0, 0.4) * (10 if rng.random() < 0.05 else 1)
        yield r, b, drafted, seconds


@pytest.mark.parametrize("seed", range(6))
def test_every_price_of_every_table_fitted_on_sparse_noisy_steps_is_positive(seed):
    """A fit may leave regions no step measured at a zero base (alpha carried the cost) and a skip
    interpolated between two batch sizes above a step that bends between them: an engine that
    priced such a step divided by zero (the CI run's 'ZeroDivisionError: float division by zero'
    that failed every running request) or planned on a negative step time."""
    rng = random.Random(seed)
    for _ in range(8):
        est = OnlineSpsEstimator()
        for r, b, drafted, seconds in _sparse_noisy_stream(rng, rng.randint(5, 60)):
            est.observe(r, b, drafted, seconds)
            table = est.table()
            for rr in range(1, 9):
                for bb in (rr, rr + 1, 2 * rr, 8 * rr):
                    for d in (True, False):
                        sps = table(bb, num_requests=rr, drafted=d)  # raises ZeroDivisionError on a 0 s price
                        assert 0 < sps < float("inf"), (rr, bb, d, sps, table.to_dict())
                seconds_row = table.step_seconds(rr, 8 * rr)
                assert (seconds_row > 0).all(), (rr, seconds_row, table.to_dict())


def test_the_drafter_skip_between_two_probes_never_prices_a_step_at_zero_or_less():
    """skip(R) is linear between the batch sizes that drafted, the step it is taken from need not
    be: theta flat to B = 4 and steep after it makes the chord of the two capped probe values
    exceed the step at R = 2..6. Every lookup caps it there too, the same in all three of them."""
    additive = SpsAdditiveCostTable(bias_seconds=1e-5, bs_probes=[1, 8], alpha_seconds=[0.0, 0.0],
                                    m_probes=[1, 4, 8], theta_seconds=[0.001, 0.001, 0.008])
    table = SpsTable(additive, [0.99 * 0.00101, 0.99 * 0.00801])
    for r in range(1, 9):
        seconds = 1.0 / table(r, num_requests=r, drafted=False)
        drafted = 1.0 / table(r, num_requests=r, drafted=True)
        assert 0.0099 * drafted <= seconds < drafted, (r, seconds, drafted)  # the probes keep 1 %
        assert table.step_seconds(r, 1)[0] == pytest.approx(seconds, rel=1e-12)
        assert table.seconds_at([r], [r], [False])[0] == pytest.approx(seconds, rel=1e-12)
