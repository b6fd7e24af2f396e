"""Prompt-token logprobs (OpenAI's echo): the target's log-softmax at every prompt position, equal to
transformers' within 1e-4, whatever the prefill chunking."""

import pytest
import torch
from engine_fixtures import tiny_engine, tiny_hf_target

from sglang_dspark.engine.sampling import SamplingParams


def hf_prompt_logprobs(hf, prompt):
    with torch.no_grad():
        logp = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].double(), -1)
    return logp[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:], dtype=torch.long)], logp[:-1]


@pytest.mark.parametrize("chunk", [4, 256])
def test_prompt_logprobs_equal_transformers_across_prefill_chunks(chunk):
    hf = tiny_hf_target()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(4, 48, (n,), generator=g).tolist() for n in (19, 2, 1)]  # a one-token prompt has no prompt logprob
    engine = tiny_engine("full", hf=hf, max_running=4, prefill_chunk=chunk)
    firsts = {}
    params = [SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=True, top_logprobs=3),
              SamplingParams(max_tokens=2, temperature=0.0), SamplingParams(max_tokens=2, prompt_logprobs=True)]
    for i, (p, sp) in enumerate(zip(prompts, params)):
        engine.submit(p, sp, lambda o, i=i: firsts.setdefault(i, o), f"r{i}")
    for _ in range(100):
        if len(firsts) == 3 and engine.idle:
            break
        engine.step()
    for i in (0, 2):
        want, logp = hf_prompt_logprobs(hf, prompts[i])
        got = firsts[i].prompt_logprobs
        assert [x.token_id for x in got] == prompts[i][1:]
        assert torch.allclose(torch.tensor([x.logprob for x in got], dtype=torch.double), want, atol=1e-4)
        if i == 0:  # the alternatives are the target's top 3 there
            assert [[t for t, _ in x.top] for x in got] == logp.topk(3, -1).indices.tolist()
    assert firsts[1].prompt_logprobs is None
