"""Reference engine: greedy equality with transformers, statistical equality of sampling, and
request lifecycle (EOS, max_tokens, stop strings, aborts, slot reuse)."""

import pytest
import torch
from engine_fixtures import EOS, VOCAB, TickClock, ToyTokenizer, run_to_completion, tiny_engine, tiny_hf_target
from scipy import stats

from sglang_dspark.core.sps import SpsTable
from sglang_dspark.engine.engine import EngineConfig
from sglang_dspark.engine.sampling import SamplingParams

ALPHA = 1e-3


def hf_greedy(hf, prompt, n):
    ids = torch.tensor([prompt])
    out = hf.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def jagged_sps():
    return SpsTable.from_points([1, 2, 4, 8, 16, 32], [100.0, 90.0, 85.0, 70.0, 50.0, 30.0], max_batch_tokens=64)


def test_greedy_output_equals_transformers_in_every_mode():
    hf = tiny_hf_target()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, VOCAB, (int(n),), generator=g).tolist() for n in torch.randint(3, 40, (10,), generator=g)]
    expected = [hf_greedy(hf, p, 24) for p in prompts]
    params = [SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)] * len(prompts)
    # scheduled: a static table, the table learned online from nothing, and a seed scaled to this
    # host; the learned cuts depend on measured times only, never on this step's drafts
    for mode, sps, learn in (("target", None, False), ("full", None, False), ("scheduled", jagged_sps(), False),
                             ("scheduled", None, True), ("scheduled", jagged_sps(), True)):
        engine = tiny_engine(mode, hf=hf, sps=sps, max_running=4, prefill_chunk=32, learn_sps=learn)
        assert run_to_completion(engine, prompts, params) == expected, (mode, sps is not None, learn)


def test_all_greedy_batches_draft_without_distributions_and_mixed_ones_with():
    """The argmax-only draft path is taken exactly when every row is greedy (the verifier then
    compares argmaxes); one sampled row brings the distributions back. Greedy output still equals
    transformers' in both."""
    hf = tiny_hf_target()
    prompt = [5, 9, 11, 3]
    expected = hf_greedy(hf, prompt, 12)
    for params, want_probs in (([SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)] * 2, False),
                               # the sampled row outlasts the greedy one (100 tokens take > 12 steps of <= 1 + gamma)
                               ([SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
                                 SamplingParams(max_tokens=100, temperature=1.0, ignore_eos=True, seed=1)], True)):
        engine = tiny_engine("full", hf=hf, max_running=2)
        seen, original = [], engine.runner.drafter.draft

        def recording(*args, **kwargs):
            out = original(*args, **kwargs)
            seen.append(out.probs is not None)
            return out

        engine.runner.drafter.draft = recording
        outputs = run_to_completion(engine, [prompt, prompt], params)
        assert outputs[0] == expected and seen and set(seen) == {want_probs}


def exact_marginals(hf, prompt):
    """Exact target marginals of output tokens 2 and 3 (tokens 1 comes from prefill)."""
    with torch.no_grad():
        p1 = torch.softmax(hf(torch.tensor([prompt])).logits[0, -1].double(), -1)
        seq2 = torch.tensor([prompt + [a] for a in range(VOCAB)])
        p2_given = torch.softmax(hf(seq2).logits[:, -1].double(), -1)  # [a, b]
        joint12 = p1[:, None] * p2_given
        seq3 = torch.tensor([prompt + [a, b] for a in range(VOCAB) for b in range(VOCAB)])
        p3_given = torch.softmax(hf(seq3).logits[:, -1].double(), -1).view(VOCAB, VOCAB, VOCAB)
    return joint12.sum(0), (joint12[:, :, None] * p3_given).sum((0, 1))


def chi2_pvalue(samples, probs):
    counts = torch.bincount(torch.tensor(samples), minlength=VOCAB).double()
    expected = probs * counts.sum()
    big = expected >= 5  # pool the cells too small for Pearson's approximation
    obs, exp = counts[big], expected[big]
    if not bool(big.all()):
        obs = torch.cat([obs, counts[~big].sum().view(1)])
        exp = torch.cat([exp, expected[~big].sum().view(1)])
    return float(stats.chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue)


def sample_tokens_2_and_3(engine, prompt, n, seed):
    params = [SamplingParams(max_tokens=3, temperature=1.0, ignore_eos=True)] * n
    outs = run_to_completion(engine, [prompt] * n, params)
    return [o[1] for o in outs], [o[2] for o in outs]


@pytest.mark.parametrize("learn,min_accepted", [(False, 500), (True, 200)])
def test_sampled_output_follows_the_target_distribution(learn, min_accepted):
    """Tokens 2 and 3 are the first ones produced by speculative verification. 4000 samples per
    prompt; chi-square at ALPHA = 1e-3. Power: the same harness rejects a drafter whose reported
    probabilities are not the ones it sampled from (next test).

    With `learn` the cuts come from a table refitted online from this engine's step times (a tick
    clock, so every machine measures the same times and drafting is really exercised; changing as
    the run goes): still exact, because each step's capacity is a
    function of earlier steps only (their times and lagged confidences) and the allocation is
    top-K over this step's non-increasing survivals, so no draft's admission depends on itself."""
    hf = tiny_hf_target(peaky=12.0)
    for prompt in ([5, 9, 11], [7, 7, 30, 12, 4]):
        m2, m3 = exact_marginals(hf, prompt)
        engine = tiny_engine("scheduled", hf=hf, sps=jagged_sps(), max_running=16, seed=len(prompt), learn_sps=learn,
                             clock=TickClock() if learn else None)
        # a tick clock's step times follow its reads, not the work: the time margin on them would price
        # drafting out for one prompt, and what is under test is exactness while the table changes
        engine.policy.time_margin = False
        t2, t3 = sample_tokens_2_and_3(engine, prompt, 4000, seed=0)
        assert chi2_pvalue(t2, m2) > ALPHA and chi2_pvalue(t3, m3) > ALPHA
        accepted = sum(r.accepted_drafts for r in engine.records)
        assert accepted > min_accepted  # speculation really happened
        assert (engine.policy.learner is not None and engine.policy.learner.refits > 1) == learn


def test_biased_verification_is_detected_by_the_same_harness():
    hf = tiny_hf_target(peaky=12.0)
    prompt = [5, 9, 11]
    m2, m3 = exact_marginals(hf, prompt)
    engine = tiny_engine("full", hf=hf, max_running=16)
    original = engine.runner.drafter.draft

    def misreported(*args, **kwargs):  # claims uniform draft probabilities
        out = original(*args, **kwargs)
        out.probs = torch.full_like(out.probs, 1.0 / VOCAB)
        return out

    engine.runner.drafter.draft = misreported
    t2, t3 = sample_tokens_2_and_3(engine, prompt, 4000, seed=0)
    assert min(chi2_pvalue(t2, m2), chi2_pvalue(t3, m3)) < ALPHA


def test_eos_max_tokens_and_stop_strings():
    engine = tiny_engine("full")
    forced_eos = SamplingParams(max_tokens=50, temperature=0.0)
    out = run_to_completion(engine, [[5, 6, 7]], [SamplingParams(max_tokens=7, temperature=0.0, ignore_eos=True)])[0]
    assert len(out) == 7
    texts, reasons = [], []
    stop_word = ToyTokenizer().decode(out[2:3]).strip()

    def cb(o):
        texts.append(o.text)
        if o.finished:
            reasons.append(o.finish_reason)

    engine.submit([5, 6, 7], SamplingParams(max_tokens=7, temperature=0.0, ignore_eos=True, stop=(stop_word,)), cb)
    for _ in range(50):
        engine.step()
    assert reasons == ["stop"] and stop_word not in "".join(texts)
    full = ToyTokenizer().decode(out)
    assert "".join(texts) == full[: full.find(stop_word)]
    # EOS ends a request without being emitted as text.
    eos_engine = tiny_engine("full")
    eos_engine.output.eos_ids = set(range(VOCAB))  # every token is EOS now
    result = run_to_completion(eos_engine, [[5, 6]], [forced_eos])[0]
    assert result == [] and EOS in eos_engine.output.eos_ids


def test_abort_frees_the_slot_and_slots_are_reused():
    engine = tiny_engine("scheduled", max_running=2)
    finished = []
    rid = engine.submit([5, 6, 7], SamplingParams(max_tokens=200, temperature=1.0), lambda o: o.finished and finished.append(o.finish_reason))
    for _ in range(3):
        engine.step()
    assert engine.num_running == 1
    engine.abort(rid)
    engine.step()
    assert engine.num_running == 0 and finished == ["abort"]
    outs = run_to_completion(engine, [[5]] * 6, [SamplingParams(max_tokens=5, temperature=1.0, ignore_eos=True)] * 6)
    assert [len(o) for o in outs] == [5] * 6


def test_prompt_that_does_not_fit_is_refused():
    engine = tiny_engine("full")
    try:
        engine.submit(list(range(5, 45)) * 7, SamplingParams(max_tokens=10), lambda o: None)
    except ValueError as err:
        assert "context limit" in str(err)
    else:
        raise AssertionError("an oversized prompt must be refused")


def _documented_drafts(steps: int, every: int, cap: int) -> int:
    """Drafter runs in `steps` decode steps where no draft pays, as the policy documents them: the
    first step measures, then a probe after `every` undrafted steps, the wait doubling up to `cap`."""
    drafts, step, wait = 1, 1, every
    while step + wait < steps:
        step += wait + 1
        drafts += 1
        wait = min(2 * wait, cap)
    return drafts


def test_scheduled_engine_skips_the_drafter_when_no_draft_pays_and_probes_periodically():
    hf = tiny_hf_target()
    steep = SpsTable.from_points([1, 2], [100.0, 1.0], max_batch_tokens=64)  # any draft halves throughput
    engine = tiny_engine("scheduled", hf=hf, sps=steep, max_running=1, probe_every=4, learn_sps=False, clock=TickClock())
    calls = []
    original = engine.runner.drafter.draft
    engine.runner.drafter.draft = lambda *a, **k: calls.append(1) or original(*a, **k)
    out = run_to_completion(engine, [[5, 9, 11]], [SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)])[0]
    assert out == hf_greedy(hf, [5, 9, 11], 30)
    steps = len(engine.records)
    # The first step drafts only to measure (one draft verified: an outcome for the lag calibration);
    # then one probe in every probe_every + 1 steps, since the measured confidences make no draft
    # worth verifying.
    first = list(engine.records)[0]
    assert first.budget == 1 and first.num_verify_tokens == 2 and first.draft_ms > 0
    assert len(calls) == _documented_drafts(steps, every=4, cap=EngineConfig.probe_max) >= 3 and len(calls) < steps
    assert all(r.accepted_drafts == 0 for r in list(engine.records)[1:] if r.num_verify_tokens == 1)


def test_scheduled_engine_measures_first_then_drafts_where_drafting_pays():
    """The measuring step costs one step's speculation; with a table where drafts pay, the
    next step already verifies drafts (the new request inherits the measured prior)."""
    hf = tiny_hf_target()
    cheap = SpsTable.from_points([1, 64], [100.0, 100.0], max_batch_tokens=64)  # verify tokens are free
    engine = tiny_engine("scheduled", hf=hf, sps=cheap, max_running=1, learn_sps=False, clock=TickClock())
    out = run_to_completion(engine, [[5, 9, 11]], [SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)])[0]
    assert out == hf_greedy(hf, [5, 9, 11], 20)
    budgets = [r.budget for r in engine.records]
    assert budgets[0] == 1 and all(b > 0 for b in budgets[1:])  # the measuring step verifies one draft


def test_probes_back_off_and_new_requests_use_the_observed_prior():
    hf = tiny_hf_target()
    steep = SpsTable.from_points([1, 2], [100.0, 1.0], max_batch_tokens=64)
    engine = tiny_engine("scheduled", hf=hf, sps=steep, max_running=1, probe_every=4, probe_max=16, learn_sps=False, clock=TickClock())
    calls = []
    original = engine.runner.drafter.draft
    engine.runner.drafter.draft = lambda *a, **k: calls.append(1) or original(*a, **k)
    params = SamplingParams(max_tokens=120, temperature=0.0, ignore_eos=True)
    assert run_to_completion(engine, [[5, 9, 11]], [params])[0] == hf_greedy(hf, [5, 9, 11], 120)
    steps = len(engine.records)
    # 1 measuring draft, then probes after 4, 8, 16, 16, ... undrafted steps
    assert len(calls) == _documented_drafts(steps, every=4, cap=16) == 9 and steps > 100
    first = len(calls)
    run_to_completion(engine, [[7, 3]], [SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)])
    assert len(calls) == first  # the new request inherits the observed (worthless) confidences


def test_server_info_reports_sglangs_avg_spec_accept_length():
    """bench_serving prints it from internal_states[0]: committed tokens per request per decode
    step (the bonus token included), exactly 1 when no draft is ever accepted, absent without
    speculation, and kept (cumulative, as SGLang's) when the step records are cleared."""
    from engine_fixtures import RejectedDrafter, greedy_reference, tiny_drafter_for

    from sglang_dspark.engine.engine import Engine
    from sglang_dspark.engine.target_model import TargetModel

    params = [SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)]
    target_only = tiny_engine("target")
    run_to_completion(target_only, [[5, 9, 14]], params)
    assert "avg_spec_accept_length" not in target_only.server_info()["internal_states"][0]

    full = tiny_engine("full")
    assert "avg_spec_accept_length" not in full.server_info()["internal_states"][0]  # no step yet
    run_to_completion(full, [[5, 9, 14], [7, 3]], params * 2)
    records = list(full.records)
    expected = sum(r.bs + r.accepted_drafts for r in records) / sum(r.bs for r in records)
    assert sum(r.accepted_drafts for r in records) > 0
    assert full.server_info()["internal_states"][0]["avg_spec_accept_length"] == pytest.approx(expected)
    full.records.clear()
    assert full.server_info()["internal_states"][0]["avg_spec_accept_length"] == pytest.approx(expected)

    hf, prompt = tiny_hf_target(), [5, 9, 14, 22, 7]
    target = TargetModel.from_hf_model(hf)
    inner = tiny_drafter_for(target)
    rejected = Engine(target, ToyTokenizer(), RejectedDrafter(inner, prompt, greedy_reference(hf, prompt, 40)),
                      config=EngineConfig(mode="full", max_running=2, max_len=256), model_name="tiny")
    run_to_completion(rejected, [prompt], params)
    assert rejected.server_info()["internal_states"][0]["avg_spec_accept_length"] == 1.0
