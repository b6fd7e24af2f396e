"""logit_bias in the reference engine: applied to the target's logits before verification on every
path, so greedy output is transformers' greedy output under the same bias (its `sequence_bias`) and
sampled output follows the biased target distribution."""

import pytest
import torch
from engine_fixtures import VOCAB, run_to_completion, tiny_engine, tiny_hf_target
from test_engine import ALPHA, chi2_pvalue, exact_marginals, jagged_sps

from sglang_dspark.engine.sampling import SamplingParams

MODES = (("target", None), ("full", None), ("scheduled", jagged_sps()))


def hf_biased_greedy(hf, prompt, n, bias: dict[int, float]):
    extra = {"sequence_bias": {(t,): b for t, b in bias.items()}} if bias else {}
    out = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n, min_new_tokens=n,
                      eos_token_id=None, pad_token_id=0, **extra)
    return out[0, len(prompt):].tolist()


class BiasedHF:
    """A transformers model whose logits carry a fixed bias: exact_marginals of the biased target."""

    def __init__(self, hf, bias: dict[int, float]):
        self.hf, self.bias = hf, torch.zeros(VOCAB)
        for t, b in bias.items():
            self.bias[t] = b

    def __call__(self, ids):
        out = self.hf(ids)
        out.logits = out.logits + self.bias
        return out


def test_banning_greedy_tokens_changes_them_and_every_path_agrees_with_transformers():
    hf = tiny_hf_target()
    prompts = [[5, 9, 11], [7, 7, 30, 12, 4], [40, 3]]
    plain = [hf_biased_greedy(hf, p, 16, {}) for p in prompts]
    # ban each prompt's first greedy tokens: the first comes from prefill, the others from verification
    bans = [{t: -100.0 for t in out[:4]} for out in plain]
    expected = [hf_biased_greedy(hf, p, 16, ban) for p, ban in zip(prompts, bans)]
    params = [SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, logit_bias=tuple(ban.items()))
              for ban in bans]
    for mode, sps in MODES:
        engine = tiny_engine(mode, hf=hf, sps=sps, max_running=4, learn_sps=False)
        outs = run_to_completion(engine, prompts, params)
        assert outs == expected, mode
        for out, before, ban in zip(outs, plain, bans):
            assert out[0] != before[0] and not set(out) & set(ban), mode
        if mode != "target":
            assert any(r.drafted for r in engine.records), mode  # the bias met verification


def test_a_positive_bias_makes_a_token_the_greedy_choice():
    engine = tiny_engine("full", max_running=2)
    out = run_to_completion(engine, [[5, 9, 11]], [SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True,
                                                                  logit_bias=((17, 100.0),))])
    assert out == [[17] * 6]


@pytest.mark.parametrize("mode,sps", [("full", None), ("scheduled", jagged_sps())])
def test_sampled_output_follows_the_biased_target_distribution(mode, sps):
    """Tokens 2 and 3 come from speculative verification; 4000 samples, chi-square at ALPHA. Power:
    the same samples reject the unbiased target's marginals, which differ from the biased ones."""
    hf = tiny_hf_target(peaky=12.0)
    prompt = [5, 9, 11]
    m2, _ = exact_marginals(hf, prompt)
    top = m2.argsort(descending=True)[:3].tolist()
    bias = {top[0]: -100.0, top[1]: -1.5, top[2]: 1.5}  # ban the likeliest, reweigh the next two
    b2, b3 = exact_marginals(BiasedHF(hf, bias), prompt)
    u2, u3 = exact_marginals(hf, prompt)
    engine = tiny_engine(mode, hf=hf, sps=sps, max_running=16, seed=3, learn_sps=False)
    params = [SamplingParams(max_tokens=3, temperature=1.0, ignore_eos=True, logit_bias=tuple(bias.items()))] * 4000
    outs = run_to_completion(engine, [prompt] * 4000, params)
    t2, t3 = [o[1] for o in outs], [o[2] for o in outs]
    assert chi2_pvalue(t2, b2) > ALPHA and chi2_pvalue(t3, b3) > ALPHA
    assert chi2_pvalue(t2, u2) < ALPHA and chi2_pvalue(t3, u3) < ALPHA
    assert sum(r.accepted_drafts for r in engine.records) > 200  # speculation really happened


def test_bias_values_and_ids_are_checked():
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias=((3, 101.0),))
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias=((3, 1.0), (3, 2.0)))


def test_a_draft_vocabulary_gets_the_bias_of_its_own_tokens_only():
    from sglang_dspark.engine.sampling import SamplingBatch

    params = [SamplingParams(logit_bias=((3, -5.0), (9, 2.0))), SamplingParams()]
    batch = SamplingBatch.build(params, torch.Generator())
    vocab = torch.tensor([10, 3, 7])  # column j is token vocab[j]; token 9 is not in it
    out = batch.biased(torch.zeros(2, 3), vocab=vocab)
    assert out.tolist() == [[0.0, -5.0, 0.0], [0.0, 0.0, 0.0]]


@pytest.mark.parametrize("vocab", [None, torch.tensor([10, 3, 7, 9, 0, 5])])
def test_the_greedy_draft_sampler_is_the_general_one_for_greedy_rows(vocab):
    """An all-greedy batch drafts with a shortcut (the argmax, no softmax, CDF or one-hot): the same
    tokens as the general sampler, logit_bias and a draft vocabulary included, and no distribution
    (its verification compares argmaxes)."""
    from sglang_dspark.engine.sampling import SamplingBatch

    params = [SamplingParams(temperature=0, logit_bias=((3, 4.0), (9, -100.0))), SamplingParams(temperature=0)]
    batch = SamplingBatch.build(params, torch.Generator())
    gen = torch.Generator().manual_seed(0)
    for k in range(20):
        logits = torch.randn(2, 6 if vocab is not None else 16, generator=gen) * 3
        tokens, probs = batch.draft_sampler(vocab)(logits, k)
        expected_probs = batch.probs(batch.biased(logits, vocab=vocab))
        assert probs is None
        assert torch.equal(tokens, batch.sample(expected_probs))


def test_verifying_sampled_rows_without_draft_probabilities_is_refused():
    """Only an all-greedy batch may verify drafts that came without their distributions
    (argmax_sampler); a sampled row would need them for rejection sampling."""
    from sglang_dspark.engine.sampling import SamplingBatch
    from sglang_dspark.engine.verification import verify_step

    drafts, lens = torch.tensor([[1, 2]]), torch.tensor([2])
    logits = torch.randn(3, 16)
    greedy = SamplingBatch.build([SamplingParams(temperature=0)], torch.Generator())
    num_acc, nxt = verify_step(greedy, drafts, None, logits, lens, torch.Generator())
    expected = 0 if int(logits[0].argmax()) != 1 else (1 if int(logits[1].argmax()) != 2 else 2)
    assert int(num_acc[0]) == expected and int(nxt[0]) == int(logits[expected].argmax())
    sampled = SamplingBatch.build([SamplingParams(temperature=1.0)], torch.Generator())
    with pytest.raises(ValueError, match="probabilities"):
        verify_step(sampled, drafts, None, logits, lens, torch.Generator())
