"""The sglang.srt.plugins plugin against the installed sglang==0.5.23, on CPU: discovery and hook
identity in a fresh interpreter, the planner hook's decisions (original, SLA, through SGLang's own
caller), metrics through SGLang's own exposition, STS fixes, and a clean refusal when a target is
missing. These fail loudly when SGLang's internals move."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch
from forked_python import ForkedPython

pytestmark = pytest.mark.sglang

PLANNER = "sglang.srt.speculative.dspark_components.dspark_planner"


# What a fresh interpreter imports before each check below: SGLang's plugin loader and the modules
# the plugin hooks (nothing is patched until a check calls load_plugins).
FRESH_IMPORTS = ["sglang.srt.plugins", PLANNER, "sglang.srt.speculative.dspark_components.dspark_observability",
                 "sglang.srt.speculative.dspark_components.dspark_sts", "sglang.srt.managers.scheduler",
                 "sglang.srt.runtime_context"]


@pytest.fixture(scope="module")
def fresh_python():
    """Runs a check in a new interpreter with FRESH_IMPORTS done (forked from one that did them once)."""
    forked = ForkedPython(FRESH_IMPORTS, env={"HF_HUB_OFFLINE": "1"})
    yield forked.run
    forked.close()


def test_load_plugins_discovers_the_entry_point_and_every_target_is_our_hook(fresh_python):
    out = fresh_python("""
        import inspect, json, pkgutil
        from sglang.srt.plugins import load_plugins
        load_plugins()
        from sglang_dspark import sglang_plugin
        result = {}
        for target, hook, kind in sglang_plugin.hooks():
            installed = pkgutil.resolve_name(target)
            if kind == "REPLACE":
                result[target] = installed is hook
            else:
                result[target] = (inspect.getclosurevars(installed).nonlocals.get("hook") is hook
                                  and installed.__wrapped__ is not installed)
        print(json.dumps(result))
    """)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(result) == 8 and all(result.values()), result


def test_a_missing_target_registers_nothing_and_leaves_sglang_untouched(fresh_python):
    out = fresh_python("""
        import logging
        logging.basicConfig(level=logging.WARNING)
        import sglang.srt.speculative.dspark_components.dspark_observability as O
        import sglang.srt.speculative.dspark_components.dspark_planner as P
        original = P.compute_verify_token_budget
        del O.DsparkStepObservers.note_prefill_step  # this SGLang "moved" one hook target
        from sglang.srt.plugins import load_plugins
        load_plugins()
        print("untouched", P.compute_verify_token_budget is original and not hasattr(original, "__wrapped__"))
    """)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "untouched True" in out.stdout
    refusal = [line for line in out.stderr.splitlines() if "sglang_dspark plugin NOT registered" in line]
    assert len(refusal) == 1 and "DsparkStepObservers.note_prefill_step" in refusal[0]


def _tables():
    from sglang.srt.speculative.dspark_components.dspark_sps import SpsAdditiveCostTable, SpsCostTable

    cost = SpsCostTable(sample_batch_tokens=[1, 3, 8, 16, 40], sample_steps_per_sec=[90.0, 70.0, 55.0, 40.0, 20.0],
                        max_batch_tokens=64)
    additive = SpsAdditiveCostTable(bias_seconds=0.004, bs_probes=[1, 4, 16], alpha_seconds=[0.0, 0.003, 0.01],
                                    m_probes=[1, 4, 8, 32, 64], theta_seconds=[0.0, 0.002, 0.004, 0.012, 0.03])
    return cost, additive


def test_without_a_profile_the_hook_returns_exactly_the_original_decision(plugin_env):
    from sglang.srt.speculative.dspark_components import dspark_planner as P

    from sglang_dspark.sglang_plugin.planner import around_budget

    plugin_env()
    original = getattr(P.compute_verify_token_budget, "__wrapped__", P.compute_verify_token_budget)
    cfg = P.DSparkScheduleConfig(gamma=7)
    gen = torch.Generator().manual_seed(0)
    for i in range(300):
        bs = int(torch.randint(1, 24, (1,), generator=gen))
        survival = torch.cumprod(torch.rand(bs, 7, generator=gen), dim=1)
        for table in _tables():
            want = original(history_survival_probs=survival, sps_table=table, cfg=cfg)
            got = around_budget(original, history_survival_probs=survival, sps_table=table, cfg=cfg)
            assert (got.budget, got.predicted_step_seconds, got.predicted_theta) == \
                (want.budget, want.predicted_step_seconds, want.predicted_theta), i


def _profile_with_tier(tmp_path, engine="sglang"):
    from test_profiles import make_profile

    profile = make_profile(engine=engine, additive=True, gamma=7)
    path = tmp_path / "sla.yaml"
    profile.save(path)
    return profile, path


def test_with_a_tier_the_hook_returns_the_bundles_sla_decision_through_sglangs_caller(plugin_env, tmp_path,
                                                                                   monkeypatch):
    from sglang.srt.plugins.hook_registry import HookType, _wrap_fn
    from sglang.srt.speculative.dspark_components import dspark_planner as P

    from sglang_dspark.core.schedule import decide_budget_sla
    from sglang_dspark.core.sps import SpsTable
    from sglang_dspark.sglang_plugin.planner import around_budget

    profile, path = _profile_with_tier(tmp_path)
    plugin_env(SGLANG_DSPARK_PROFILE=str(path), SGLANG_DSPARK_SLA_TIER="interactive")
    original = getattr(P.compute_verify_token_budget, "__wrapped__", P.compute_verify_token_budget)
    monkeypatch.setattr(P, "compute_verify_token_budget", _wrap_fn(original, around_budget, HookType.AROUND))
    cfg = P.DSparkScheduleConfig(gamma=7)
    caller = P.HostConfidenceBudgetPlanner(sps_table=_tables()[1], cfg=cfg, model_runner=None, relay_lag_steps=2)
    ours = SpsTable(profile.sps.additive)
    gen = torch.Generator().manual_seed(1)
    differs = 0
    for _ in range(200):
        bs = int(torch.randint(1, 16, (1,), generator=gen))
        conf = torch.rand(bs, 7, generator=gen)
        ones = torch.ones(bs, dtype=torch.int64)
        budget = caller.compute_budget(confidence=conf, generation=ones, current_generation=ones,
                                       req_pool_indices_cpu=torch.arange(bs))
        survival = torch.cumprod(conf, dim=1)
        want = decide_budget_sla(survival, ours, 20.0)
        assert budget == want.budget and caller.last_decision.predicted_theta == pytest.approx(want.predicted_theta)
        differs += budget != original(history_survival_probs=survival, sps_table=_tables()[1], cfg=cfg).budget
    assert differs > 0  # the SLA decision is really a different decision


def test_a_tier_without_a_profile_is_refused(plugin_env):
    from sglang_dspark.profile.schema import ProfileError
    from sglang_dspark.sglang_plugin.settings import settings

    plugin_env(SGLANG_DSPARK_SLA_TIER="interactive")
    with pytest.raises(ProfileError, match="needs SGLANG_DSPARK_PROFILE"):
        settings()


def _observe_kwargs(bs: int, gamma: int, verify_lens=(4, 2, 7), grid=(16,)) -> dict:
    """Every keyword SGLang's worker passes to observe_verify_step, with CPU tensors and SGLang's own
    RaggedVerifyLayout (its verify_lens count rows, the anchor included: test_sglang_observer_records
    checks that against SGLang's planner), so these requests verify 3, 1 and 6 drafts and accept 2, 0
    and 4 of them."""
    from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout

    commit = torch.tensor([3, 1, 5][:bs])
    layout = RaggedVerifyLayout.from_verify_lens(verify_lens_cpu=list(verify_lens[:bs]), device=torch.device("cpu"),
                                                 grid=list(grid))
    return dict(forward_ct=1, reqs=[SimpleNamespace(rid=f"r{i}") for i in range(bs)], bs=bs, proposal_folded=False,
                verify_ids_2d=torch.zeros(bs, gamma + 1, dtype=torch.int64), target_logits=None, layout=layout,
                confidence=None, confidence_raw=None, prefix_lens=torch.zeros(bs), draft_tokens=torch.zeros(bs, gamma),
                draft_block=None, sampling_info=None, correct_len=commit - 1, cap_trim_lens=torch.zeros(bs),
                bonus=torch.zeros(bs), commit_lens=commit, verify_token_budget=9,
                req_pool_indices=torch.arange(bs), verify_tier_num_tokens=16, dp_tier_num_tokens=None)


def test_our_synthetic_call_uses_sglangs_exact_keywords():
    from sglang.srt.speculative.dspark_components.dspark_observability import DsparkStepObservers

    method = getattr(DsparkStepObservers.observe_verify_step, "__wrapped__", DsparkStepObservers.observe_verify_step)
    params = inspect.signature(method).parameters
    keyword_only = {n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert keyword_only == set(_observe_kwargs(3, 7))


def test_observer_metrics_appear_on_sglangs_own_metrics_endpoint(fresh_python, tmp_path):
    out = fresh_python("""
        import json, sys, time
        sys.path.insert(0, "tests")
        from types import SimpleNamespace
        import sglang.srt.runtime_context as rc
        rc.get_parallel = lambda: SimpleNamespace(attn_tp_rank=0, attn_tp_size=1, tp_rank=0, dp_rank=0)
        from test_sglang_plugin import _observe_kwargs
        from sglang_dspark.sglang_plugin import observer
        fake = SimpleNamespace(_planner=SimpleNamespace(_budget_planner=SimpleNamespace(
            last_decision=SimpleNamespace(predicted_step_seconds=0.02))))
        for step in range(4):  # numbers are a step late: four steps export three, each timed by the interval
            # after its hook (overlap scheduling, SGLang's default)
            time.sleep(0.01)
            observer.around_observe_step(lambda obs, **kw: None, fake, **_observe_kwargs(3, 7))
        from fastapi import FastAPI
        from fastapi.testclient import TestClient
        from sglang.srt.utils.common import add_prometheus_middleware
        app = FastAPI()
        add_prometheus_middleware(app)
        print(json.dumps(TestClient(app).get("/metrics").text))
    """, env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-3000:]
    text = json.loads(out.stdout.strip().splitlines()[-1])
    assert "sglang_dspark_verify_steps_total 3.0" in text
    assert 'sglang_dspark_accept_length_bucket{le="3.0"} 6.0' in text  # commit lens 3 and 1, three times each
    # draft 0: verified by all three requests, accepted by r0 and r2; draft 2: verified by r0 and r2,
    # accepted by r2; draft 6 (the anchor's row, were it counted): verified by none
    for position, verified, accepted in ((0, 9, 6), (1, 6, 6), (2, 6, 3)):
        assert f'sglang_dspark_position_verified_total{{position="{position}"}} {verified:.1f}' in text
        assert f'sglang_dspark_position_accepted_total{{position="{position}"}} {accepted:.1f}' in text
    assert 'position="6"' not in text
    assert "sglang_dspark_verify_tokens_sum 39.0" in text  # 3 anchors + 10 drafts, three times
    assert "sglang_dspark_step_seconds_count 3.0" in text and "sglang_dspark_verify_budget_count 3.0" in text
    assert 'sglang_dspark_sps_table_source{source="profile"} 1.0' in text
    _assert_exports_only_the_families_it_updates(text)


def _families(text: str) -> set[str]:
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name for f in text_string_to_metric_families(text)  # counters without _total
            if f.name.startswith("sglang_dspark_") and not f.name.endswith("_created")}


def _assert_exports_only_the_families_it_updates(text: str) -> None:
    """The reference server's families that SGLang's path never updates (guard, canary, queue,
    TTFT ...) are absent from SGLang's /metrics, so their alerts read "no data", not a healthy 0;
    the reference server still exports them; and each family the plugin does export, a step updated."""
    from engine_fixtures import tiny_engine

    from sglang_dspark.sglang_plugin.observer import FAMILIES

    reference = _families(tiny_engine().metrics.render().decode())
    reference_only = reference - FAMILIES
    assert FAMILIES <= reference and len(reference_only) >= 13, sorted(reference_only)
    exported = _families(text)
    assert not exported & reference_only, sorted(exported & reference_only)
    assert exported == FAMILIES - {"sglang_dspark_sla_requests"}  # outcomes need a tier; this run has none
    updated = {line.split("{")[0].split()[0] for line in text.splitlines()
               if line.startswith("sglang_dspark_") and not line.rstrip().endswith((" 0.0", "_created"))}
    for family in exported:
        assert any(name.startswith(family) for name in updated), f"{family} exported but never updated"


def _sts_launch(tmp_path, monkeypatch, rows: torch.Tensor, ranks=((0, 0), (1, 1))) -> None:
    """One SGLang launch with STS collection on: each (tp_rank, attn_tp_rank) of one DP group (dp_rank
    None, SGLang's value without DP) records the same rows, then the shutdown hook flushes."""
    import sglang.srt.runtime_context as rc
    from sglang.srt.speculative.dspark_components.dspark_sts import StsDataRecorder

    from sglang_dspark.sglang_plugin import sts

    recorders = []
    for tp_rank, attn_tp_rank in ranks:
        sts.run_id.cache_clear()  # each rank is its own process
        monkeypatch.setattr(rc, "get_parallel", lambda: SimpleNamespace(tp_rank=tp_rank, attn_tp_rank=attn_tp_rank,
                                                                        dp_rank=None))
        recorder = sts.per_rank_recorder(getattr(StsDataRecorder, "__wrapped__", StsDataRecorder))(
            path_stem=str(tmp_path / "sts"), gamma=4, flush_every=2)
        for row in rows:  # 3 rows, flush_every 2: one full shard and a partial one only the final flush writes
            recorder.record(confidence_raw=row.view(1, 4), num_correct_drafts=torch.tensor([1]))
        recorders.append(recorder)
    sts.flush_all()
    sts.run_id.cache_clear()


def test_sts_two_tp_ranks_two_launches_sglangs_fit_reads_each_row_once(tmp_path, monkeypatch):
    from sglang.benchmark.dspark_sts_fit import load_collected_shards

    first, second = torch.arange(12.0).view(3, 4), -torch.arange(12.0).view(3, 4) - 1
    _sts_launch(tmp_path, monkeypatch, first)
    written = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    _sts_launch(tmp_path, monkeypatch, second)  # relaunch: the first run's shards stay as they were
    assert all((tmp_path / name).read_bytes() == data for name, data in written.items())
    assert len(list(tmp_path.iterdir())) == 2 * len(written) == 4 and ".dpNone." not in " ".join(written)
    logits, _ = load_collected_shards(data_glob=str(tmp_path / "sts.*.pt"))  # SGLang's own fit tool
    assert sorted(map(tuple, logits.tolist())) == sorted(map(tuple, torch.cat([first, second]).tolist()))


def test_our_sts_shards_are_sglangs_own(tmp_path, monkeypatch):
    """The recorder writes its shards itself (atomically, and the shard being filled early): the
    same file names and contents as SGLang's StsDataRecorder.flush for the same rows."""
    import sglang.srt.runtime_context as rc
    from sglang.srt.speculative.dspark_components.dspark_sts import StsDataRecorder

    from sglang_dspark.sglang_plugin import sts

    base = getattr(StsDataRecorder, "__wrapped__", StsDataRecorder)
    monkeypatch.setattr(rc, "get_parallel", lambda: SimpleNamespace(tp_rank=0, attn_tp_rank=0, dp_rank=None))
    monkeypatch.setenv(sts.RUN_ID_ENV, "run")
    sts.run_id.cache_clear()
    ours = sts.per_rank_recorder(base)(path_stem=str(tmp_path / "ours" / "sts"), gamma=4, flush_every=2)
    theirs = base(path_stem=str(tmp_path / "theirs" / "sts.run.dp0"), gamma=4, flush_every=2)
    for i in range(3):
        row = dict(confidence_raw=torch.arange(4.0).view(1, 4) + i, num_correct_drafts=torch.tensor([i]))
        ours.record(**row)
        theirs.record(**row)
    ours.flush()
    theirs.flush()
    sts.run_id.cache_clear()
    names = sorted(p.name for p in (tmp_path / "theirs").iterdir())
    assert names == ["sts.run.dp0.0.pt", "sts.run.dp0.1.pt"] == sorted(p.name for p in (tmp_path / "ours").iterdir())
    for name in names:
        a, b = (torch.load(tmp_path / d / name) for d in ("ours", "theirs"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_sts_rows_survive_a_sigkill_and_sglangs_fit_reads_each_once(tmp_path):
    """A scheduler SIGKILLed mid-shard: its rows up to the last durable write are on disk, under
    names SGLang's fit tool reads exactly once (no row twice, no half-written shard)."""
    import signal

    from sglang.benchmark.dspark_sts_fit import load_collected_shards

    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time, torch
        from types import SimpleNamespace
        import sglang.srt.runtime_context as rc
        from sglang.srt.speculative.dspark_components.dspark_sts import StsDataRecorder
        from sglang_dspark.sglang_plugin import sts
        rc.get_parallel = lambda: SimpleNamespace(tp_rank=0, attn_tp_rank=0, dp_rank=0)
        sts.DURABLE_SECONDS = 0.0  # every step durable: the test kills right after the last one
        recorder = sts.per_rank_recorder(getattr(StsDataRecorder, "__wrapped__", StsDataRecorder))(
            path_stem={str(tmp_path / "sts")!r}, gamma=4, flush_every=4)
        for i in range(6):  # one full shard of 4 steps, then 2 steps of the next
            recorder.record(confidence_raw=torch.full((2, 4), float(i)), num_correct_drafts=torch.tensor([1, 2]))
        print("recorded", flush=True)
        time.sleep(600)  # killed by the test long before
    """)], stdout=subprocess.PIPE, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        assert writer.stdout.readline().strip() == "recorded"
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait(timeout=60)
    assert writer.returncode == -signal.SIGKILL  # no atexit flush ran
    logits, mask = load_collected_shards(data_glob=str(tmp_path / "sts.*.pt"))  # SGLang's own fit tool
    assert sorted(logits[:, 0].tolist()) == [float(i) for i in range(6) for _ in range(2)]
    assert mask.sum(1).tolist() == [1.0, 2.0] * 6


def test_sts_collection_is_refused_in_compact_mode():
    from sglang_dspark.sglang_plugin import sts

    compact = SimpleNamespace(_sts_collect_path="x", _planner=SimpleNamespace(is_compact_mode=True))
    with pytest.raises(ValueError, match="compact verify mode"):
        sts.refuse_compact_collection(None, compact)
    sts.refuse_compact_collection(None, SimpleNamespace(_sts_collect_path="", _planner=compact._planner))


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _learning_run(monkeypatch, attn_tp_size: int, steps: int = 64, before=None) -> dict:
    """Drive the observer hooks through `steps` synthetic steps whose time is a known function of
    (requests, tokens) on an injected clock; returns what the planner hook then hands the original.
    `before(observer)` runs on the started observer before the first step."""
    import sglang.srt.runtime_context as rc

    from sglang_dspark.sglang_plugin import observer
    from sglang_dspark.sglang_plugin.planner import around_budget

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.setattr(rc, "get_parallel", lambda: SimpleNamespace(attn_tp_rank=0, attn_tp_size=attn_tp_size))
    # the clock below charges each step before its hook: SGLang without overlap scheduling
    monkeypatch.setattr(rc, "get_schedule", lambda: SimpleNamespace(disable_overlap_schedule=True))
    monkeypatch.setattr(observer, "_OBSERVER", None)
    clock = _Clock()
    monkeypatch.setattr(observer.time, "perf_counter", clock)
    fake = SimpleNamespace(_planner=SimpleNamespace(_budget_planner=SimpleNamespace(last_decision=None)))
    if before is not None:
        started = observer.observer()
        started._start()
        before(started)
    for step in range(steps):
        bs, tokens = 1 + step % 3, (4, 8, 16, 24)[step % 4]
        kw = _observe_kwargs(bs, 7, verify_lens=(1, 1, 1), grid=(tokens,))  # a graph of `tokens` rows
        clock.now += 0.010 + 0.002 * bs + 0.0005 * tokens  # this host's step time, since the last step
        observer.around_observe_step(lambda obs, **k: None, fake, **kw)
        if step == steps // 2:
            observer.after_prefill_step(None, fake)  # a prefill step: the next interval is not timed
            clock.now += 0.5
    obs = observer.observer()
    obs.settle()  # the refit in flight (worker or thread): wait for it and adopt it
    seen = {}

    def original(*, history_survival_probs, sps_table, cfg):
        seen["table"] = sps_table
        return "decision"

    from sglang.srt.speculative.dspark_components import dspark_planner as P

    given = _tables()[1]
    seen["result"] = around_budget(original, history_survival_probs=torch.rand(2, 7), sps_table=given,
                                   cfg=P.DSparkScheduleConfig(gamma=7))
    seen.update(given=given, learned=observer.learned_table(), learner=obs.learner, observer=obs)
    if obs.worker is not None:
        obs.worker.close()
    return seen


def _assert_learned_the_hosts_step_times(seen) -> None:
    for bs, tokens in ((1, 4), (2, 16), (3, 24)):
        true = 0.010 + 0.002 * bs + 0.0005 * tokens
        predicted = 1.0 / seen["learned"].ours(tokens, num_requests=bs)
        assert abs(predicted - true) / true < 0.15, (bs, tokens, predicted, true)


def test_with_learning_the_original_planner_runs_on_the_table_learned_from_this_workers_steps(plugin_env, tmp_path,
                                                                                            monkeypatch):
    from sglang.srt.speculative.dspark_components.dspark_sps import SpsAdditiveCostTable

    _, path = _profile_with_tier(tmp_path)
    plugin_env(SGLANG_DSPARK_PROFILE=str(path), SGLANG_DSPARK_SPS_LEARNING="1")
    seen = _learning_run(monkeypatch, attn_tp_size=1)
    assert seen["result"] == "decision" and seen["learned"] is not None
    assert isinstance(seen["table"], SpsAdditiveCostTable) and seen["table"] is seen["learned"].table
    assert max(s.seconds for s in seen["learner"].samples) < 0.05  # the interval across the prefill was dropped
    _assert_learned_the_hosts_step_times(seen)


def test_refits_run_in_the_fit_worker_process_not_on_a_scheduler_thread(plugin_env, tmp_path, monkeypatch):
    _, path = _profile_with_tier(tmp_path)
    plugin_env(SGLANG_DSPARK_PROFILE=str(path), SGLANG_DSPARK_SPS_LEARNING="1")
    submitted = []

    def ready(obs):
        assert obs.worker.wait_ready(120), "the fit worker did not start"
        submit, poll = obs.worker.submit, obs.worker.poll
        monkeypatch.setattr(obs.worker, "submit", lambda *a: submitted.append(submit(*a)) or submitted[-1])
        # each refit back by the next step, however loaded the host: the same refits as a fast worker
        monkeypatch.setattr(obs.worker, "poll", lambda timeout=0.0: poll(60.0))

    seen = _learning_run(monkeypatch, attn_tp_size=1, before=ready)
    assert seen["observer"]._fitter is None  # no refit ran on a thread of this process
    assert all(submitted) and len(submitted) == seen["learner"].refits > 2  # each one in the worker
    _assert_learned_the_hosts_step_times(seen)


def test_a_crashed_fit_worker_falls_back_to_a_thread_and_says_so(plugin_env, tmp_path, monkeypatch, caplog):
    import signal

    _, path = _profile_with_tier(tmp_path)
    plugin_env(SGLANG_DSPARK_PROFILE=str(path), SGLANG_DSPARK_SPS_LEARNING="1")

    def crash(obs):
        assert obs.worker.wait_ready(120), "the fit worker did not start"
        os.kill(obs.worker.pid, signal.SIGKILL)
        obs.worker.proc.wait(timeout=60)

    with caplog.at_level("ERROR", logger="sglang_dspark.sglang_plugin.fitter"):
        seen = _learning_run(monkeypatch, attn_tp_size=1, before=crash)
    assert seen["observer"].worker.dead and seen["observer"]._fitter is not None
    assert [r for r in caplog.records if "fit worker" in r.getMessage() and "is gone" in r.getMessage()]
    _assert_learned_the_hosts_step_times(seen)  # the thread's refits kept the table learning


def _synchronous_worker(monkeypatch):
    """A `before` for _learning_run: the worker up, and each refit back by the next step."""
    def ready(obs):
        assert obs.worker.wait_ready(120), "the fit worker did not start"
        poll = obs.worker.poll
        monkeypatch.setattr(obs.worker, "poll", lambda timeout=0.0: poll(60.0))
    return ready


@pytest.mark.parametrize("where", ["worker", "thread"])
def test_the_learned_table_reaches_the_export_dir_and_snapshot_from_dir_makes_a_profile(plugin_env, tmp_path,
                                                                                        monkeypatch, capsys, where):
    from sglang_dspark.profile.cli import main as profile_main
    from sglang_dspark.profile.schema import SlaProfile
    from sglang_dspark.sglang_plugin import export

    profile, path = _profile_with_tier(tmp_path)
    plugin_env(SGLANG_DSPARK_PROFILE=str(path), SGLANG_DSPARK_SPS_LEARNING="1",
               SGLANG_DSPARK_EXPORT_DIR=str(tmp_path / "export"))
    monkeypatch.setattr(export, "EXPORT_SECONDS", 0.0)  # every refit writes (the worker gets it at start)
    before = _synchronous_worker(monkeypatch) if where == "worker" else lambda obs: obs.worker.close()
    seen = _learning_run(monkeypatch, attn_tp_size=1, before=before)
    assert (seen["observer"]._fitter is None) == (where == "worker")
    assert [p.name for p in (tmp_path / "export").iterdir()] == ["learned-sps.dp0.json"]  # no temp file left
    out = tmp_path / "learned.yaml"
    assert profile_main(["snapshot", "--from-dir", str(tmp_path / "export"), "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out}")
    snap = SlaProfile.load(out)  # validates
    assert snap.provenance.source == "snapshot" and snap.fingerprint == profile.fingerprint
    assert snap.sps.additive is not None and snap.sps.measurements
    table = snap.sps_table()
    for bs, tokens in ((1, 4), (2, 16), (3, 24)):  # what this host's steps cost, as the learner saw them
        true = 0.010 + 0.002 * bs + 0.0005 * tokens
        assert abs(1.0 / table(tokens, num_requests=bs) - true) / true < 0.15, (bs, tokens)
    assert profile_main(["snapshot", "--from-dir", str(tmp_path), "--out", str(out)]) == 2  # no learned file there
    assert "learned-sps.dp*.json" in capsys.readouterr().err


def test_with_attention_tp_the_learner_stays_off_and_every_rank_uses_the_profile(plugin_env, tmp_path, monkeypatch):
    _, path = _profile_with_tier(tmp_path)
    plugin_env(SGLANG_DSPARK_PROFILE=str(path), SGLANG_DSPARK_SPS_LEARNING="1")
    seen = _learning_run(monkeypatch, attn_tp_size=2)
    assert seen["learned"] is None and seen["table"] is seen["given"]


def test_the_table_source_says_flat_while_sglang_verifies_every_draft():
    from sglang_dspark.sglang_plugin.observer import StepObserver

    obs = StepObserver()
    assert obs._source(SimpleNamespace(is_verify_all=True)) == "flat"
    assert obs._source(SimpleNamespace(is_verify_all=False)) == "profile"
    from sglang.srt.speculative.dspark_components.dspark_planner import DSparkVerifyPlanner

    assert isinstance(inspect.getattr_static(DSparkVerifyPlanner, "is_verify_all"), property)  # what we read


def test_a_rank_that_neither_exports_nor_learns_stages_nothing(plugin_env, monkeypatch):
    import sglang.srt.runtime_context as rc

    from sglang_dspark.sglang_plugin import observer

    plugin_env()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "/nonexistent")  # metrics on, but this is attention-TP rank 1
    monkeypatch.setattr(rc, "get_parallel", lambda: SimpleNamespace(attn_tp_rank=1, attn_tp_size=2))
    monkeypatch.setattr(observer, "_OBSERVER", None)
    fake = SimpleNamespace(_planner=SimpleNamespace(_budget_planner=SimpleNamespace(last_decision=None)))
    for _ in range(3):
        observer.around_observe_step(lambda obs, **kw: None, fake, **_observe_kwargs(3, 7))
    obs = observer.observer()
    assert obs.exporting is False and obs.pending == [] and obs.last_info is None  # no copy was staged


def _hook_errors(hook: str) -> float:
    from sglang_dspark.sglang_plugin import guard

    errors, _ = guard._families()
    return sum(s.value for f in errors.collect() for s in f.samples
               if s.name.endswith("_total") and s.labels.get("hook") == hook)


def test_a_raising_budget_hook_gives_sglangs_own_budget_for_that_step_and_serving_goes_on(plugin_env, tmp_path,
                                                                                          monkeypatch):
    """Through SGLang's own caller (HostConfidenceBudgetPlanner): while the SLA decision raises,
    each step gets exactly SGLang's budget and is counted; once it stops raising, the SLA decision
    is back. SGLang's own exception is not swallowed."""
    from sglang.srt.plugins.hook_registry import HookType, _wrap_fn
    from sglang.srt.speculative.dspark_components import dspark_planner as P

    import sglang_dspark.core.schedule as schedule
    from sglang_dspark.sglang_plugin import guard
    from sglang_dspark.sglang_plugin.planner import BUDGET_HOOK, around_budget

    guard.reset()
    _, path = _profile_with_tier(tmp_path)
    plugin_env(SGLANG_DSPARK_PROFILE=str(path), SGLANG_DSPARK_SLA_TIER="interactive")
    original = getattr(P.compute_verify_token_budget, "__wrapped__", P.compute_verify_token_budget)
    monkeypatch.setattr(P, "compute_verify_token_budget", _wrap_fn(original, around_budget, HookType.AROUND))
    cfg = P.DSparkScheduleConfig(gamma=7)
    caller = P.HostConfidenceBudgetPlanner(sps_table=_tables()[1], cfg=cfg, model_runner=None, relay_lag_steps=2)
    real_sla = schedule.decide_budget_sla

    def broken(*a, **k):
        raise FloatingPointError("a numpy edge case")

    gen = torch.Generator().manual_seed(2)
    before = _hook_errors(BUDGET_HOOK)

    def step():
        bs = int(torch.randint(1, 16, (1,), generator=gen))
        conf = torch.rand(bs, 7, generator=gen)
        ones = torch.ones(bs, dtype=torch.int64)
        got = caller.compute_budget(confidence=conf, generation=ones, current_generation=ones,
                                    req_pool_indices_cpu=torch.arange(bs))
        return got, torch.cumprod(conf, dim=1)

    monkeypatch.setattr(schedule, "decide_budget_sla", broken)
    for _ in range(20):
        got, survival = step()
        assert got == original(history_survival_probs=survival, sps_table=_tables()[1], cfg=cfg).budget
    assert guard.failures(BUDGET_HOOK) == 20 and _hook_errors(BUDGET_HOOK) - before == 20
    assert not guard.is_off(BUDGET_HOOK)
    monkeypatch.setattr(schedule, "decide_budget_sla", real_sla)
    from sglang_dspark.core.sps import SpsTable

    ours = SpsTable(_load_profile(path).sps.additive)
    for _ in range(20):
        got, survival = step()
        assert got == real_sla(survival, ours, 20.0).budget  # the plugin's decision again
    assert guard.failures(BUDGET_HOOK) == 20

    def sglang_bug(**_):
        raise IndexError("SGLang's own")

    plugin_env()  # no tier: the original is what runs
    with pytest.raises(IndexError, match="SGLang's own"):
        around_budget(sglang_bug, history_survival_probs=torch.rand(2, 7), sps_table=_tables()[1], cfg=cfg)
    assert guard.failures(BUDGET_HOOK) == 20


def _load_profile(path):
    from sglang_dspark.profile.schema import SlaProfile

    return SlaProfile.load(path)


def test_a_raising_step_observer_steps_aside_and_sglangs_steps_go_on(plugin_env, monkeypatch, tmp_path):
    """SGLang's planner and DsparkStepObservers (tests/sglang_sim.py) with our AROUND hook: the first
    failure of our observer is logged and counted once, it is not called again, and SGLang's own
    step records keep coming."""
    from sglang_sim import SglangDspark

    from sglang_dspark.sglang_plugin import guard, observer

    guard.reset()
    plugin_env()
    monkeypatch.setattr(observer, "_OBSERVER", None)
    calls = []

    def broken(self, *a, **k):
        calls.append(1)
        raise OSError(28, "No space left on device")  # a full multiprocess directory

    monkeypatch.setattr(observer.StepObserver, "observe", broken)
    before = _hook_errors(observer.OBSERVER_HOOK)
    sim = SglangDspark("compact")
    try:
        original = type(sim.observers).observe_verify_step
        sim.observers.observe_verify_step = lambda **kw: observer.around_observe_step(original, sim.observers, **kw)
        rids = [f"r{i}" for i in range(3)]
        sim.prefill(rids)
        for _ in range(6):
            sim.step(rids)
        observer.after_prefill_step(None, sim.observers)  # the other observer hooks stand aside too
        records = sim.server_info()["internal_states"][0]["dspark_info_record"]["records"]
    finally:
        sim.close()
    assert len(records) == 6 and len(calls) == 1
    assert guard.is_off(observer.OBSERVER_HOOK) and _hook_errors(observer.OBSERVER_HOOK) - before == 1
    guard.reset()
