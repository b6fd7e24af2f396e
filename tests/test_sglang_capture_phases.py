"""The two-phase SGLang profile capture, against SGLang 0.5.23's own verify planner and step
observers on CPU (tests/sglang_sim.py): why it takes two phases (forced fractions act only in
compact mode with a table), that the two phases' records span off-diagonal (R, B) points and give
a table that prices budget 0 below a full verify, and that a diagonal-only record set is refused."""

from __future__ import annotations

import numpy as np
import pytest

from loopback_server import serve_on_loopback
from sglang_dspark.profile.cli import main as profile_main
from sglang_dspark.profile.schema import SlaProfile

pytestmark = pytest.mark.sglang


@pytest.fixture
def sglang_server(tmp_path):
    """A factory: SGLang's planner in `mode` (with the table of `profile` when given) behind HTTP."""
    from sglang_sim import SglangDspark, sim_app

    stack = []

    def start(mode: str, profile: SlaProfile | None = None):
        table = str(profile.export_sglang(tmp_path / f"export-{len(stack)}")[0]) if profile is not None else None
        sim = SglangDspark(mode, table)
        served = serve_on_loopback(sim_app(sim))
        stack.append((sim, served))
        return sim, served.__enter__()

    yield start
    for sim, served in reversed(stack):
        served.__exit__(None, None, None)
        sim.close()


def _records(sim) -> list[dict]:
    return sim.server_info()["internal_states"][0]["dspark_info_record"]["records"]


@pytest.mark.parametrize("mode, with_table, honoured", [("static", True, False), ("compact", False, False),
                                                        ("compact", True, True)])
def test_forced_fractions_change_verify_tokens_only_in_compact_mode_with_a_table(tmp_path, mode, with_table, honoured):
    from sglang_sim import GAMMA, SglangDspark
    from test_profiles import make_profile

    table = str(make_profile(engine="sglang", gamma=GAMMA).export_sglang(tmp_path)[0]) if with_table else None
    sim = SglangDspark(mode, table)
    try:
        rids = [f"r{i}" for i in range(4)]
        sim.prefill(rids)
        seen = {}
        for frac in (0.125, 0.5, 1.0):
            sim.set_state({"dspark_force_budget_frac": frac, "dspark_clear_info_records": True})
            for _ in range(3):
                sim.step(rids)
            seen[frac] = {r["num_verify_tokens"] for r in _records(sim)}  # what SGLang's own records report
    finally:
        sim.close()
    full = 4 * (GAMMA + 1)
    if honoured:
        assert max(seen[0.125]) < min(seen[0.5]) and max(seen[0.5]) < min(seen[1.0]) and seen[1.0] == {full}
    else:
        assert all(tokens == {full} for tokens in seen.values()), seen  # "updated": true, and nothing changed


def _capture(base: str, out, *flags) -> tuple[int, str]:
    rc = profile_main(["capture-http", "--base-url", base, "--out", str(out), "--concurrency", "1,2,4,8",
                       "--max-new-tokens", "24", "--min-samples", "2", "--warmup-steps", "1", "--timeout", "60",
                       *flags])
    return rc


def test_two_phases_span_off_diagonal_points_and_price_budget_0_below_a_full_verify(sglang_server, tmp_path, capsys):
    from sglang_sim import GAMMA, true_cost
    from sglang_dspark.core.sps import SpsTable

    _, static = sglang_server("static")
    phase1 = tmp_path / "phase1.yaml"
    assert _capture(static, phase1, "--phase", "static") == 0, capsys.readouterr().err
    first = SlaProfile.load(phase1)
    assert first.sps.additive is None  # the diagonal gives a 1-D table only
    assert all(m.batch_tokens == m.num_requests * (GAMMA + 1) for m in first.sps.measurements)
    assert profile_main(["refit", str(phase1), "--out", str(tmp_path / "refit1.yaml")]) == 0
    assert SlaProfile.load(tmp_path / "refit1.yaml").sps.additive is None  # a refit keeps it 1-D

    sim, compact = sglang_server("compact", first)  # phase 2: compact mode, the phase-1 table loaded
    phase2 = tmp_path / "phase2.yaml"
    assert _capture(compact, phase2, "--fractions", "0.125,0.5,1.0") == 0, capsys.readouterr().err
    rows = SlaProfile.load(phase2).sps.measurements
    by_r: dict[int, set[int]] = {}
    for m in rows:
        by_r.setdefault(m.num_requests, set()).add(m.batch_tokens)
    assert sum(len(b) > 1 for b in by_r.values()) >= 3, by_r  # off the diagonal, at several R
    table = SpsTable(SlaProfile.load(phase2).sps.additive)
    for r, tokens in by_r.items():
        none, full = table.step_seconds(r, r * GAMMA + 1)[[0, -1]]
        assert none < full, r  # budget 0 is priced below verifying every draft
        if len(tokens) > 1:  # and, inside the measured range, by what the extra tokens cost
            lo, hi = min(tokens), max(tokens)
            predicted = np.diff(table.seconds_at([r, r], [lo, hi], [True, True]))[0]
            assert predicted == pytest.approx(true_cost(r, hi) - true_cost(r, lo), rel=0.05), (r, lo, hi)


def test_a_diagonal_only_record_set_is_refused(sglang_server, tmp_path, capsys):
    sim, compact = sglang_server("compact", _phase1_profile())
    out = tmp_path / "diag.yaml"
    assert _capture(compact, out, "--fractions", "1.0") == 2  # every step verifies every draft
    err = capsys.readouterr().err.strip()
    assert "B = R * (gamma + 1)" in err and "--phase static" in err and "\n" not in err
    assert not out.exists()
    assert _records(sim)  # refused after the load, from what the records say


def test_phase_2_against_a_static_server_is_refused_before_any_load(sglang_server, tmp_path, capsys):
    sim, static = sglang_server("static")
    assert _capture(static, tmp_path / "x.yaml") == 2
    err = capsys.readouterr().err.strip()
    assert "static verify" in err and "--phase static" in err and "\n" not in err
    assert sim.forward_ct == 0  # no request was driven


def _phase1_profile() -> SlaProfile:
    from sglang_sim import GAMMA
    from test_profiles import make_profile

    return make_profile(engine="sglang", gamma=GAMMA)


def test_default_concurrencies_reach_the_largest_tier():
    from sglang_dspark.profile.http_capture import concurrencies_for
    from sglang_dspark.profile.schema import SlaTier

    tiers = [SlaTier(name="a", tok_s_per_user=20.0, ttft_s=2.0, max_concurrency=32),
             SlaTier(name="b", tok_s_per_user=5.0, ttft_s=30.0, max_concurrency=128)]
    levels = concurrencies_for(tiers)
    assert levels[-1] == 128 and list(levels) == sorted(set(levels)) and levels[0] == 1
    assert all(b <= 2 * a for a, b in zip(levels, levels[1:]))  # no gap wider than a doubling
    assert concurrencies_for([])[-1] == 8 and np.all(np.diff(concurrencies_for([])) > 0)


def test_sglang_answers_set_internal_state_per_dp_rank_and_refuses_what_it_cannot_apply(tmp_path):
    """SGLang's own handlers: one bool per DP rank; 0 is outside (0, 1]; a rank without a DSpark
    worker refuses; a refused update leaves the forced fraction where it was."""
    from sglang_sim import SglangDspark

    sim = SglangDspark("compact", str(_phase1_profile().export_sglang(tmp_path)[0]))
    try:
        assert sim.set_state({"dspark_force_budget_frac": 0.5}) == [True]
        assert sim.planner._budget_planner.forced_budget_frac == 0.5
        assert sim.set_state({"dspark_force_budget_frac": 0.0}) == [False]
        assert sim.planner._budget_planner.forced_budget_frac == 0.5
        sim.refusing_ranks = 1
        assert sim.set_state({"dspark_clear_info_records": True}) == [True, False]
    finally:
        sim.close()


def test_a_capture_stops_when_a_dp_rank_refuses_its_budget(sglang_server, tmp_path, capsys):
    """A rank that did not take the forced fraction would leave records of another budget in the
    level: the capture ends with one line naming the rank, before writing anything."""
    sim, compact = sglang_server("compact", _phase1_profile())
    sim.refusing_ranks = 1
    out = tmp_path / "refused.yaml"
    assert _capture(compact, out, "--fractions", "0.5,1.0") == 2
    err = capsys.readouterr().err.strip()
    assert "DP rank(s) [1] of 2 refused" in err and "\n" not in err
    assert not out.exists() and sim.forward_ct == 0  # refused at the first knob, before any load
