"""Grammar-constrained decoding (xgrammar) in the reference engine, lossless under speculation:
greedy constrained output is the same on every path, and sampled constrained output with drafting
follows the constrained target-only distribution (a two-sample chi-square, with a power check)."""

import re

import pytest
import torch
import xgrammar as xgr
from engine_fixtures import EOS, VOCAB, run_to_completion, tiny_engine, tiny_hf_target
from scipy import stats
from test_engine import ALPHA, jagged_sps

import sglang_dspark.engine.engine as engine_module
from sglang_dspark.engine.grammar import GrammarCompiler, GrammarSpec
from sglang_dspark.engine.sampling import SamplingParams

# single-digit words only: with a raw toy vocabulary " w1" would also be a legal prefix of " w11"
REGEX = r"( w5| w6| w7| w8| w9)( w3| w4| w6| w7| w9)( w5| w8| w9| w4)( w3| w4| w5)*"


@pytest.fixture(scope="module")
def compiler():
    info = xgr.TokenizerInfo([f" w{i}" for i in range(VOCAB)], vocab_type=xgr.VocabType.RAW, vocab_size=VOCAB,
                             stop_token_ids=[EOS])
    return GrammarCompiler(info)


def words(ids) -> str:
    return "".join(f" w{i}" for i in ids)


def test_greedy_constrained_output_is_legal_and_equal_on_every_path(compiler):
    hf = tiny_hf_target()
    grammar = compiler.compile(GrammarSpec("regex", REGEX))
    prompts = [[5, 9, 11], [7, 7, 30, 12, 4], [40, 3]]
    free = run_to_completion(tiny_engine("target", hf=hf), prompts,
                             [SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)] * 3)
    params = [SamplingParams(max_tokens=12, temperature=0.0, grammar=grammar)] * 3
    outs = {}
    for mode, sps in (("target", None), ("full", None), ("scheduled", jagged_sps())):
        engine = tiny_engine(mode, hf=hf, sps=sps, max_running=4, learn_sps=False)
        outs[mode] = run_to_completion(engine, prompts, params)
        if mode != "target":
            assert sum(r.accepted_drafts for r in engine.records) > 0, mode
    assert outs["full"] == outs["target"] and outs["scheduled"] == outs["target"]
    assert all(re.fullmatch(REGEX, words(o)) for o in outs["target"]), outs["target"]
    assert outs["target"] != free  # the grammar changed the answer


def _tokens_2_and_3(engine, prompt, grammar, n=4000):
    params = SamplingParams(max_tokens=3, temperature=1.0, ignore_eos=True, grammar=grammar)
    outs = run_to_completion(engine, [prompt] * n, [params] * n)
    return [o[1] for o in outs], [o[2] for o in outs]


def two_sample_pvalue(a, b) -> float:
    ca, cb = torch.bincount(torch.tensor(a), minlength=VOCAB), torch.bincount(torch.tensor(b), minlength=VOCAB)
    keep = (ca + cb) > 0
    return float(stats.chi2_contingency(torch.stack([ca[keep], cb[keep]]).numpy())[1])


def test_sampled_constrained_output_with_drafting_follows_the_constrained_target(compiler, monkeypatch):
    """4000 samples per engine; tokens 2 and 3 come from speculative verification. Power: with the
    verify rows left unmasked (only the draft masked) the same test rejects."""
    hf = tiny_hf_target(peaky=4.0)
    grammar = compiler.compile(GrammarSpec("regex", REGEX))
    prompt = [5, 9, 11]
    ref2, ref3 = _tokens_2_and_3(tiny_engine("target", hf=hf, max_running=16, seed=1), prompt, grammar)
    assert len(set(ref2)) >= 3 and len(set(ref3)) >= 3  # several legal continuations, unequal counts
    engine = tiny_engine("full", hf=hf, max_running=16, seed=2)
    t2, t3 = _tokens_2_and_3(engine, prompt, grammar)
    assert two_sample_pvalue(t2, ref2) > ALPHA and two_sample_pvalue(t3, ref3) > ALPHA
    assert sum(r.accepted_drafts for r in engine.records) > 500  # speculation really happened
    assert set(t2) <= {3, 4, 6, 7, 9} and set(t3) <= {4, 5, 8, 9}  # the regex's second and third words

    monkeypatch.setattr(engine_module, "constrain_ragged", lambda logits, *a: logits)
    bad2, bad3 = _tokens_2_and_3(tiny_engine("full", hf=hf, max_running=16, seed=2), prompt, grammar)
    assert min(two_sample_pvalue(bad2, ref2), two_sample_pvalue(bad3, ref3)) < ALPHA


def test_the_canary_replays_a_constrained_request_under_its_grammar(compiler, tmp_path):
    from test_canary import _drain

    engine = tiny_engine("full", hf=tiny_hf_target(), max_running=4, canary_share=1.0, canary_dir=str(tmp_path))
    params = SamplingParams(max_tokens=12, temperature=0.0, grammar=compiler.compile(GrammarSpec("regex", REGEX)))
    run_to_completion(engine, [[5, 9, 11], [40, 3]], [params] * 2)
    _drain(engine)
    assert engine.canary.replays == 2 and engine.canary.mismatches == 0
