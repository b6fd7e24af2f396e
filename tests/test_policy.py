"""The speculation policy on simulated steps: the exploration budget, the guard that stops drafting
where it loses, and the table's source. No model runs; every time is given, so nothing here
depends on this host's speed."""

from __future__ import annotations

import torch

from sglang_dspark.core.sps import SpsTable
from sglang_dspark.engine.guard import DraftingGuard, bucket
from sglang_dspark.engine.policy import MARGIN_MIN_STEPS, DraftPlan, SpeculationPolicy

GAMMA = 4


def run(policy: SpeculationPolicy, steps: int, *, num: int = 1, accept: float = 0.0, undrafted_s: float = 0.040,
        drafter_s: float = 0.020, token_s: float = 0.002, t0: float = 0.0) -> tuple[list, float]:
    """Step the policy `steps` times over `num` requests: drafted steps cost `drafter_s` more and
    `token_s` per verified draft; each verified draft is accepted with probability `accept` (known
    conditional confidences). Returns the plans and the clock."""
    ids = [f"r{i}" for i in range(num)]
    conf = torch.full((num, GAMMA), accept if accept > 0 else 0.01)
    plans, now = [], t0
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        plan = policy.plan(ids)
        lens = policy.allocate(conf, plan) if plan.draft else torch.zeros(num, dtype=torch.int64)
        verified = int(lens.sum())
        seconds = undrafted_s + (drafter_s + token_s * verified if plan.draft else 0.0)
        per_request = []
        for length in lens.tolist():
            n = 0
            while n < length and torch.rand((), generator=gen) < accept:
                n += 1
            per_request.append(n)
        accepted = sum(per_request)
        if plan.draft:
            policy.observe(ids, conf, lens, per_request)
        policy.on_step(plan, num, num + verified, num + accepted, plan.draft, now, now + seconds)
        now += seconds + 0.001
        plans.append(plan)
    return plans, now


def test_without_a_profile_it_starts_target_only_and_probes_a_bounded_share():
    policy = SpeculationPolicy("scheduled", GAMMA, None, learn=True, probe_every=8, probe_max=64)
    plans, _ = run(policy, 600)  # a drafter whose drafts never survive
    drafted = [i for i, p in enumerate(plans) if p.draft]
    assert all(plans[i].probe for i in drafted)  # it never drafts because it pays: it does not
    assert 0 < len(drafted) <= 600 // 8
    late = [i for i in drafted if i >= 300]
    assert len(late) <= 300 // 64 + 1  # once the batch size is explored, one probe in 64 steps
    budgets = [plans[i].capacity for i in drafted]
    # one verified draft measured; drafts at 1 % survival cannot pay for it: the later probes only
    # refresh the confidences and verify the one first-ranked draft (an outcome for the lag
    # calibration), no ladder of larger budgets
    assert budgets[0] == 1 and set(budgets) == {1}
    assert policy.source == "online" and policy.learner.has_drafted


def test_exploration_climbs_the_budgets_while_the_confidences_say_drafting_could_pay():
    """Drafts that survive half the time, on a host where the drafter costs nearly a plain step:
    one verified draft does not pay (1.5 tokens for 1.9x the time), but verifying all four might
    (up to 1.94 tokens), so budgets 1, 2 and 4 all get measured (by probes, or by the planner trying
    one). With drafts that survive 1 % of the time, the same prices stop the climb after budget 1."""
    def measured_budgets(accept: float) -> list[int]:
        policy = SpeculationPolicy("scheduled", GAMMA, None, learn=True, probe_every=4, probe_max=64)
        plans, _ = run(policy, 60, accept=accept, drafter_s=0.034, token_s=0.002)
        return sorted({p.capacity for p in plans if p.draft and p.capacity})

    assert measured_budgets(0.5) == [1, 2, 4]
    assert measured_budgets(0.0) == [1]


def test_a_good_drafter_on_a_learned_table_drafts_most_steps():
    policy = SpeculationPolicy("scheduled", GAMMA, None, learn=True, probe_every=8, probe_max=64)
    plans, _ = run(policy, 400, accept=0.9, drafter_s=0.004, token_s=0.001)
    late = plans[200:]
    assert sum(p.draft and not p.probe for p in late) > 0.9 * len(late)
    assert not policy.guard.blocked_buckets()


def test_the_guard_stops_drafting_that_loses_and_retries_after_cooldown():
    """A table that wrongly says drafting is free, and drafts that never survive: the planner drafts
    every step until the guard sees fewer tokens per second than undrafted steps deliver."""
    free = SpsTable.from_points([1, 64], [25.0, 25.0], max_batch_tokens=64)
    guard = DraftingGuard(min_steps=8, cooldown=100)
    # the lag calibration off: it would stop these drafts itself after one outcome; the guard is under test
    policy = SpeculationPolicy("scheduled", GAMMA, free, learn=False, guard=guard, probe_every=1000, calibrate_lag=False)
    plans, _ = run(policy, 60)
    first_block = next(i for i, p in enumerate(plans) if not p.draft)
    assert 8 <= first_block <= 12  # blocked after min_steps planned drafted steps (the measuring step aside)
    assert guard.blocks == 1 and guard.blocked_buckets() == [1]
    assert not any(p.draft for p in plans[first_block:])
    plans, _ = run(policy, 100)  # the cooldown ends: it tries again, loses again, stops again
    assert any(p.draft for p in plans) and guard.blocks == 2


def test_drafted_steps_the_table_under_prices_are_priced_dearer_until_drafting_stops():
    """The table says a drafted step costs what a plain one does; here it costs 1.5x (plain 40 ms,
    drafted 60 ms), and drafts survive 0.3 of the time: 1 + 0.3 + 0.09 + ... ~ 1.4 tokens a request
    for 1.5x the time loses. Without the guard (it never judges), the planner still stops: after
    MARGIN_MIN_STEPS drafted steps its time margin is 60 / 40 - 1 = 0.5 (plain steps priced right),
    and no budget pays at 1.5x the table's price. Without the margin it drafts every step."""
    free = SpsTable.from_points([1, 64], [25.0, 25.0], max_batch_tokens=64)

    def planned(margin: bool) -> int:
        # the table as it is (no learning: it would learn the price itself), the margin on or off
        policy = SpeculationPolicy("scheduled", GAMMA, free, learn=False, guard=DraftingGuard(min_steps=10**9),
                                   probe_every=1000, calibrate_lag=False, time_margin=margin)
        plans, _ = run(policy, 60, accept=0.3, drafter_s=0.020, token_s=0.0)
        return sum(p.draft and not p.probe for p in plans)

    assert planned(margin=True) <= MARGIN_MIN_STEPS + 1  # the measuring steps, then none
    assert planned(margin=False) >= 55


def test_the_time_margin_is_the_drafted_steps_pricing_error_beside_the_plain_steps():
    """A host that runs every step 20 % slower than the table says needs no margin; drafted steps
    20 % dearer than the table, beside plain steps it prices right, get 0.2; drafted steps cheaper
    than the table get none."""
    table = SpsTable.from_points([1, 64], [25.0, 25.0], max_batch_tokens=64)

    def margin(plain_s: float, drafted_s: float) -> float:
        policy = SpeculationPolicy("scheduled", GAMMA, table, learn=False, time_margin=True)
        plain, drafted = DraftPlan(capacity=0, draft=False), DraftPlan(capacity=1, draft=True)
        now = 0.0
        for i in range(12):
            kind, seconds = (drafted, drafted_s) if i % 2 else (plain, plain_s)
            policy.on_step(kind, 1, 1 + kind.capacity, 1, kind.draft, now, now + seconds)
            now += seconds
        return policy.planner.time_margin

    assert margin(0.048, 0.048) == 0.0  # both 20 % over the table's 40 ms
    assert abs(margin(0.040, 0.048) - 0.2) < 1e-9
    assert margin(0.040, 0.036) == 0.0
    assert SpeculationPolicy("scheduled", GAMMA, table, learn=True).time_margin  # on while learning, by default
    assert not SpeculationPolicy("scheduled", GAMMA, table, learn=False).time_margin


def test_the_guard_keeps_drafting_that_wins():
    guard = DraftingGuard(min_steps=4)
    for _ in range(50):  # 3 tokens in 60 ms against 1 token in 40 ms undrafted
        guard.observe(2, tokens=6, seconds=0.060, undrafted_seconds=0.040, planned_draft=True)
    assert guard.allows(2) and guard.realised_gain(2) > 1.9
    for _ in range(50):  # probes never count
        guard.observe(2, tokens=2, seconds=0.5, undrafted_seconds=0.040, planned_draft=False)
    assert guard.allows(2) and bucket(2) == bucket(3) != bucket(4)


def test_sources():
    table = SpsTable.from_points([1, 8], [20.0, 10.0], max_batch_tokens=40)
    assert SpeculationPolicy("scheduled", GAMMA, table, learn=True).source == "profile+online"
    assert SpeculationPolicy("scheduled", GAMMA, table, learn=True, seeded=True).source == "seeded+online"
    assert SpeculationPolicy("scheduled", GAMMA, table).source == "profile"
    assert SpeculationPolicy("scheduled", GAMMA, None).source == "flat"
    assert SpeculationPolicy("full", GAMMA, None, learn=True).learner is None  # full mode verifies everything


def test_a_seeded_prior_times_plain_steps_first_so_one_probe_prices_drafting_on_this_host():
    """The prior (another host) prices a drafted step at 1.3x a plain one; here it costs 2x or more.
    A learner times `warmup_steps` plain steps, then probes once; the probe's drafted price then
    stands against this host's plain price, and no draft is planned on the prior's cheaper shape.
    Probing at once instead (warmup 0), the probe alone scales both prices alike and the planner
    bets on the prior's shape. (Lag calibration off: its own correction would hide what the warmup
    decides.)"""
    from sglang_dspark.core.sps_fit import fit_step_table

    rows = [(r, b, b > r, 0.040 * r ** 0.5 + (0.010 + 0.002 * (b - r) if b > r else 0.0))
            for r in (1, 2, 4) for b in range(r, GAMMA * r + 1)]
    r, b, d, s = zip(*rows)
    prior = SpsTable(*fit_step_table(r, b, s, d))

    def planned_drafts(warmup: int) -> tuple[list, int]:
        policy = SpeculationPolicy("scheduled", GAMMA, prior, learn=True, seeded=True, warmup_steps=warmup,
                                   calibrate_lag=False)
        plans, _ = run(policy, 40, accept=0.45, drafter_s=0.030, token_s=0.010)
        return plans, sum(p.draft and not p.probe for p in plans)

    plans, planned = planned_drafts(8)
    assert not any(p.draft for p in plans[:8]) and plans[8].probe
    assert planned == 0
    assert planned_drafts(0)[1] > 0


def test_batch_sizes_that_vary_within_a_bucket_do_not_restart_the_probe_ladder():
    """Under load R wanders (16, 15, 13, ...): a batch size never drafted before is no reason to
    measure budget 1 again when a neighbour in its bucket already showed that no budget can pay.
    Drafts that never survive, on a host where a drafted step costs 1.5x a plain one: after the
    first measurement the probes back off as they do at one fixed R (one in `probe_max` steps),
    and each later probe only refreshes the confidences, instead of measuring budget 1 again at
    every new R."""
    policy = SpeculationPolicy("scheduled", GAMMA, None, learn=True, probe_every=8, probe_max=64)
    gen = torch.Generator().manual_seed(1)
    plans, now = [], 0.0
    for _ in range(600):
        num = int(torch.randint(8, 16, (), generator=gen))  # one bucket: 8-15
        ids = [f"r{i}" for i in range(num)]
        plan = policy.plan(ids)
        lens = policy.allocate(torch.full((num, GAMMA), 0.01), plan) if plan.draft else torch.zeros(num, dtype=torch.int64)
        if plan.draft:
            policy.observe(ids, torch.full((num, GAMMA), 0.01), lens, [0] * num)
        seconds = 0.040 * (1.5 if plan.draft else 1.0) + 0.001 * int(lens.sum())
        policy.on_step(plan, num, num + int(lens.sum()), num, plan.draft, now, now + seconds)
        now += seconds + 0.001
        plans.append(plan)
    probes = [p for p in plans if p.probe]
    assert len(probes) >= 8 and all(p.capacity == 1 for p in probes)  # budget 1; no ladder beyond it
    # measured once, not once per R: a new R does not restart exploring at probe_every's pace
    late = [p for p in plans[300:] if p.probe]
    assert len(late) <= 300 // 64 + 1
    assert sum(p.draft for p in plans[300:]) <= 300 // 64 + 1


def test_the_exploration_question_is_answered_once_per_batch_size_not_on_every_plain_step(monkeypatch):
    """Whether a bucket still needs exploring scans the learner's samples (about 1 ms): it is asked
    again only when the batch size or the bucket's drafted steps change, not on each plain step of
    a probe interval. A drafter that never survives: the probes back off to `probe_max`, and the
    question is asked about once per probe, not once per undrafted step."""
    policy = SpeculationPolicy("scheduled", GAMMA, None, learn=True, probe_every=8, probe_max=64)
    calls = []
    original = SpeculationPolicy._probe_budget
    monkeypatch.setattr(SpeculationPolicy, "_probe_budget", lambda self, ids: calls.append(len(ids)) or original(self, ids))
    plans, _ = run(policy, 400, num=4)
    probes = sum(p.probe for p in plans)
    assert probes >= 4 and policy._probe_interval == 64  # backed off: exploration said no budget pays
    assert len(calls) <= 2 * probes + 2, (len(calls), probes)


def test_each_step_is_priced_by_the_table_in_force_when_it_ran():
    """on_step memoises the table's step prices; a refit replaces the table and with it every price:
    what a step returns is always 1 / SPS of the table the planner read for that step."""
    table = SpsTable.from_points([1, 8], [20.0, 10.0], max_batch_tokens=40)
    policy = SpeculationPolicy("scheduled", GAMMA, table, learn=True)
    tables, now = set(), 0.0
    for step in range(60):
        num = 1 + step % 3
        seconds = 0.030 * num  # this host is slower than the profile: the learner refits
        expected = 1.0 / policy.sps(num, num_requests=num, drafted=False)
        tables.add(id(policy.sps))
        predicted = policy.on_step(policy.plan([f"r{i}" for i in range(num)]), num, num, num, False, now, now + seconds)
        assert predicted == expected, step
        now += seconds + 0.001
    assert len(tables) > 2  # the table was replaced on the way


def test_a_step_drafts_only_what_it_can_verify_and_full_mode_the_whole_block():
    """Probes cut as planned steps do: the price a probe measures for a budget is a planned step's."""
    from sglang_dspark.engine.policy import DraftPlan

    policy = SpeculationPolicy("scheduled", GAMMA, SpsTable.from_points([1, 8], [20.0, 10.0], max_batch_tokens=40))
    assert [policy.draft_block(DraftPlan(capacity=c, draft=True)) for c in (1, 2, 3, 9)] == [1, 2, 3, GAMMA]
    assert policy.draft_block(DraftPlan(capacity=2, draft=True, probe=True)) == 2
    assert policy.draft_block(DraftPlan(capacity=1, draft=True, verify_all=True)) == GAMMA


def test_a_short_block_leaves_what_a_request_said_of_later_positions():
    """A cut block's confidences cover its b positions only; the planner's row for the request keeps its
    last word on the rest (the prior before it has one), so a step that drafted 1 never reads as a
    drafter whose later drafts cannot survive."""
    from sglang_dspark.core.schedule import AsyncPlanner

    planner = AsyncPlanner(SpsTable.from_points([1, 8], [20.0, 10.0], max_batch_tokens=40), GAMMA, lag=1)
    planner.observe(["a", "b"], torch.tensor([[0.9, 0.8, 0.7, 0.6], [0.5, 0.4, 0.3, 0.2]]))
    planner.observe(["a", "b", "c"], torch.tensor([[0.3], [0.1], [0.2]]))
    rows = planner._lagged_conf(["a", "b", "c"])
    assert torch.allclose(rows, torch.tensor([[0.3, 0.8, 0.7, 0.6], [0.1, 0.4, 0.3, 0.2], [0.2, 1.0, 1.0, 1.0]]))
