"""The correctness canary: greedy requests replayed without speculation match token for token on
the real engine, and a deliberately broken verification is caught."""

from __future__ import annotations

import json

import pytest
import torch
from engine_fixtures import TickClock, run_to_completion, tiny_engine, tiny_hf_target

from sglang_dspark.core.sps import SpsTable
from sglang_dspark.engine import engine as engine_module
from sglang_dspark.engine.canary import MATCH, MISMATCH, NEAR_TIE, Canary, bf16_ulp, chosen, divergence_margin
from sglang_dspark.engine.cpu.formats import WeightFormat
from sglang_dspark.engine.request import Request
from sglang_dspark.engine.sampling import SamplingParams

FREE = SpsTable.from_points([1, 64], [100.0, 100.0], max_batch_tokens=64)  # verify tokens free: drafts get verified


def _prompts(n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(4, 40, (5,), generator=g).tolist() for _ in range(n)]


def _evidence(directory) -> list[dict]:
    """The canary's evidence records in `directory`, one per replay that differed."""
    return [json.loads(line) for line in (directory / "canary_mismatches.jsonl").read_text().splitlines()]


def _drain(engine, steps: int = 2000) -> None:
    """Step until the canary's queue is empty and nothing runs (replays are not user requests)."""
    for _ in range(steps):
        if engine.idle and not engine.canary.queue:
            return
        engine.step()
    raise AssertionError("replays did not finish")


def test_replays_match_on_the_real_engine(tmp_path):
    engine = tiny_engine("scheduled", hf=tiny_hf_target(), sps=FREE, max_running=4, learn_sps=False,
                         canary_share=1.0, canary_dir=str(tmp_path), clock=TickClock())  # the guard sees fixed times
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    sampled = SamplingParams(max_tokens=24, temperature=1.0, ignore_eos=True)
    run_to_completion(engine, _prompts(8), [greedy] * 6 + [sampled] * 2)
    _drain(engine)
    assert sum(r.accepted_drafts for r in engine.records) > 0  # the originals really speculated
    assert engine.canary.replays == 6 and engine.canary.mismatches == 0  # sampled requests are not replayed
    text = engine.metrics.render().decode()
    assert "sglang_dspark_canary_replays_total 6.0" in text and "sglang_dspark_canary_mismatches_total 0.0" in text
    assert "sglang_dspark_generation_tokens_total 192.0" in text  # replays are not counted as output
    assert not (tmp_path / "canary_mismatches.jsonl").exists()


def test_a_broken_verification_is_caught(tmp_path, monkeypatch):
    """A verifier that sometimes accepts the first rejected draft (a kernel bug): the replay, which
    verifies nothing, decodes the target's own tokens and the canary counts the difference."""
    real = engine_module.verify_step
    calls = {"n": 0}

    def broken(batch, drafts, draft_probs, logits, lens, shared):
        num_acc, nxt = real(batch, drafts, draft_probs, logits, lens, shared)
        calls["n"] += 1
        wrong = (num_acc < lens) & (calls["n"] % 5 == 0)  # every fifth step, one wrong draft slips through
        if bool(wrong.any()):
            i = int(wrong.nonzero()[0])
            nxt[i] = drafts[i, num_acc[i]]  # emit the rejected draft as if it were right
        return num_acc, nxt

    monkeypatch.setattr(engine_module, "verify_step", broken)
    engine = tiny_engine("full", hf=tiny_hf_target(), max_running=4, canary_share=1.0, canary_dir=str(tmp_path))
    run_to_completion(engine, _prompts(8), [SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)] * 8)
    _drain(engine)
    assert engine.canary.mismatches > 0 and engine.canary.replays == 8
    assert f"sglang_dspark_canary_mismatches_total {float(engine.canary.mismatches)}" in engine.metrics.render().decode()
    evidence = _evidence(tmp_path)
    assert len(evidence) == engine.canary.mismatches
    first = evidence[0]
    assert first["speculative"][: first["first_difference"]] == first["replayed"][: first["first_difference"]]
    assert first["speculative"][first["first_difference"]] != first["replayed"][first["first_difference"]]
    # the replay's argmax beat the slipped-through draft in its own logits: a margin, no near tie in float32
    assert all(e["margin_ulps"] > 0 and not e["near_tie"] and e["weight_format"] == "float32" for e in evidence)


def test_the_share_is_a_content_blind_hash():
    ids = [f"req-{i}" for i in range(4000)]
    share = sum(chosen(i, 0.05) for i in ids) / len(ids)
    assert 0.035 < share < 0.065 and chosen("req-1", 0.05) == chosen("req-1", 0.05)
    assert not any(chosen(i, 0.0) for i in ids) and all(chosen(i, 1.0) for i in ids)


def test_replays_wait_for_spare_capacity():
    """A replay takes a slot only when one is free and no user waits: users always go first."""
    engine = tiny_engine("target", max_running=2, canary_share=1.0)
    short = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    long = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    engine.submit([5, 6], short, lambda out: None, "a")
    engine.submit([7, 8], long, lambda out: None, "b")
    engine.submit([9, 10], long, lambda out: None, "c")  # waits: both slots are taken
    for _ in range(50):
        if any(r.id == "c" for r in engine.scheduler.running):
            break
        engine.step()
    assert len(engine.canary.queue) == 1  # "a" finished; its slot went to the waiting user, not the replay
    assert sorted(r.id for r in engine.scheduler.running) == ["b", "c"]
    _drain(engine)
    assert engine.canary.replays == 3 and engine.canary.mismatches == 0
    # the users' metrics count the users' 2 + 11 + 11 decode steps, not the replays' 24 more
    text = engine.metrics.render().decode()
    assert "sglang_dspark_accept_length_count 24.0" in text
    assert "sglang_dspark_inter_token_latency_seconds_count 24.0" in text


def test_the_prober_compares_a_dspark_server_with_a_target_only_one(tmp_path, monkeypatch):
    """The fleet-side canary: one server speculates (its verification broken for the second half),
    the other decodes target-only; the prober counts what differs."""
    import threading

    from sglang_dspark.canary_probe import CanaryCounters, probe
    from sglang_dspark.engine.async_engine import AsyncEngine
    from sglang_dspark.server import create_app
    from loopback_server import serve_on_loopback

    hf = tiny_hf_target()
    dspark = AsyncEngine(tiny_engine("full", hf=hf, max_running=2))
    reference = AsyncEngine(tiny_engine("target", hf=hf, max_running=2))
    prompts = [" ".join(f"w{t}" for t in p) for p in _prompts(4)]
    for e in (dspark, reference):
        e.start()
    try:
        with serve_on_loopback(create_app(dspark)) as d, serve_on_loopback(create_app(reference)) as r:
            metrics = CanaryCounters()
            assert probe(d, r, prompts, max_tokens=20, metrics=metrics) == (4, 0)
            real, broken_steps = engine_module.verify_step, {"n": 0}

            def broken_on_the_dspark_engine(batch, drafts, draft_probs, logits, lens, shared):
                num_acc, nxt = real(batch, drafts, draft_probs, logits, lens, shared)
                if threading.current_thread() is dspark._thread:  # the target-only engine stays correct
                    broken_steps["n"] += 1
                    wrong = num_acc < lens
                    nxt[wrong] = drafts[wrong, num_acc[wrong]]  # every rejected draft slips through
                return num_acc, nxt

            monkeypatch.setattr(engine_module, "verify_step", broken_on_the_dspark_engine)
            assert probe(d, r, prompts, max_tokens=20, metrics=metrics, evidence_dir=tmp_path) == (4, 4)
    finally:
        for e in (dspark, reference):
            e.shutdown()
    assert broken_steps["n"] > 0
    assert "sglang_dspark_canary_mismatches_total 4.0" in metrics.render().decode()
    assert len((tmp_path / "canary_mismatches.jsonl").read_text().splitlines()) == 4
    # the mismatches are the broken verification's: both servers finished every request normally
    # (a corrupted output may end early at an end-of-sequence token: "stop")
    reasons = _finish_reasons(dspark)
    assert set(reasons) <= {"length", "stop"} and sum(reasons.values()) == 8, reasons
    assert _finish_reasons(reference) == {"length": 8}  # 20 greedy tokens each, never aborted


def _finish_reasons(server) -> dict[str, int]:
    """The engine's finished requests by reason (sglang_dspark_requests_finished_total)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = server.engine.metrics.render().decode()
    return {s.labels["reason"]: int(s.value) for f in text_string_to_metric_families(text)
            if f.name == "sglang_dspark_requests_finished" for s in f.samples if s.name.endswith("_total")}


def test_a_replay_cut_short_by_shutdown_is_not_a_mismatch():
    """abort_all (shutdown, drain) ends a replay midway: that is no evidence either way, so it
    counts neither as a replay nor as a mismatch."""
    engine = tiny_engine("scheduled", hf=tiny_hf_target(), sps=FREE, max_running=4, learn_sps=False,
                         canary_share=1.0, clock=TickClock())
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    run_to_completion(engine, _prompts(2), [greedy] * 2)
    for _ in range(5):  # the replays start and emit a few tokens, not all 24
        engine.step()
    running = [r for r in engine.scheduler.running if r.replay_of is not None]
    assert running and all(0 < len(r.output_ids) < 24 for r in running)
    engine.abort_all()
    assert engine.canary.mismatches == 0 and engine.canary.replays == 0
    assert "sglang_dspark_canary_mismatches_total 0.0" in engine.metrics.render().decode()


def test_the_margin_at_the_first_difference_is_in_bfloat16_ulps_of_the_replays_logit():
    assert bf16_ulp(20.0) == 0.125 and bf16_ulp(-20.0) == 0.125 and bf16_ulp(1.0) == 2 ** -7 and bf16_ulp(0.75) == 2 ** -8
    logits = torch.full((3, 8), -5.0)
    logits[0, 1], logits[1, 2], logits[1, 6], logits[2, 3] = 9.0, 20.0, 19.75, 4.0
    plain = SamplingParams(temperature=0.0)
    assert divergence_margin([1, 2], logits, [1, 2, 3], plain) is None  # agrees so far
    assert divergence_margin([1, 2], logits, [1, 6], plain) == (20.0 - 19.75) / 0.125  # 2 ulps at 20
    assert divergence_margin([1, 2, 3], logits, [1, 2], plain) == float("inf")  # past the original's end
    # what greedy sampling compared: the logits plus the request's bias
    biased = SamplingParams(temperature=0.0, logit_bias=((6, 0.125),))
    assert divergence_margin([1, 2], logits, [1, 6], biased) == 1.0
    # the original ended on an EOS where the replay went on: its best EOS is the original's token
    assert divergence_margin([2], logits[1:], [], plain, end_ids={6, 3}) == 2.0
    # the original's token is illegal under the replay's grammar: no tie, whatever the logits
    legal = torch.ones(8, dtype=torch.bool)
    legal[6] = False
    assert divergence_margin([1, 2], logits, [1, 6], plain, legal=lambda: legal) == float("inf")
    assert divergence_margin([1, 2], logits, [1, 6], plain, legal=lambda: torch.ones(8, dtype=torch.bool)) == 2.0
    # the replay's own logits rank the original's token above its choice: what no rounding explains
    assert divergence_margin([1, 6], logits, [1, 2], plain) == -2.0


def _replayed(expected: list[int], output: list[int], margin: float | None) -> Request:
    req = Request("canary-1-req-7", [5, 6], SamplingParams(temperature=0.0), lambda out: None, arrival=0.0)
    req.tokens += output
    req.replay_of, req.expected, req.finish_reason, req.divergence_margin = "req-7", expected, "length", margin
    return req


def test_the_row_kernels_allow_no_rounding_and_aten_some():
    """On the batch-invariant row kernels a replay's bits are the original's: no near tie at all."""
    assert WeightFormat.of("int4", row_kernels=False).near_tie_ulps > 0
    assert WeightFormat.of("bfloat16").near_tie_ulps > 0
    assert WeightFormat.of("float32").near_tie_ulps is None
    if WeightFormat.of("int4").kernels is not None:
        assert WeightFormat.of("int4").near_tie_ulps is None and WeightFormat.of("int8").near_tie_ulps is None


@pytest.mark.skipif(WeightFormat.of("int4").kernels is None, reason="no row kernels on this CPU")
def test_on_the_row_kernels_even_an_exact_tie_is_a_mismatch(tmp_path):
    canary = Canary(1.0, tmp_path)
    assert canary.finished(_replayed([1, 2, 3], [1, 4, 3], 0.0), WeightFormat.of("int4")) == MISMATCH
    assert (canary.near_ties, canary.mismatches) == (0, 1)


def test_a_difference_within_the_formats_rounding_is_a_near_tie_and_beyond_it_a_mismatch(tmp_path):
    canary = Canary(1.0, tmp_path)
    int4, float32 = WeightFormat.of("int4", row_kernels=False), WeightFormat.of("float32")  # int4 on aten: rounds by batch
    allowed = int4.near_tie_ulps
    assert canary.finished(_replayed([1, 2, 3], [1, 2, 3], None), int4) == MATCH
    assert canary.finished(_replayed([1, 2, 3], [1, 4, 3], allowed), int4) == NEAR_TIE
    assert canary.finished(_replayed([1, 2, 3], [1, 4, 3], allowed + 0.5), int4) == MISMATCH
    assert canary.finished(_replayed([1, 2, 3], [1, 4, 3], 0.0), float32) == MISMATCH  # float32: not even a tie
    assert canary.finished(_replayed([1, 2], [1, 2, 3], None), int4) == MISMATCH  # no margin to judge by
    assert canary.finished(_replayed([1, 2, 3], [1, 4, 3], -1.0), int4) == MISMATCH  # below zero: no rounding
    assert (canary.replays, canary.near_ties, canary.mismatches) == (6, 1, 4)
    evidence = _evidence(tmp_path)
    assert [(e["near_tie"], e["margin_ulps"], e["weight_format"]) for e in evidence] == [
        (True, allowed, "int4"), (False, allowed + 0.5, "int4"), (False, 0.0, "float32"), (False, None, "int4"),
        (False, -1.0, "int4")]


def test_a_replay_knows_the_original_ended_on_eos():
    canary = Canary(1.0)
    for ended in (True, False):
        original = Request("req-1", [5, 6], SamplingParams(temperature=0.0), lambda out: None, arrival=0.0)
        original.tokens += [7, 8]
        original.finish_reason, original.ended_on_eos = "stop", ended
        canary.consider(original)
        replay = canary.next_request(lambda r: Request("canary-1", r.prompt_ids, r.params, lambda out: None,
                                                       arrival=0.0))
        assert replay.expected == [7, 8] and replay.expected_eos is ended


def _every_rejected_draft_slips_through(real):
    """A verifier that emits the first rejected draft of every row as if it were right."""
    def broken(batch, drafts, draft_probs, logits, lens, shared):
        num_acc, nxt = real(batch, drafts, draft_probs, logits, lens, shared)
        wrong = num_acc < lens
        nxt[wrong] = drafts[wrong, num_acc[wrong]]
        return num_acc, nxt

    return broken


def test_the_engines_margin_is_the_replays_own_logits_at_the_first_difference(tmp_path, monkeypatch):
    """The broken verification again, in float32 (batched rows equal a request's own): each kept
    margin equals the one recomputed from the target's logits at the replay's first difference."""
    monkeypatch.setattr(engine_module, "verify_step", _every_rejected_draft_slips_through(engine_module.verify_step))
    hf = tiny_hf_target()
    engine = tiny_engine("full", hf=hf, max_running=4, canary_share=1.0, canary_dir=str(tmp_path))
    run_to_completion(engine, _prompts(4), [SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)] * 4)
    _drain(engine)
    plain = tiny_engine("target", hf=hf, max_running=1)
    evidence = _evidence(tmp_path)
    assert evidence
    for e in evidence:
        i = e["first_difference"]
        row = plain.runner.prefill([(0, 0, e["prompt_ids"] + e["replayed"][:i])])[0].float()
        replayed, original = float(row[e["replayed"][i]]), float(row[e["speculative"][i]])
        assert e["margin_ulps"] == pytest.approx((replayed - original) / bf16_ulp(replayed), abs=0.01)


def test_the_engine_judges_a_replay_by_its_served_format_and_counts_near_ties_apart(monkeypatch):
    """The broken verification of the test above, the margin fixed (the engine's own is tested
    above): within the int4 allowance a near tie, not a mismatch; beyond it a mismatch."""
    monkeypatch.setattr(engine_module, "verify_step", _every_rejected_draft_slips_through(engine_module.verify_step))
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    aten_int4 = WeightFormat.of("int4", row_kernels=False)  # rounds by batch: an allowance
    for margin, near in ((aten_int4.near_tie_ulps, True), (aten_int4.near_tie_ulps * 2, False)):
        monkeypatch.setattr(engine_module, "divergence_margin", lambda *a, m=margin, **kw: m)
        engine = tiny_engine("full", hf=tiny_hf_target(), max_running=4, canary_share=1.0)
        engine.runner.target.fmt = aten_int4  # judged as int4 on aten's kernels rounds
        run_to_completion(engine, _prompts(4), [greedy] * 4)
        _drain(engine)
        c, text = engine.canary, engine.metrics.render().decode()
        assert c.replays == 4 and (c.near_ties, c.mismatches) == ((4, 0) if near else (0, 4))
        assert f"sglang_dspark_canary_near_ties_total {float(c.near_ties)}" in text
        assert f"sglang_dspark_canary_mismatches_total {float(c.mismatches)}" in text
