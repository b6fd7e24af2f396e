"""Statistical losslessness: speculative output must follow the target distribution exactly.

Each test draws 1e5+ seeded trials in a Markov toy world whose exact target distribution is known,
and applies Pearson's chi-square test at false-alarm rate ALPHA = 1e-3. Each also runs a
deliberately biased variant through the same harness and requires it to be rejected, so every
test demonstrably has power against the bug it guards.
"""

import torch
from markov_world import ALPHA, MarkovWorld, chi_square_pvalue, generate, joint_exact

from sglang_dspark.core.schedule import AsyncPlanner, allocate_top_k, plan_verify_lens
from sglang_dspark.core.sps import SpsTable
from sglang_dspark.core.verify import verify_chain, verify_chain_greedy

TRIALS = 100_000
LENGTH = 3  # outcomes are the first 3 emitted tokens: vocab**3 cells


def _jagged_table(num_tokens: int, seed: int) -> SpsTable:
    g = torch.Generator().manual_seed(seed)
    sps = 1.0 / (1.0 + 0.08 * torch.arange(num_tokens) + 0.3 * torch.rand(num_tokens, generator=g))
    return SpsTable.from_points(list(range(1, num_tokens + 1)), sps.tolist())


def per_distinct_group(plan_one):
    """Plan each distinct group of requests once. The planners are deterministic functions of
    their input (property-tested), so this only saves time; every group still gets its plan."""

    def plan(step, conf):
        distinct, inverse = torch.unique(conf.reshape(conf.shape[0], -1), dim=0, return_inverse=True)
        lens = torch.stack([plan_one(row.view(conf.shape[1], -1)) for row in distinct])
        return lens[inverse]

    return plan


def _pvalue(world, plan, verify=verify_chain, batch=4, seed=7):
    outcomes = generate(world, trials=TRIALS, batch=batch, length=LENGTH, plan=plan, verify=verify, seed=seed)
    return chi_square_pvalue(outcomes, joint_exact(world, 0, LENGTH))


def test_chain_verification_full_and_random_cuts_is_lossless():
    world = MarkovWorld(vocab=4, gamma=4, seed=1)
    g = torch.Generator().manual_seed(3)
    random_cuts = lambda step, conf: torch.randint(0, world.gamma + 1, conf.shape[:2], generator=g)  # noqa: E731
    full = lambda step, conf: torch.full(conf.shape[:2], world.gamma)  # noqa: E731
    assert _pvalue(world, full) > ALPHA
    assert _pvalue(world, random_cuts) > ALPHA


def test_chain_verification_detects_misreported_draft_probs():
    # The classic bug: acceptance uses a distribution other than the one the draft was sampled
    # from (e.g. the backbone's, without the Markov bias). The harness must catch it.
    world = MarkovWorld(vocab=4, gamma=4, seed=1)
    full = lambda step, conf: torch.full(conf.shape[:2], world.gamma)  # noqa: E731

    def wrong_q(tokens, q, p, lens, generator):
        return verify_chain(tokens, torch.full_like(q, 1.0 / world.vocab), p, lens, generator=generator)

    assert _pvalue(world, full, verify=wrong_q) < ALPHA


def _markov_leak_world():
    # Confidence after token 0 is high, after token 1 nearly zero: a scheduler that looks at
    # c_2(x_1) before deciding on x_1 favours x_1 = 0 (docs/ALGORITHM.md, scheduling: the early-stop example, generalised).
    return MarkovWorld(vocab=3, gamma=3, seed=5, conf=[0.95, 0.0, 0.5])


def _leaky_table():
    return SpsTable.from_points([1, 2, 3, 4], [1.0, 0.5, 0.45, 0.44])


def test_algorithm1_cuts_with_markov_confidence_are_lossless():
    world, table = _markov_leak_world(), _leaky_table()
    plan = per_distinct_group(lambda c: plan_verify_lens(c, table, early_stop=True))
    assert _pvalue(world, plan, batch=1) > ALPHA
    # Also in a two-request batch with a jagged curve, where cuts land everywhere.
    world2, table2 = MarkovWorld(vocab=3, gamma=3, seed=2), _jagged_table(16, seed=4)
    plan2 = per_distinct_group(lambda c: plan_verify_lens(c, table2, early_stop=True))
    assert _pvalue(world2, plan2, batch=2) > ALPHA


def test_global_search_without_early_stop_is_detected_as_biased():
    world, table = _markov_leak_world(), _leaky_table()
    plan = per_distinct_group(lambda c: plan_verify_lens(c, table, early_stop=False))
    assert _pvalue(world, plan, batch=1) < ALPHA


def _async_plan(world, table, allocate):
    """AsyncPlanner over groups of requests: capacity from lagged history, allocation now."""
    planners: dict[int, AsyncPlanner] = {}

    def plan(step, conf):
        lens = []
        for group, c in enumerate(conf):
            planner = planners.setdefault(group, AsyncPlanner(table, world.gamma, lag=1))
            ids = list(range(c.shape[0]))
            capacity = planner.capacity(ids)
            lens.append(allocate(planner, c, capacity))
            planner.observe(ids, c)
        return torch.stack(lens)

    return plan


def test_async_planner_allocation_is_lossless():
    world, table = MarkovWorld(vocab=4, gamma=4, seed=3, conf=[0.9, 0.05, 0.6, 0.3]), _jagged_table(24, seed=8)
    plan = _async_plan(world, table, lambda planner, c, cap: planner.allocate(c, cap))
    assert _pvalue(world, plan, batch=4) > ALPHA


def test_async_allocation_that_peeks_at_next_confidence_is_detected():
    # Bias: rank draft j by the survival of draft j+1, which depends on the sample x_j itself.
    world, table = MarkovWorld(vocab=4, gamma=4, seed=3, conf=[0.9, 0.05, 0.6, 0.3]), _jagged_table(24, seed=8)

    def peeking(planner, conf, capacity):
        shifted = torch.cat([conf[:, 1:], torch.ones_like(conf[:, :1])], 1)
        return allocate_top_k(torch.cumprod(shifted, 1), capacity)

    plan = _async_plan(world, table, peeking)
    assert _pvalue(world, plan, batch=4) < ALPHA


def _appendix_a_first_token_freq(early_stop: bool, trials: int = 100_000) -> float:
    """Paper appendix A: a_1 = 0.8, c_2(A) = 0.9, c_2(B) = 0, SPS(1,2,3) = (1, 0.5, 0.45),
    p_t = (0.7, 0.3), p_d = (0.5, 0.5). Returns the frequency of A as first emitted token."""
    g = torch.Generator().manual_seed(11)
    table = SpsTable.from_points([1, 2, 3], [1.0, 0.5, 0.45])
    p_t, p_d = torch.tensor([0.7, 0.3]), torch.tensor([0.5, 0.5])
    x = torch.multinomial(p_d.expand(trials, 2), 2, replacement=True, generator=g)
    conf = torch.stack([torch.full((trials,), 0.8), torch.where(x[:, 0] == 0, 0.9, 0.0)], 1)
    lens = per_distinct_group(lambda c: plan_verify_lens(c, table, early_stop=early_stop))(0, conf.unsqueeze(1)).view(-1)
    n_acc, nxt = verify_chain(x, p_d.expand(trials, 2, 2), p_t.expand(trials, 3, 2), lens, generator=g)
    first = torch.where(n_acc > 0, x[:, 0], nxt)
    return float((first == 0).double().mean())


def test_paper_appendix_a_example():
    # Binomial standard error at 1e5 trials is about 0.0015; 0.006 is four of them.
    assert abs(_appendix_a_first_token_freq(early_stop=True) - 0.70) < 0.006
    assert abs(_appendix_a_first_token_freq(early_stop=False) - 0.85) < 0.006


def test_greedy_verification_reproduces_target_argmax_chain():
    g = torch.Generator().manual_seed(0)
    R, G, V = 64, 5, 11
    logits = torch.randn(R, G + 1, V, generator=g)
    argmax = logits.argmax(-1)
    drafts = torch.where(torch.rand(R, G, generator=g) < 0.7, argmax[:, :G], torch.randint(0, V, (R, G), generator=g))
    lens = torch.randint(0, G + 1, (R,), generator=g)
    n_acc, nxt = verify_chain_greedy(drafts, logits, lens)
    for r in range(R):  # reference: the plain left-to-right definition
        k = 0
        while k < lens[r] and drafts[r, k] == argmax[r, k]:
            k += 1
        assert n_acc[r] == k and nxt[r] == argmax[r, k]
