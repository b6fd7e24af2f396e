"""Per-user SLA outcomes on the SGLang path: a request gets one outcome at its real finish
(DsparkStepObservers.note_request_finished), however often it was retracted and re-admitted, and
none when SGLang's Scheduler.abort_request ended it (one rid or prefix, or abort_all), as the
reference engine counts them. Driven through the plugin's hooks with SGLang's own AbortReq."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
from test_sglang_observer_records import _snapshot, single_process_metrics, started_observer
from test_sglang_plugin import _Clock, _observe_kwargs, _profile_with_tier

pytestmark = pytest.mark.sglang

FAKE = SimpleNamespace(_planner=SimpleNamespace(_budget_planner=SimpleNamespace(last_decision=None)))


@pytest.fixture
def steps(plugin_env, tmp_path, monkeypatch):
    """(step(rids): a decode step over those requests (at most 3), outcomes(): SLA outcomes so far)."""
    import sglang.srt.runtime_context as rc

    from sglang_dspark.sglang_plugin import observer

    single_process_metrics()
    _, path = _profile_with_tier(tmp_path)
    plugin_env(SGLANG_DSPARK_PROFILE=str(path), SGLANG_DSPARK_SLA_TIER="interactive")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setattr(rc, "get_parallel", lambda: SimpleNamespace(attn_tp_rank=0, attn_tp_size=1))
    monkeypatch.setattr(observer, "_OBSERVER", None)
    clock = _Clock()
    monkeypatch.setattr(observer.time, "perf_counter", clock)
    registry = started_observer().metrics.registry

    def step(rids: str) -> None:
        clock.now += 0.01
        kw = {**_observe_kwargs(len(rids.split()), 7), "reqs": [SimpleNamespace(rid=r) for r in rids.split()]}
        observer.around_observe_step(lambda obs, **kw: None, FAKE, **kw)

    def outcomes() -> float:
        return sum(v for (name, _), v in _snapshot(registry).items() if name == "sglang_dspark_sla_requests_total")

    return step, outcomes


def _finish(rid: str, natural_stop: bool = True) -> None:
    from sglang_dspark.sglang_plugin import observer

    observer.after_request_finished(None, FAKE, rid=rid, natural_stop=natural_stop)


def _abort(**fields) -> None:
    from sglang.srt.managers.io_struct import AbortReq

    from sglang_dspark.sglang_plugin import observer

    observer.after_abort_request(None, SimpleNamespace(), AbortReq(**fields))


def test_a_retracted_request_gets_one_outcome_at_its_real_finish(steps):
    step, outcomes = steps
    before = outcomes()
    for rids in ("a b c", "a b c", "a b", "a b", "a b c", "a b c"):  # c is retracted for two steps, then back
        step(rids)
    assert outcomes() == before  # absence alone finishes nothing
    _finish("c")
    step("a b")
    step("a b")  # numbers are a step late: this one accounts the step after the finish
    assert outcomes() - before == 1.0  # c once, at its finish; a and b have not finished


def test_an_aborted_request_gets_no_outcome(steps):
    step, outcomes = steps
    before = outcomes()
    for _ in range(4):
        step("a b c")
    _abort(rid="b")  # the client left; SGLang ends b at its next step, finished but not natural
    _finish("b", natural_stop=False)
    _finish("c", natural_stop=False)  # max_tokens: a real finish
    step("a")
    step("a")
    assert outcomes() - before == 1.0  # c only


def test_abort_all_leaves_no_outcome_for_the_requests_it_ended(steps):
    step, outcomes = steps
    before = outcomes()
    for _ in range(4):
        step("a b")
    _abort(abort_all=True)
    _finish("a", natural_stop=False)
    _finish("b", natural_stop=False)
    for _ in range(4):
        step("c")  # arrives after the abort: its outcome counts
    _finish("c")
    step("d")
    step("d")
    assert outcomes() - before == 1.0


def test_the_abort_hook_takes_what_sglangs_scheduler_passes():
    """Scheduler.abort_request(self, recv_req: AbortReq), and AbortReq has the fields read here."""
    from sglang.srt.managers.io_struct import AbortReq
    from sglang.srt.managers.scheduler import Scheduler

    method = getattr(Scheduler.abort_request, "__wrapped__", Scheduler.abort_request)
    assert list(inspect.signature(method).parameters) == ["self", "recv_req"]
    req = AbortReq(rid="abc")
    assert req.rid == "abc" and req.abort_all is False and AbortReq(abort_all=True).rid == ""
