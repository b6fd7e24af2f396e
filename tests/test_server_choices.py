"""Prompt logprobs (transformers' log-softmax within 1e-4): /v1/completions echo, the
lm-evaluation-harness request, /generate's logprob_start_len; n choices and prompt lists, streamed
and not, through the official openai client against the real engine."""

from __future__ import annotations

import httpx
import openai
import pytest
import torch
from engine_fixtures import tiny_engine, tiny_hf_target
from loopback_server import serve_engine_on_loopback

PROMPT = [5, 9, 11, 30, 7]


@pytest.fixture(scope="module")
def hf():
    return tiny_hf_target()


@pytest.fixture(scope="module")
def base(hf):
    with serve_engine_on_loopback(tiny_engine("full", hf=hf, max_running=8)) as (_, url):
        yield url


def words(ids) -> list[str]:
    return [f" w{i}" for i in ids]


def hf_logprobs(hf, ids: list[int]) -> torch.Tensor:
    """The target's log-probability of each of ids[1:] given what precedes it."""
    with torch.no_grad():
        logp = torch.log_softmax(hf(torch.tensor([ids])).logits[0].double(), -1)
    return logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]


def test_lm_eval_style_echo_request_answers_the_prompts_logprobs(base, hf):
    """lm-evaluation-harness's loglikelihood request: echo, logprobs 1, max_tokens 0."""
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x")
    out = client.completions.create(model="tiny", prompt=PROMPT, echo=True, logprobs=1, max_tokens=0, temperature=0)
    choice = out.choices[0]
    lp = choice.logprobs
    assert lp.tokens == words(PROMPT) and choice.text == "".join(words(PROMPT))
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert torch.allclose(torch.tensor(lp.token_logprobs[1:], dtype=torch.double), hf_logprobs(hf, PROMPT), atol=1e-4)
    assert all(len(t) == 1 for t in lp.top_logprobs[1:])
    assert out.usage.completion_tokens == 0 and out.usage.prompt_tokens == len(PROMPT)


@pytest.mark.parametrize("stream", [False, True])
def test_echo_with_a_completion_carries_the_logprobs_of_both(base, hf, stream):
    body = {"prompt": PROMPT, "echo": True, "logprobs": 0, "max_tokens": 4, "temperature": 0, "ignore_eos": True,
            "stream": stream}
    r = httpx.post(f"{base}/v1/completions", json=body, timeout=60)
    if stream:
        chunks = [c for c in _events(r.text) if c["choices"]]
        tokens = [t for c in chunks for t in c["choices"][0]["logprobs"]["tokens"]]
        lps = [x for c in chunks for x in c["choices"][0]["logprobs"]["token_logprobs"]]
        text = "".join(c["choices"][0]["text"] for c in chunks)
    else:
        lp = r.json()["choices"][0]["logprobs"]
        tokens, lps, text = lp["tokens"], lp["token_logprobs"], r.json()["choices"][0]["text"]
    ids = [int(t[2:]) for t in tokens]
    assert ids[:len(PROMPT)] == PROMPT and len(ids) == len(PROMPT) + 4 and text == "".join(tokens)
    assert lps[0] is None
    assert torch.allclose(torch.tensor(lps[1:], dtype=torch.double), hf_logprobs(hf, ids), atol=1e-4)


@pytest.mark.parametrize("start", [0, 3])
def test_generate_input_token_logprobs_from_logprob_start_len(base, hf, start):
    body = {"input_ids": PROMPT, "return_logprob": True, "logprob_start_len": start, "top_logprobs_num": 2,
            "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    meta = httpx.post(f"{base}/generate", json=body, timeout=60).json()["meta_info"]
    got = meta["input_token_logprobs"]
    assert [t for _, t, _ in got] == PROMPT[start:] and len(meta["input_top_logprobs"]) == len(PROMPT) - start
    want = hf_logprobs(hf, PROMPT)[max(start - 1, 0):]
    if start == 0:
        assert got[0][0] is None and meta["input_top_logprobs"][0] is None
        got = got[1:]
    assert torch.allclose(torch.tensor([lp for lp, _, _ in got], dtype=torch.double), want, atol=1e-4)


def _events(text: str) -> list[dict]:
    import json

    return [json.loads(line[6:]) for line in text.split("\n\n") if line.startswith("data: {")]


def test_n_choices_and_prompt_lists_in_order(base):
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x")
    greedy = {p: client.completions.create(model="tiny", prompt=p, max_tokens=5, temperature=0,
                                           extra_body={"ignore_eos": True}).choices[0].text
              for p in ("w5 w9", "w30 w1 w2")}
    out = client.completions.create(model="tiny", prompt=["w5 w9", "w30 w1 w2"], n=2, max_tokens=5, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert [c.text for c in out.choices] == [greedy["w5 w9"]] * 2 + [greedy["w30 w1 w2"]] * 2
    assert out.usage.completion_tokens == 20 and out.usage.prompt_tokens == 5
    ids = client.completions.create(model="tiny", prompt=[[5, 9], [30, 1, 2]], max_tokens=5, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert [c.text for c in ids.choices] == [greedy["w5 w9"], greedy["w30 w1 w2"]]


@pytest.mark.parametrize("stream", [False, True])
def test_chat_n_sampled_choices_are_distinct_and_reproducible(base, stream):
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x")

    def run() -> list[str]:
        kwargs = dict(model="tiny", messages=[{"role": "user", "content": "w5 w9 w11"}], n=3, max_tokens=8,
                      temperature=1.0, seed=5, extra_body={"ignore_eos": True})
        if not stream:
            out = client.chat.completions.create(**kwargs)
            assert out.usage.completion_tokens == 24  # 8 tokens each (EOS among them has no text)
            return [c.message.content for c in out.choices]
        texts, usage = [""] * 3, []
        for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs):
            for c in chunk.choices:
                texts[c.index] += c.delta.content or ""
            usage += [chunk.usage.completion_tokens] if chunk.usage is not None else []
        assert usage == [24]
        return texts

    first = run()
    assert first == run() and len(set(first)) > 1
