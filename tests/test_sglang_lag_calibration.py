"""The lag calibration through the plugin (issue 59), on SGLang 0.5.23's own planner: its
`DSparkVerifyPlanner` / `HostConfidenceBudgetPlanner` lag the rows and call the hooked
`compute_verify_token_budget`, its top-k picks the verify lengths, its `DsparkStepObservers` (hooked)
observes each step, in both scheduler modes. A drafter whose rows claim 0.9 per draft while each draft
survives 0.3 of the time must be budgeted for 0.3, and the survivors its corrected rows predict per
drafted step must match the realized ones; SGLang's all-ones prior is calibrated the same way; with
the calibration off the decision is SGLang's own."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.sglang

GAMMA, R = 7, 8
CLAIMED, SURVIVES = 0.9, 0.3


def _table():
    """A plain step of 8 requests takes 18 ms and each verified draft 0.3 ms more: a first draft that
    survives 0.3 of the time pays, a second (0.09) does not, while rows read as 0.9 buy every draft."""
    from sglang.srt.speculative.dspark_components.dspark_sps import SpsAdditiveCostTable

    return SpsAdditiveCostTable(bias_seconds=0.004, bs_probes=[1, 8], alpha_seconds=[0.006, 0.012],
                                m_probes=[1, 64], theta_seconds=[0.0, 0.0189])


READ: list = []  # (the matrix SGLang's decision read inside the hook, the decision), newest last


@pytest.fixture
def hooked(monkeypatch, plugin_env):
    """SGLang's budget function wrapped by the plugin's hook as its registry wraps it (the matrix the
    hook hands SGLang's own decision recorded in READ); the plugin configured by `configure(**env)`,
    which returns SGLang's unwrapped function."""
    import functools

    import sglang.srt.runtime_context as rc
    from sglang.srt.plugins.hook_registry import HookType, _wrap_fn
    from sglang.srt.speculative.dspark_components import dspark_planner as P

    from sglang_dspark.sglang_plugin import guard, observer, settings
    from sglang_dspark.sglang_plugin.planner import around_budget

    original = getattr(P.compute_verify_token_budget, "__wrapped__", P.compute_verify_token_budget)

    @functools.wraps(original)
    def recorded(**kw):
        decision = original(**kw)
        READ.append((kw["history_survival_probs"], decision))
        del READ[:-4]
        return decision

    READ.clear()
    monkeypatch.setattr(P, "compute_verify_token_budget", _wrap_fn(recorded, around_budget, HookType.AROUND))
    monkeypatch.setattr(rc, "get_parallel", lambda: SimpleNamespace(attn_tp_rank=0, attn_tp_size=1))
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.delenv(settings.LAG_CALIBRATION_ENV, raising=False)
    monkeypatch.setattr(observer, "_OBSERVER", None)
    guard.reset()

    def configure(**env):
        plugin_env(**env)
        return original

    yield configure
    guard.reset()


class Stream:
    """R requests on SGLang's compact planner (tests/sglang_sim.py) whose rows claim `claimed` per
    draft while each draft survives `survives` until the first rejection. `overlap`: the budget comes
    as SGLang's overlap scheduler computes it (`_budget_from_resolved` on rows its relay lagged two
    steps; the planner carries none), else as without it (`compute_budget_sync`, the planner carrying
    the rows two steps). `fresh=False`: every request's generation moves each step, so SGLang reads
    every row as its all-ones prior."""

    def __init__(self, tmp_path, *, overlap: bool, fresh: bool = True, claimed: float = CLAIMED,
                 survives: float = SURVIVES, seed: int = 0):
        from sglang_sim import SglangDspark
        from test_profiles import make_profile

        from sglang_dspark.sglang_plugin import observer

        table = make_profile(engine="sglang", gamma=GAMMA).export_sglang(tmp_path / "export")[0]
        self.sim = SglangDspark("compact", str(table))
        self.P, self.planner = self.sim.P, self.sim.planner
        budgets = self.planner._budget_planner
        budgets.sps_table = _table()
        if overlap:
            self.planner._budget_planner = self.P.HostConfidenceBudgetPlanner(
                sps_table=_table(), cfg=budgets.cfg, model_runner=self.sim.runner,
                relay_lag_steps=self.P.CONFIDENCE_RELAY_RING_LAG)
        observers = self.sim.observers
        original = type(observers).observe_verify_step
        observers.observe_verify_step = lambda **kw: observer.around_observe_step(original, observers, **kw)
        self.overlap, self.fresh, self.claimed, self.survives = overlap, fresh, claimed, survives
        self.rng = np.random.default_rng(seed)
        self.relay: list = []  # what SGLang's overlap relay would hold, oldest first
        self.budgets: list = []
        self.outcomes: list[tuple[float, int]] = []  # per drafted step: (predicted, realized) survivors

    def close(self) -> None:
        self.sim.close()

    def _budget(self, idx: torch.Tensor, conf: torch.Tensor):
        generation = self.sim.runner.req_to_token_pool.req_generation
        if not self.overlap:
            return self.planner.compute_budget_sync(confidence=conf, prefix_lens=torch.full((R,), 16),
                                                    req_pool_indices=idx)
        from sglang.srt.managers.overlap_utils import ResolvedConfidence

        self.relay.append(ResolvedConfidence(confidence=conf.clone(), generation=generation[idx].clone()))
        resolved = self.relay.pop(0) if len(self.relay) > self.P.CONFIDENCE_RELAY_RING_LAG else None
        return self.planner._budget_from_resolved(resolved=resolved, req_pool_indices_cpu=idx)

    def step(self) -> None:
        idx = torch.arange(R)
        if not self.fresh:
            self.sim.runner.req_to_token_pool.req_generation[idx] += 1  # no request has a fresh row
        conf = torch.full((R, GAMMA), self.claimed)
        budget = self._budget(idx, conf)
        decision = self.planner._budget_planner.last_decision
        read = [rows for rows, d in READ if d is decision and decision is not None]
        layout = self.planner.schedule_layout(req_pool_indices=idx, prefix_lens=torch.full((R,), 16),
                                              device=torch.device("cpu"), confidence=conf, budget=budget)
        drafts = (layout.verify_lens - 1).tolist() if layout is not None else [GAMMA] * R
        accepted = [int(np.argmin(np.append(self.rng.random(n) < self.survives, False))) for n in drafts]
        if budget is not None and read and sum(drafts):
            rows = read[0]  # the (corrected) rows this budget's decision read
            predicted = float(sum(rows[i, :n].sum() for i, n in enumerate(drafts)))
            self.outcomes.append((predicted, sum(accepted)))
        self.budgets.append(budget)
        correct = torch.tensor(accepted, dtype=torch.int64)
        self.sim.forward_ct += 1
        self.sim.observers.observe_verify_step(
            forward_ct=self.sim.forward_ct, reqs=[SimpleNamespace(rid=f"r{i}") for i in range(R)], bs=R,
            proposal_folded=False, verify_ids_2d=torch.zeros(R, GAMMA + 1, dtype=torch.int64), target_logits=None,
            layout=layout, confidence=conf, confidence_raw=None, prefix_lens=torch.full((R,), 16),
            draft_tokens=torch.zeros(R, GAMMA, dtype=torch.int64), draft_block=None, sampling_info=None,
            correct_len=correct, cap_trim_lens=torch.zeros(R, dtype=torch.int64),
            bonus=torch.zeros(R, dtype=torch.int64), commit_lens=correct + 1, verify_token_budget=budget,
            req_pool_indices=idx, verify_tier_num_tokens=16, dp_tier_num_tokens=None)

    def run(self, steps: int) -> Stream:
        for _ in range(steps):
            self.step()
        return self

    def late(self, skip: int) -> tuple[float, int]:
        late = self.outcomes[skip:]
        assert len(late) >= 100
        return sum(p for p, _ in late), sum(r for _, r in late)


def _budget_on(original, survival: torch.Tensor) -> int:
    from sglang.srt.speculative.dspark_components import dspark_planner as P

    return original(history_survival_probs=survival, sps_table=_table(), cfg=P.DSparkScheduleConfig(gamma=GAMMA)).budget


def _rows(p: float) -> torch.Tensor:
    return torch.cumprod(torch.full((R, GAMMA), p), dim=1)


def _streamed(tmp_path, steps: int, skip: int, **kw) -> tuple[Stream, float, int]:
    """A stream run for `steps` steps; predicted and realized survivors over its drafted steps after
    the first `skip`."""
    stream = Stream(tmp_path, **kw)
    try:
        stream.run(steps)
    finally:
        stream.close()
    return stream, *stream.late(skip)


@pytest.mark.parametrize("overlap", [False, True], ids=["no-overlap", "overlap"])
def test_rows_that_over_promise_are_budgeted_for_what_survives(hooked, tmp_path, overlap):
    from sglang_dspark.sglang_plugin import lag

    original = hooked(SGLANG_DSPARK_LAG_CALIBRATION="1")
    stream, predicted, realized = _streamed(tmp_path, 500, 100, overlap=overlap)
    assert realized > 0 and abs(predicted - realized) / realized <= 0.10, (predicted, realized)
    a, b = lag.feed().calibration.coefficients()[lag.LAG].tolist()
    assert a + b * CLAIMED == pytest.approx(SURVIVES, abs=0.03)
    # the budget is SGLang's own decision on the corrected rows: a first draft each, where the rows
    # as read would verify every draft
    assert stream.budgets[-1] == _budget_on(original, _rows(a + b * CLAIMED)) == R
    assert _budget_on(original, _rows(CLAIMED)) == R * GAMMA


def test_sglangs_all_ones_prior_is_calibrated_the_same_way(hooked, tmp_path):
    """Rows SGLang has no fresh history for are all ones (every draft certain): the "prior" group's
    fit reads them as what such drafts have survived, and leaves the lagged rows' fit untouched."""
    from sglang_dspark.sglang_plugin import lag

    original = hooked(SGLANG_DSPARK_LAG_CALIBRATION="1")
    stream, predicted, realized = _streamed(tmp_path, 400, 100, overlap=False, fresh=False)
    assert realized > 0 and abs(predicted - realized) / realized <= 0.10, (predicted, realized)
    calibration = lag.feed().calibration
    assert calibration.reached[lag.LAG].sum() == 0 and calibration.reached[lag.PRIOR].sum() > 1000
    a, b = calibration.coefficients()[lag.PRIOR].tolist()
    assert a + b == pytest.approx(SURVIVES, abs=0.03)
    assert stream.budgets[-1] == _budget_on(original, _rows(a + b)) == R
    assert calibration.coefficients()[lag.LAG].tolist() == [0.0, 1.0]


@pytest.mark.parametrize("fresh", [True, False], ids=["lagged-rows", "prior-rows"])
def test_without_the_feed_the_same_stream_is_over_promised(hooked, tmp_path, monkeypatch, fresh):
    """The guard of the two tests above: with no outcome reaching the fit, the rows the budget reads
    promise several times what survives."""
    from sglang_dspark.sglang_plugin import lag

    hooked(SGLANG_DSPARK_LAG_CALIBRATION="1")
    monkeypatch.setattr(lag.LagFeed, "observe", lambda self, decision, kw, stage: None)
    _, predicted, realized = _streamed(tmp_path, 200, 50, overlap=False, fresh=fresh)
    assert predicted > 2 * realized, (predicted, realized)


@pytest.mark.parametrize("env", [{}, {"SGLANG_DSPARK_LAG_CALIBRATION": "0"}], ids=["unset", "off"])
def test_with_the_calibration_off_the_decision_is_sglangs_own(hooked, tmp_path, monkeypatch, env):
    """The same over-promising stream, every budget through the hook: each equals SGLang's untouched
    decision on the matrix SGLang passed, and nothing is fed."""
    from sglang.srt.speculative.dspark_components import dspark_planner as P

    from sglang_dspark.sglang_plugin import lag
    from sglang_dspark.sglang_plugin.settings import settings

    original = hooked(**env)
    assert not settings().lag_calibration and not settings().changes_decisions
    seen = []
    hooked_fn = P.compute_verify_token_budget

    def spy(**kw):
        got = hooked_fn(**kw)
        want = original(**kw)
        seen.append((got.budget, got.predicted_step_seconds, got.predicted_theta) ==
                    (want.budget, want.predicted_step_seconds, want.predicted_theta))
        return got

    monkeypatch.setattr(P, "compute_verify_token_budget", spy)
    stream, _, _ = _streamed(tmp_path, 200, 0, overlap=False)
    assert len(seen) >= 190 and all(seen)
    assert set(stream.budgets[5:]) == {R * GAMMA}  # the rows as read: every draft
    assert lag.feed().calibration is None


def test_until_an_outcome_arrives_the_rows_are_sglangs_own_bit_for_bit(hooked):
    from sglang.srt.speculative.dspark_components import dspark_planner as P

    from sglang_dspark.sglang_plugin.planner import around_budget

    original = hooked(SGLANG_DSPARK_LAG_CALIBRATION="1")
    cfg, gen = P.DSparkScheduleConfig(gamma=GAMMA), torch.Generator().manual_seed(0)
    for _ in range(200):
        survival = torch.cumprod(torch.rand(R, GAMMA, generator=gen), dim=1)
        survival[0] = 1.0  # a prior row among them
        got = around_budget(original, history_survival_probs=survival, sps_table=_table(), cfg=cfg)
        want = original(history_survival_probs=survival, sps_table=_table(), cfg=cfg)
        assert (got.budget, got.predicted_theta) == (want.budget, want.predicted_theta)


def test_calibration_is_on_by_default_where_the_plugin_decides(plugin_env, tmp_path, monkeypatch):
    from test_sglang_plugin import _profile_with_tier

    from sglang_dspark.sglang_plugin.settings import LAG_CALIBRATION_ENV, settings

    monkeypatch.delenv(LAG_CALIBRATION_ENV, raising=False)
    _, path = _profile_with_tier(tmp_path)
    plugin_env(SGLANG_DSPARK_PROFILE=str(path), SGLANG_DSPARK_SLA_TIER="interactive")
    assert settings().lag_calibration
    plugin_env(SGLANG_DSPARK_PROFILE=str(path), SGLANG_DSPARK_SLA_TIER="interactive",
               SGLANG_DSPARK_LAG_CALIBRATION="0")
    assert not settings().lag_calibration and settings().changes_decisions
    plugin_env(SGLANG_DSPARK_PROFILE=str(path))
    assert not settings().lag_calibration and not settings().changes_decisions


def test_an_outcome_reaches_the_fit_a_fixed_number_of_steps_later(hooked):
    """Every TP rank must hold the same fit at every budget: a step's outcome is applied exactly
    OUTCOME_DELAY_STEPS observed steps later, whenever its copy landed."""
    from sglang_dspark.sglang_plugin import lag
    from sglang_dspark.sglang_plugin.observer import _Staged

    hooked(SGLANG_DSPARK_LAG_CALIBRATION="1")
    feed = lag.feed()
    survival = _rows(CLAIMED)
    versions = []
    for _ in range(6):
        step = feed.read(survival)
        decision = SimpleNamespace(budget=R)
        feed.plan(step, decision)
        feed.observe(decision, {"bs": R, "verify_token_budget": R, "layout": None,
                                "correct_len": torch.ones(R, dtype=torch.int64)}, _Staged.stage)
        versions.append(feed.calibration.version)
    assert versions == [0] * lag.OUTCOME_DELAY_STEPS + list(range(1, 7 - lag.OUTCOME_DELAY_STEPS))


def test_a_budget_whose_step_is_not_observed_is_not_taken_for_a_later_one(hooked):
    from sglang_dspark.sglang_plugin import lag
    from sglang_dspark.sglang_plugin.observer import _Staged

    hooked(SGLANG_DSPARK_LAG_CALIBRATION="1")
    feed = lag.feed()
    stale, current = feed.read(_rows(0.5)), feed.read(_rows(CLAIMED))
    feed.plan(stale, SimpleNamespace(budget=R))
    decision = SimpleNamespace(budget=R)
    feed.plan(current, decision)
    kw = {"bs": R, "verify_token_budget": R, "layout": None, "correct_len": torch.ones(R, dtype=torch.int64)}
    feed.observe(SimpleNamespace(budget=R), kw, _Staged.stage)  # a decision the hook never returned (a forced fraction)
    assert not feed.in_flight and len(feed.planned) == 2
    feed.observe(decision, kw, _Staged.stage)
    assert [s for _, s, _ in feed.in_flight] == [current] and not feed.planned


def test_observe_many_equals_one_observe_per_request():
    from sglang_dspark.core.lag_calibration import LagCalibration

    rng = np.random.default_rng(0)
    one, many = LagCalibration(GAMMA, lag=2), LagCalibration(GAMMA, lag=2)
    for _ in range(50):
        conf = rng.random((6, GAMMA))
        groups = rng.integers(0, 3, 6).tolist()
        verify, accepted = rng.integers(0, GAMMA + 1, 6), rng.integers(0, GAMMA + 1, 6)
        accepted = np.minimum(accepted, verify)
        for i in range(6):
            one.observe(groups[i], conf[i], int(verify[i]), int(accepted[i]))
        many.observe_many(groups, conf, verify, accepted)
    assert np.array_equal(one.reached, many.reached)
    assert np.allclose(one._sums, many._sums)
    assert torch.allclose(one.coefficients(), many.coefficients(), atol=1e-6)
