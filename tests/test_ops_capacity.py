"""ops/capacity.py: replicas for a traffic level at a tier, from a profile's SPS table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `ops` is a folder of the repository, not installed

from ops import capacity  # noqa: E402
from sglang_dspark.profile.schema import SlaProfile  # noqa: E402

PROFILE = "sla_profiles/smollm2-135m-instruct-cpu.yaml"


@pytest.fixture(scope="module")
def profile() -> SlaProfile:
    return SlaProfile.load(PROFILE)


@pytest.mark.parametrize("tau", [1.0, 1.3, 2.5, 8.0])
def test_acceptance_gives_back_tau(tau):
    a = capacity.acceptance_for_tau(tau, 7)
    assert sum(a ** j for j in range(8)) == pytest.approx(tau, abs=1e-6)


def test_tau_outside_what_gamma_allows_is_refused():
    with pytest.raises(ValueError, match="--tau"):
        capacity.acceptance_for_tau(9.0, 7)


def test_modes_fix_or_choose_the_drafts(profile):
    table, gamma = profile.sps_table(), profile.fingerprint.gamma
    assert capacity.speed_at(table, 4, gamma, 0.6, "target").drafts == 0
    assert capacity.speed_at(table, 4, gamma, 0.6, "full").drafts == gamma
    scheduled = capacity.speed_at(table, 4, gamma, 0.6, "scheduled")
    assert scheduled.user_tok_s >= max(capacity.speed_at(table, 4, gamma, 0.6, m).user_tok_s for m in ("target", "full"))
    # no accepted draft: drafting only costs time, the scheduled plan drafts nothing
    assert capacity.speed_at(table, 4, gamma, 0.0, "scheduled").drafts == 0


def test_replicas_scale_with_demand():
    point = capacity.Point(concurrency=4, drafts=2, step_seconds=0.1, user_tok_s=25.0)  # 100 tok/s a replica
    assert capacity.replicas_needed(80.0, point, 0.8) == 1
    assert capacity.replicas_needed(81.0, point, 0.8) == 2
    assert capacity.replicas_needed(800.0, point, 0.8) == 10


def test_cli_prints_the_curve_and_the_replicas(capsys):
    assert capacity.main(["--profile", PROFILE, "--tier", "batch", "--rate", "0.5", "--output-tokens", "256",
                          "--tau", "1.3", "--mode", "target"]) == 0
    out = capsys.readouterr().out
    assert "concurrency <= 16" in out and out.count(" meets") == 16
    assert "128.0 tok/s" in out and "2 replica(s)" in out


def test_a_tier_no_concurrency_meets_exits_1(profile, tmp_path, capsys):
    path = tmp_path / "p.yaml"
    fast = profile.sla_tiers[0].model_copy(update={"name": "instant", "tok_s_per_user": 1000.0}).model_dump()
    profile.replaced(sla_tiers=[fast]).save(path)
    assert capacity.main(["--profile", str(path), "--tier", "instant", "--rate", "1", "--tau", "1.3"]) == 1
    assert "no number of replicas serves this tier" in capsys.readouterr().out


def test_bad_input_exits_2_with_one_line(capsys):
    assert capacity.main(["--profile", PROFILE, "--tier", "nope", "--rate", "1", "--tau", "1.3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no tier 'nope'" in err


def test_help_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        capacity.main(["--help"])
    out = capsys.readouterr().out
    assert "(default: 256)" in out and "(default: scheduled)" in out and "(default: 0.8)" in out


def test_target_only_is_priced_from_undrafted_steps_or_flagged_as_an_approximation(profile, tmp_path, capsys):
    """The reference engine's profile measured steps without the drafter (draft_skip_seconds): the
    target-only price rests on them. An SGLang profile never did (SGLang always drafts): the budget-0
    price includes the drafter, and the output says it is a lower bound."""
    argv = ["--tier", "batch", "--rate", "0.5", "--output-tokens", "256", "--tau", "1.3", "--mode", "target"]
    assert capacity.main(["--profile", PROFILE, *argv]) == 0
    out = capsys.readouterr().out
    assert "priced from the profile's measured steps without the drafter" in out and "approximation" not in out

    fp = profile.fingerprint.model_copy(update={"engine": "sglang"}).model_dump()
    sglang = tmp_path / "sglang.yaml"
    profile.replaced(fingerprint=fp, sps={**profile.sps.model_dump(), "draft_skip_seconds": None}).save(sglang)
    assert capacity.main(["--profile", str(sglang), *argv]) == 0
    out = capsys.readouterr().out
    assert "approximation: this profile measured no step without the drafter (SGLang always drafts)" in out
    assert "lower bound" in out
    table, gamma = profile.sps_table(), profile.fingerprint.gamma
    drafted = SlaProfile.load(sglang).sps_table()
    # the same fit without the drafter-skip saving: slower, so a lower bound on target-only speed
    assert (capacity.speed_at(drafted, 4, gamma, 0.5, "target").user_tok_s
            < capacity.speed_at(table, 4, gamma, 0.5, "target").user_tok_s)
