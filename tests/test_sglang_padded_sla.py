"""The plugin's SLA decision prices the CUDA graph SGLang runs a budget as: checked against a brute
force over every budget, priced with SGLang's own `round_up_grid` over the captured sizes and
SGLang's own `SpsAdditiveCostTable.step_time`, on a few hundred random inputs; and through SGLang's
own planner at high R, where the tier holds the budget below the maximum."""

from __future__ import annotations

import random

import pytest
import torch

pytestmark = pytest.mark.sglang

GAMMA = 7


@pytest.fixture
def plugin(monkeypatch, tmp_path):
    """The plugin configured for the interactive tier of a profile whose theta is not flat."""
    from test_profiles import make_profile

    from sglang_dspark.sglang_plugin import settings

    from sglang_dspark.core.sps import SpsAdditiveCostTable

    profile = make_profile(engine="sglang", additive=True, gamma=GAMMA)
    steep = SpsAdditiveCostTable(bias_seconds=0.004, bs_probes=[1, 4, 16], alpha_seconds=[0.0, 0.001, 0.003],
                                 m_probes=[1, 8, 32, 128], theta_seconds=[0.0, 0.002, 0.006, 0.024])
    profile = profile.replaced(sps=profile.sps.model_copy(update={"additive": steep}))  # theta rises to B = 128
    path = tmp_path / "sla.yaml"
    profile.save(path)

    def configure(graph_tokens: list[int] | None, tier: str = "interactive"):
        monkeypatch.setenv(settings.PROFILE_ENV, str(path))
        monkeypatch.setenv(settings.TIER_ENV, tier)
        if graph_tokens is None:
            monkeypatch.delenv(settings.GRAPH_TOKENS_ENV, raising=False)
        else:
            monkeypatch.setenv(settings.GRAPH_TOKENS_ENV, ",".join(map(str, graph_tokens)))
        monkeypatch.delenv(settings.LEARNING_ENV, raising=False)
        settings.settings.cache_clear()
        settings.profile_table.cache_clear()
        return profile

    yield configure
    settings.settings.cache_clear()
    settings.profile_table.cache_clear()


def _brute_force(survival: torch.Tensor, table, sizes: list[int], tok_s: float, eps: float) -> int:
    """Every budget k: the top k candidates (survival desc, position asc, request asc) verified,
    the step priced at the graph SGLang runs; the best feasible k, else the fastest slowest request."""
    from sglang.srt.speculative.ragged_verify import round_up_grid

    r = survival.shape[0]
    cands = sorted(((-float(survival[i, j]), j, i) for i in range(r) for j in range(GAMMA)
                    if float(survival[i, j]) >= eps))
    best = None
    for k in range(len(cands) + 1):
        tokens = [1.0] * r
        for neg, _, i in cands[:k]:
            tokens[i] += -neg
        graph = round_up_grid(min(r + k, r * (GAMMA + 1)), sizes)
        seconds = table.step_time(num_reqs=r, budget=graph - r)
        key = (min(tokens) / seconds >= tok_s, sum(tokens) / seconds if min(tokens) / seconds >= tok_s else
               min(tokens) / seconds)
        if best is None or key > best[0]:
            best = (key, k)
    return best[1]


def test_the_sla_decision_is_the_tier_feasible_optimum_over_sglangs_padded_graph_sizes(plugin):
    from sglang.srt.speculative.dspark_components import dspark_planner as P
    from sglang.srt.speculative.dspark_components.dspark_sps import SpsAdditiveCostTable

    from sglang_dspark.sglang_plugin.planner import around_budget

    rng = random.Random(7)
    gen = torch.Generator().manual_seed(7)
    cfg = P.DSparkScheduleConfig(gamma=GAMMA)
    original = getattr(P.compute_verify_token_budget, "__wrapped__", P.compute_verify_token_budget)
    padded_differs = 0
    for case in range(300):
        r = rng.randint(1, 12)
        capture_bs = sorted(set(rng.sample(range(1, 17), rng.randint(1, 6))) | {rng.randint(r, 16)})
        sizes = [bs * (GAMMA + 1) for bs in capture_bs]
        tier = rng.choice(["interactive", "batch"])
        profile = plugin(sizes, tier)
        table = SpsAdditiveCostTable(**profile.sps.additive.model_dump())
        survival = torch.cumprod(torch.rand(r, GAMMA, generator=gen) ** 0.3, dim=1)
        got = around_budget(original, history_survival_probs=survival, sps_table=table, cfg=cfg).budget
        want = _brute_force(survival, table, sizes, profile.tier(tier).tok_s_per_user, cfg.survival_eps)
        assert got == want, (case, r, capture_bs, tier)
        plugin(None, tier)
        unpadded = around_budget(original, history_survival_probs=survival, sps_table=table, cfg=cfg).budget
        padded_differs += unpadded != got
    assert padded_differs > 10  # pricing R + k instead of the graph would have decided otherwise


def test_at_high_r_sglangs_planner_returns_a_budget_below_the_maximum(plugin, monkeypatch):
    from sglang.srt.plugins.hook_registry import HookType, _wrap_fn
    from sglang.srt.speculative.dspark_components import dspark_planner as P
    from sglang.srt.speculative.dspark_components.dspark_sps import SpsAdditiveCostTable

    from sglang_dspark.sglang_plugin.planner import around_budget

    r = 16
    profile = plugin([bs * (GAMMA + 1) for bs in (1, 2, 4, 8, 16)], "interactive")
    original = getattr(P.compute_verify_token_budget, "__wrapped__", P.compute_verify_token_budget)
    monkeypatch.setattr(P, "compute_verify_token_budget", _wrap_fn(original, around_budget, HookType.AROUND))
    table = SpsAdditiveCostTable(**profile.sps.additive.model_dump())
    caller = P.HostConfidenceBudgetPlanner(sps_table=table, cfg=P.DSparkScheduleConfig(gamma=GAMMA), model_runner=None,
                                           relay_lag_steps=2)
    ones = torch.ones(r, dtype=torch.int64)
    confidence = torch.full((r, GAMMA), 0.6)
    budget = caller.compute_budget(confidence=confidence, generation=ones, current_generation=ones,
                                   req_pool_indices_cpu=torch.arange(r))
    assert 0 < budget < r * GAMMA  # some drafts pay at R = 16, not all of them
