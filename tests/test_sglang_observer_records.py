"""The plugin's step observer against SGLang's own objects: steps planned by SGLang's
DSparkVerifyPlanner in compact mode (real RaggedVerifyLayouts from its top-k schedule, at forced
budgets that vary), observed through SGLang's DsparkStepObservers with our AROUND hook in place.
What we export is compared with SGLang's own accounting of the same steps: the layout's query
offsets (`qo_indptr_device[-1]`, the rows the verify forward runs, one anchor per request
included) and the budget SGLang's step records report (draft rows above that per-request floor). An anchor-row
off-by-one in the observer fails here."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.sglang


def _snapshot(registry) -> dict:
    """Every sample of `registry` now. Under prometheus_client's multiprocess mode (decided at its
    first import in the process) a family's values are shared by name, so a test takes the
    difference its own steps made."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in registry.collect() for s in family.samples}


def single_process_metrics() -> None:
    """Import prometheus_client before PROMETHEUS_MULTIPROC_DIR is set (it picks its mode at its
    first import), so each registry here holds its own values."""
    import prometheus_client  # noqa: F401


def started_observer():
    """The process's step observer, started (its metrics exist) before any step."""
    from sglang_dspark.sglang_plugin import observer

    obs = observer.observer()
    obs._start()
    return obs


def test_exported_counts_equal_sglangs_own_accounting(monkeypatch, tmp_path):
    from types import SimpleNamespace

    import sglang.srt.runtime_context as rc
    from sglang_sim import GAMMA, SglangDspark
    from test_profiles import make_profile

    from sglang_dspark.sglang_plugin import observer, settings

    single_process_metrics()
    for key in (settings.PROFILE_ENV, settings.TIER_ENV, settings.LEARNING_ENV):
        monkeypatch.delenv(key, raising=False)
    settings.settings.cache_clear()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setattr(rc, "get_parallel", lambda: SimpleNamespace(attn_tp_rank=0, attn_tp_size=1))
    monkeypatch.setattr(observer, "_OBSERVER", None)
    table = str(make_profile(engine="sglang", gamma=GAMMA).export_sglang(tmp_path / "export")[0])
    obs = started_observer()
    before = _snapshot(obs.metrics.registry)
    sim = SglangDspark("compact", table)
    try:
        observers = sim.observers
        original = type(observers).observe_verify_step
        observers.observe_verify_step = lambda **kw: observer.around_observe_step(original, observers, **kw)
        rids = [f"r{i}" for i in range(5)]
        sim.prefill(rids)
        for frac in (0.125, 0.4, 0.75, 1.0):
            sim.set_state({"dspark_force_budget_frac": frac})
            for _ in range(4):
                sim.step(rids)
        records = sim.server_info()["internal_states"][0]["dspark_info_record"]["records"]
    finally:
        sim.close()
    # ours are read a step late: the last step is still pending
    layouts, records = sim.layouts[:-1], records[:-1]
    rows = [int(layout.qo_indptr_device[-1]) for layout in layouts]
    assert len(set(rows)) > 3  # budgets varied
    after = _snapshot(obs.metrics.registry)

    def value(name, **labels):  # this test's steps only
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert value("sglang_dspark_verify_steps_total") == len(layouts)
    assert value("sglang_dspark_verify_tokens_sum") == sum(rows)
    drafts = sum(value("sglang_dspark_position_verified_total", position=str(p)) for p in range(GAMMA + 1))
    assert drafts == sum(r["budget"] for r in records)  # SGLang's budget: draft rows above one anchor each
    assert value("sglang_dspark_position_verified_total", position=str(GAMMA)) == 0.0  # no eighth draft exists
