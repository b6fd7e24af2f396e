"""A tier (or online learning) on a table SGLang reads as none stops the worker at start, in one line:
SGLang 0.5.23's own compact planner built on such a table verifies every draft and never calls the
budget hook, so the tier would otherwise be ignored without a word."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.sglang


@pytest.fixture
def configured(monkeypatch, tmp_path):
    from test_profiles import make_profile

    from sglang_dspark.sglang_plugin import settings

    path = tmp_path / "profile.yaml"
    make_profile(engine="sglang").save(path)

    def configure(tier: str | None, learning: bool = False):
        monkeypatch.setenv(settings.PROFILE_ENV, str(path))
        for env, value in ((settings.TIER_ENV, tier), (settings.LEARNING_ENV, "1" if learning else None)):
            if value is None:
                monkeypatch.delenv(env, raising=False)
            else:
                monkeypatch.setenv(env, value)
        settings.settings.cache_clear()

    yield configure
    settings.settings.cache_clear()


def _table(tmp_path, batch_tokens: list[int]) -> str:
    path = tmp_path / f"sps-{len(batch_tokens)}.json"
    path.write_text(json.dumps({"sample_batch_tokens": batch_tokens,
                                "sample_steps_per_sec": [100.0 - b for b in batch_tokens], "max_batch_tokens": 64}))
    return str(path)


@pytest.mark.parametrize("tier,learning", [("interactive", False), (None, True)])
def test_a_tier_on_a_table_sglang_reads_as_none_refuses_to_start(configured, tmp_path, tier, learning):
    from sglang_sim import SglangDspark

    from sglang_dspark.profile.schema import ProfileError
    from sglang_dspark.sglang_plugin.observer import after_observers_init

    configured(tier, learning)
    for batch_tokens, inert in (([8], True), ([8, 16, 32], False)):
        sim = SglangDspark("compact", sps_table_path=_table(tmp_path, batch_tokens))
        try:
            assert sim.planner.is_verify_all is inert  # SGLang's own reading of the table
            if inert:
                with pytest.raises(ProfileError, match="never asks for a budget") as raised:
                    after_observers_init(None, sim.observers)
                assert "\n" not in str(raised.value)
            else:
                after_observers_init(None, sim.observers)
        finally:
            sim.close()


def test_without_a_tier_or_learning_the_flat_table_is_sglangs_business(configured, tmp_path):
    from sglang_sim import SglangDspark

    from sglang_dspark.sglang_plugin.observer import after_observers_init

    configured(None)
    sim = SglangDspark("compact", sps_table_path=_table(tmp_path, [8]))
    try:
        assert sim.planner.is_verify_all
        after_observers_init(None, sim.observers)  # the plugin changes no decision: nothing to refuse
    finally:
        sim.close()
