"""Logprobs are the target's own: every returned logprob equals transformers' log-softmax of the
target at that position (fp32, 1e-4), the top alternatives match, in all three engine modes, for
greedy and sampled requests; and the official openai client parses them."""

from __future__ import annotations

import httpx
import openai
import pytest
import torch
from engine_fixtures import OracleDrafter, TickClock, greedy_reference, tiny_engine, tiny_hf_target
from loopback_server import serve_engine_on_loopback

from sglang_dspark.core.sps import SpsTable

PROMPT = [5, 9, 11, 30, 7]
TOP = 4
# free verify tokens: scheduled mode verifies every draft it can
SPS = SpsTable.from_points([1, 64], [100.0, 100.0], max_batch_tokens=64)


@pytest.fixture(scope="module")
def hf():
    return tiny_hf_target(peaky=4.0)


@pytest.fixture(scope="module", params=["target", "full", "scheduled"])
def server(request, hf):
    # a tick clock: the learned table sees the same step times on every machine, so scheduled drafts
    engine = tiny_engine(request.param, hf=hf, sps=SPS, max_running=4, clock=TickClock())
    if engine.gamma:  # drafts the target accepts, so logprobs also come from the rows of accepted drafts
        engine.runner.drafter = OracleDrafter(engine.runner.drafter, PROMPT, greedy_reference(hf, PROMPT, 40))
    with serve_engine_on_loopback(engine) as (client, base):
        yield request.param, base, client


def target_logprobs(hf, prompt: list[int], output: list[int]) -> torch.Tensor:
    """[len(output), V]: the target's log-softmax at the position of each output token."""
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + output])).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1 : len(prompt) - 1 + len(output)], dim=-1)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_generate_logprobs_are_the_targets(server, hf, temperature):
    mode, base, engine = server
    body = {"input_ids": PROMPT, "return_logprob": True, "top_logprobs_num": TOP, "sampling_params": {
        "max_new_tokens": 24, "temperature": temperature, "seed": 7, "ignore_eos": True}}
    reply = httpx.post(f"{base}/generate", json=body, timeout=60).json()
    meta, out = reply["meta_info"], reply["output_ids"]
    chosen, tops = meta["output_token_logprobs"], meta["output_top_logprobs"]
    assert [token for _, token, _ in chosen] == out and len(out) == 24 and len(tops) == 24
    ref = target_logprobs(hf, PROMPT, out)
    got = torch.tensor([lp for lp, _, _ in chosen])
    torch.testing.assert_close(got, ref[torch.arange(24), torch.tensor(out)], rtol=0, atol=1e-4)
    for i, alternatives in enumerate(tops):
        values, ids = ref[i].topk(TOP)
        assert [t for _, t, _ in alternatives] == ids.tolist()
        torch.testing.assert_close(torch.tensor([lp for lp, _, _ in alternatives]), values, rtol=0, atol=1e-4)
    if mode != "target" and temperature == 0.0:  # logprobs of accepted drafts were checked too
        assert engine.call(lambda e: sum(r.accepted_drafts for r in e.records)).result(timeout=10) > 0


def _ids(tokens: list[str]) -> list[int]:
    return [int(t.strip()[1:]) for t in tokens]  # the toy tokenizer's " w12" is token 12


def test_openai_client_parses_chat_and_completion_logprobs(server, hf):
    _, base, _ = server
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)
    prompt_text = " ".join(f"w{t}" for t in PROMPT)
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": prompt_text}],
                                          max_tokens=12, temperature=0, logprobs=True, top_logprobs=TOP,
                                          extra_body={"ignore_eos": True})
    content = chat.choices[0].logprobs.content
    out = _ids([c.token for c in content])
    ref = target_logprobs(hf, PROMPT, out)
    assert len(out) == 12 and all(len(c.top_logprobs) == TOP for c in content)
    torch.testing.assert_close(torch.tensor([c.logprob for c in content]), ref[torch.arange(12), torch.tensor(out)],
                               rtol=0, atol=1e-4)
    assert _ids([t.token for t in content[0].top_logprobs]) == ref[0].topk(TOP).indices.tolist()

    completion = client.completions.create(model="tiny", prompt=prompt_text, max_tokens=12, temperature=0,
                                           logprobs=TOP, extra_body={"ignore_eos": True})
    lp = completion.choices[0].logprobs
    assert _ids(lp.tokens) == out and lp.token_logprobs == pytest.approx([c.logprob for c in content], abs=1e-6)
    assert lp.text_offset[0] == 0 and "".join(lp.tokens) == completion.choices[0].text
    assert all(len(alternatives) == TOP for alternatives in lp.top_logprobs)

    stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": prompt_text}],
                                            max_tokens=12, temperature=0, logprobs=True, stream=True,
                                            extra_body={"ignore_eos": True})
    streamed = [c.token for chunk in stream if chunk.choices and chunk.choices[0].logprobs
                for c in chunk.choices[0].logprobs.content]
    assert _ids(streamed) == out


def test_logprobs_absent_unless_asked_and_bad_requests_refused(server):
    _, base, _ = server
    plain = httpx.post(f"{base}/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "w5"}], "max_tokens": 3}, timeout=60).json()
    assert plain["choices"][0]["logprobs"] is None
    for path, body, param in (
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w5"}], "top_logprobs": 3}, "top_logprobs"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w5"}], "logprobs": True,
                                  "top_logprobs": 21}, "top_logprobs"),
        ("/generate", {"input_ids": [5], "return_logprob": True, "logprob_start_len": 1}, "logprob_start_len"),
    ):
        r = httpx.post(f"{base}{path}", json=body, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (path, r.text)
