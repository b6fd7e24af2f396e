"""The planner reads confidences `lag` drafted steps old; their promise is calibrated against the
drafts that were then verified (core/lag_calibration.py). A drafter whose confidences say 0.9 while
its drafts survive 0.3 of the time (the winner's curse of a lagged row) must get a capacity sized
for 0.3, and the predicted survivors per drafted step must match the realized ones."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_dspark.core.lag_calibration import LagCalibration
from sglang_dspark.core.schedule import AsyncPlanner
from sglang_dspark.core.sps import SpsAdditiveCostTable, SpsTable

GAMMA = 7
# a plain step of 10 ms, each verified draft 1.5 ms more: a draft pays when it survives > 15 % as
# the step's only token would (1 token in 10 ms), so 0.9-confident drafts pay and 0.3 ones barely
TABLE = SpsTable(SpsAdditiveCostTable(bs_probes=[1, 8], m_probes=[1, 64], bias_seconds=0.004,
                                      alpha_seconds=[0.006, 0.012], theta_seconds=[0.0, 0.0945]))


def drive(planner: AsyncPlanner, steps: int, *, claimed: float, accept: float, num: int = 2, seed: int = 0):
    """Steps of `num` requests whose drafter claims `claimed` per draft while each draft survives
    with `accept` until the first rejection. Returns per drafted step (predicted survivors from the
    lagged rows the capacity read, corrected as the planner reads them; realized survivors)."""
    rng = np.random.default_rng(seed)
    ids = [f"r{i}" for i in range(num)]
    conf = torch.full((num, GAMMA), claimed)
    outcomes = []
    for _ in range(steps):
        capacity = planner.capacity(ids)
        lens = planner.allocate(conf, max(capacity, num))  # always verify something: every step teaches
        predicted = planner._survival(ids)
        accepted = [int(np.argmin(np.append(rng.random(n) < accept, False))) for n in lens.tolist()]
        outcomes.append((float(sum(predicted[i, :n].sum() for i, n in enumerate(lens.tolist()))), sum(accepted)))
        planner.verified(ids, lens, accepted)
        planner.observe(ids, conf)
    return outcomes


def test_a_lagged_row_that_over_promises_is_corrected_to_what_survives():
    planner = AsyncPlanner(TABLE, GAMMA, lag=2, calibrate_lag=True)
    outcomes = drive(planner, 1200, claimed=0.9, accept=0.3)
    late = outcomes[200:]  # 1,000 steps after the correction has settled (about 600 realized drafts)
    predicted, realized = sum(p for p, _ in late), sum(r for _, r in late)
    assert realized > 0 and abs(predicted - realized) / realized <= 0.10, (predicted, realized)
    raw = AsyncPlanner(TABLE, GAMMA, lag=2)  # the same history, uncorrected: 0.9 per draft as read
    drive(raw, 3, claimed=0.9, accept=0.3)
    assert raw.capacity(["r0", "r1"]) > planner.capacity(["r0", "r1"])


def test_without_the_correction_the_same_stream_is_over_promised():
    """The guard of the test above: uncorrected, the lagged rows promise about three times what survives."""
    planner = AsyncPlanner(TABLE, GAMMA, lag=2)
    late = drive(planner, 200, claimed=0.9, accept=0.3)[50:]
    predicted, realized = sum(p for p, _ in late), sum(r for _, r in late)
    assert predicted > 2 * realized


def test_a_weak_drafter_is_sized_at_nothing_and_an_honest_one_keeps_its_capacity():
    weak = AsyncPlanner(TABLE, GAMMA, lag=2, calibrate_lag=True)
    drive(weak, 300, claimed=0.9, accept=0.05)
    assert weak.capacity(["r0", "r1"]) == 0
    honest = AsyncPlanner(TABLE, GAMMA, lag=2, calibrate_lag=True)
    drive(honest, 300, claimed=0.9, accept=0.9)  # its confidences were right: little to correct
    as_read = AsyncPlanner(TABLE, GAMMA, lag=2)
    drive(as_read, 3, claimed=0.9, accept=0.9)
    assert as_read.capacity(["r0", "r1"]) >= 10 and abs(honest.capacity(["r0", "r1"]) - as_read.capacity(["r0", "r1"])) <= 2


def test_without_verified_steps_the_correction_is_the_identity():
    calibrated, plain = AsyncPlanner(TABLE, GAMMA, lag=1, calibrate_lag=True), AsyncPlanner(TABLE, GAMMA, lag=1)
    conf = torch.rand(3, GAMMA, generator=torch.Generator().manual_seed(0))
    for planner in (calibrated, plain):
        planner.observe(["a", "b", "c"], conf)
    assert np.array_equal(calibrated._survival(["a", "b", "c"]), plain._survival(["a", "b", "c"]))
    assert calibrated.capacity(["a", "b", "c"]) == plain.capacity(["a", "b", "c"])


def test_rows_are_grouped_by_age_and_each_group_learns_alone():
    cal = LagCalibration(GAMMA, lag=2)
    assert [cal.group(a) for a in (None, 2, 3, 50)] == [0, 1, 2, 2]
    for _ in range(50):  # 3 drafts verified, the first survives: positions 1 and 2 reached, one success
        cal.observe(1, np.full(GAMMA, 0.8), verify_len=3, accepted=1)
    assert cal.reached[1].tolist() == [50, 50, 0, 0, 0, 0, 0]
    assert torch.equal(cal.coefficients()[0], torch.tensor([0.0, 1.0]))  # the prior learned nothing
    assert torch.equal(cal.coefficients()[2], cal.coefficients()[1])  # older rows: the chain's fit until their own
    conf = torch.full((3, GAMMA), 0.8)
    corrected = cal.correct(conf, [1, 0, 2])
    assert corrected[0].tolist() == pytest.approx([0.5] * GAMMA, abs=0.03)  # half of them survived
    assert torch.equal(corrected[1], conf[1])
    assert torch.equal(corrected[2], corrected[0])
    for _ in range(200):  # older rows that turn out better than the chain's: their group leaves the chain's fit
        cal.observe(2, np.full(GAMMA, 0.8), verify_len=2, accepted=2)
    assert cal.correct(conf, [2])[0, 0] > 0.9 and cal.correct(conf, [1])[0, 0] == corrected[0, 0]


def test_a_lagged_row_that_under_promises_is_read_up_to_what_survives():
    """Rows that say 0.1 while their drafts survive 0.6 of the time: read as they are, a step with
    them never drafts where drafting pays. The fit reads them up, and the predicted survivors per
    drafted step match the realized ones."""
    planner = AsyncPlanner(TABLE, GAMMA, lag=2, calibrate_lag=True)
    outcomes = drive(planner, 1200, claimed=0.1, accept=0.6)
    late = outcomes[200:]
    predicted, realized = sum(p for p, _ in late), sum(r for _, r in late)
    assert realized > 0 and abs(predicted - realized) / realized <= 0.10, (predicted, realized)
    as_read = AsyncPlanner(TABLE, GAMMA, lag=2)
    drive(as_read, 3, claimed=0.1, accept=0.6)
    assert as_read.capacity(["r0", "r1"]) == 0 < planner.capacity(["r0", "r1"])


def test_a_stale_low_row_drafts_again_where_the_chain_says_drafts_pay():
    """A request whose last row said little has not drafted since, so its row ages into the older
    group. Read as it is it would never draft again (nothing replaces the row); it is read through
    the chain's fit, which says what such rows have been worth."""
    planner = AsyncPlanner(TABLE, GAMMA, lag=1, calibrate_lag=True)
    drive(planner, 300, claimed=0.1, accept=0.6, num=1)
    planner.observe(["r0"], torch.full((1, GAMMA), 0.02))  # a low row, then steps that do not draft
    for _ in range(5):
        planner.capacity(["r0"])
    assert planner._groups(["r0"]) == [2]
    assert planner.capacity(["r0"]) > 0


def test_a_row_that_promises_more_is_worth_no_more_when_its_drafts_survive_alike():
    """The winner's curse the planner meets: rows of 0.99 and rows of 0.4 whose drafts both survive
    30 % of the time are both read as 0.3, so the high rows no longer buy a step."""
    cal, rng = LagCalibration(GAMMA, lag=2), np.random.default_rng(0)
    for i in range(400):
        x = 0.99 if i % 2 else 0.4
        accepted = int(np.argmin(np.append(rng.random(GAMMA) < 0.3, False)))
        cal.observe(1, np.full(GAMMA, x), verify_len=GAMMA, accepted=accepted)
    corrected = cal.correct(torch.tensor([[0.99] * GAMMA, [0.4] * GAMMA]), [1, 1])
    assert corrected[:, 0].tolist() == pytest.approx([0.3, 0.3], abs=0.05)
    assert cal.coefficients()[1, 1] < 0.15  # the lagged confidence says next to nothing


def test_pseudo_drafts_must_be_positive():
    with pytest.raises(ValueError, match="pseudo_drafts"):
        LagCalibration(GAMMA, lag=2, pseudo_drafts=0)


class _NeverStops:
    """A guard that allows every draft: the policy's planning alone is under test."""
    blocks = 0

    def allows(self, num_requests: int) -> bool:
        return True

    def observe(self, *args, **kwargs) -> None:
        pass


def _planned_drafts(calibrate_lag: bool, steps: int = 300) -> int:
    """Planned drafted steps of a scheduled policy whose drafter claims 0.9 and delivers 0.05."""
    from sglang_dspark.engine.policy import SpeculationPolicy

    policy = SpeculationPolicy("scheduled", GAMMA, TABLE, guard=_NeverStops(), calibrate_lag=calibrate_lag)
    ids, conf, now, planned = ["r0", "r1"], torch.full((2, GAMMA), 0.9), 0.0, 0
    rng = np.random.default_rng(0)
    for _ in range(steps):
        plan = policy.plan(ids)
        lens = policy.allocate(conf, plan) if plan.draft else torch.zeros(2, dtype=torch.int64)
        accepted = [int(np.argmin(np.append(rng.random(n) < 0.05, False))) for n in lens.tolist()]
        if plan.draft:
            planned += not plan.probe
            policy.observe(ids, conf, lens, accepted)
        policy.on_step(plan, 2, 2 + int(lens.sum()), 2 + sum(accepted), plan.draft, now, now + 0.012)
        now += 0.013
    return planned


def test_the_engines_policy_feeds_the_calibration_and_stops_planning_losing_drafts():
    assert _planned_drafts(calibrate_lag=False) > 200  # the lagged 0.9 keeps promising
    assert _planned_drafts(calibrate_lag=True) < 30


def _recovers(steps: int = 1500, unlucky: int = 10) -> int:
    """Planned drafted steps in the last third of a run whose first `unlucky` drafted steps all fail,
    though the drafter's drafts survive 0.6 of the time from then on (its rows always say 0.3)."""
    from sglang_dspark.engine.policy import SpeculationPolicy

    policy = SpeculationPolicy("scheduled", GAMMA, TABLE, guard=_NeverStops(), probe_every=8, probe_max=32)
    ids, conf, now, rng = ["r0"], torch.full((1, GAMMA), 0.3), 0.0, np.random.default_rng(0)
    drafted = late_planned = 0
    for step in range(steps):
        plan = policy.plan(ids)
        lens = policy.allocate(conf, plan) if plan.draft else torch.zeros(1, dtype=torch.int64)
        accept = 0.0 if drafted < unlucky else 0.6
        accepted = [int(np.argmin(np.append(rng.random(n) < accept, False))) for n in lens.tolist()]
        if plan.draft:
            drafted += int(lens.sum()) > 0
            late_planned += step >= 2 * steps // 3 and not plan.probe
            policy.observe(ids, conf, lens, accepted)
        policy.on_step(plan, 1, 1 + int(lens.sum()), 1 + sum(accepted), plan.draft, now, now + 0.012)
        now += 0.013
    return late_planned


def test_a_few_unlucky_first_outcomes_do_not_stop_drafting_for_good():
    """After its first drafts all failed, the fit says the rows are worth too little to draft, so
    the planner stops; its probes still verify one draft each, and those outcomes bring the fit
    back to what the drafts are worth, so drafting resumes. Probes that verified nothing would
    leave the fit where the bad start put it."""
    assert _recovers() > 100  # of 500 steps; with probes that verify nothing: 0
