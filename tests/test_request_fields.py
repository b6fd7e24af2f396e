"""The field policy (docs/REQUEST_FIELDS.md) against the installed `openai` package: every field of
its chat and completions request types is documented, and does what its class says against the
real engine: honoured fields change the answer as asked, inert ones leave the greedy text as it
is, refused ones are a 400 naming them (and accepted at their documented no-op value)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import xgrammar as xgr
from engine_fixtures import EOS, VOCAB, tiny_engine
from fastapi.testclient import TestClient
from openai.types import completion_create_params as completion_types
from openai.types.chat import completion_create_params as chat_types

from sglang_dspark.engine.async_engine import AsyncEngine
from sglang_dspark.engine.grammar import GrammarCompiler
from sglang_dspark.server import create_app

DOC = Path(__file__).resolve().parents[1] / "docs" / "REQUEST_FIELDS.md"
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
BASE = {CHAT: {"messages": [{"role": "user", "content": "w5 w9 w11"}], "max_tokens": 8, "temperature": 0,
               "ignore_eos": True},
        COMPLETIONS: {"prompt": "w5 w9 w11", "max_tokens": 8, "temperature": 0, "ignore_eos": True}}


def openai_fields(module) -> set[str]:
    return set(module.CompletionCreateParamsStreaming.__annotations__) | set(
        module.CompletionCreateParamsNonStreaming.__annotations__)


def documented(endpoint: str) -> dict[str, str]:
    """field -> policy from the endpoint's table in the doc."""
    section = DOC.read_text().split(f"## {endpoint}\n", 1)[1].split("\n## ", 1)[0]
    return {m[0]: m[1] for m in re.findall(r"^\| `(\w+)` \| (honoured|inert|refused) \|", section, re.M)}


@pytest.fixture(scope="module")
def client():
    engine = AsyncEngine(tiny_engine("full", max_running=8))
    engine.start()
    app = create_app(engine, served_model_name="tiny")
    # the toy tokenizer is not a transformers one: its grammar compiler is given, over its words
    app.state.grammar_compiler = GrammarCompiler(xgr.TokenizerInfo(
        [f" w{i}" for i in range(VOCAB)], vocab_type=xgr.VocabType.RAW, vocab_size=VOCAB, stop_token_ids=[EOS]))
    try:
        with TestClient(app) as c:
            yield c
    finally:
        engine.shutdown()


def text(body: dict, i: int = 0) -> str:
    choice = body["choices"][i]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def events(r) -> list[dict]:
    return [json.loads(line[6:]) for line in r.text.split("\n\n") if line.startswith("data: {")]


# Honoured fields: (extra body, check(response, baseline body)); each check sees the field's effect.
def _first_word(base):
    return int(text(base).split()[0][1:])


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
HONOURED = {
    "messages": ({"messages": [{"role": "user", "content": "w30 w1"}]},
                 lambda r, b: r.json()["usage"]["prompt_tokens"] != b["usage"]["prompt_tokens"]),
    "prompt": ({"prompt": [[30, 1], [5, 9, 11]]},
               lambda r, b: len(r.json()["choices"]) == 2 and text(r.json(), 1) == text(b)),
    "model": ({"model": "other"}, lambda r, b: r.status_code == 404 and r.json()["error"]["param"] == "model"),
    "max_tokens": ({"max_tokens": 3}, lambda r, b: r.json()["usage"]["completion_tokens"] == 3),
    "max_completion_tokens": ({"max_completion_tokens": 2}, lambda r, b: r.json()["usage"]["completion_tokens"] == 2),
    "temperature": ({"temperature": 1.0, "seed": 3, "n": 4},
                    lambda r, b: any(text(r.json(), i) != text(b) for i in range(4))),
    "top_p": ({"temperature": 1.0, "seed": 3, "n": 4, "top_p": 1e-6},  # the nucleus is the argmax alone
              lambda r, b: all(text(r.json(), i) == text(b) for i in range(4))),
    "stop": (None, lambda r, b: r.json()["choices"][0]["finish_reason"] == "stop" and len(text(r.json())) < len(text(b))),
    "seed": ({"temperature": 1.0, "seed": 11, "n": 2}, None),  # checked by sending it twice
    "n": ({"n": 3}, lambda r, b: [c["index"] for c in r.json()["choices"]] == [0, 1, 2]),
    "best_of": ({"n": 2, "best_of": 2}, lambda r, b: len(r.json()["choices"]) == 2),
    "echo": ({"echo": True}, lambda r, b: text(r.json()) == "w5 w9 w11" + text(b)),
    "logprobs": (None, lambda r, b: r.json()["choices"][0]["logprobs"] is not None),
    "top_logprobs": ({"logprobs": True, "top_logprobs": 2},
                     lambda r, b: all(len(t["top_logprobs"]) == 2 for t in r.json()["choices"][0]["logprobs"]["content"])),
    "logit_bias": (None, lambda r, b: text(r.json()).split()[0] != text(b).split()[0]),
    # a forced call is OpenAI's tool_calls (no JSON can be spelled from the toy words: its arguments are empty)
    "tools": ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}}},
              lambda r, b: [c["function"]["name"] for c in r.json()["choices"][0]["message"]["tool_calls"]] == ["f"]),
    "tool_choice": ({"tools": [TOOL], "tool_choice": "none"},
                    lambda r, b: text(r.json()) == text(b) and "tool_calls" not in r.json()["choices"][0]["message"]),
    # no JSON can be spelled from the toy words: the grammar leaves only the stop token
    "response_format": ({"response_format": {"type": "json_object"}}, lambda r, b: text(r.json()) == "" != text(b)),
    "stream": ({"stream": True}, lambda r, b: r.headers["content-type"].startswith("text/event-stream")),
    "stream_options": ({"stream": True, "stream_options": {"include_usage": True}},
                       lambda r, b: events(r)[-1]["usage"]["completion_tokens"] == 8),
}
INERT_VALUES = {"user": "u-1", "metadata": {"k": "v"}, "store": True, "service_tier": "flex",
                "safety_identifier": "s-1", "prompt_cache_key": "c-1", "prompt_cache_retention": "24h",
                "prediction": {"type": "content", "content": "w1 w2"}, "parallel_tool_calls": False}
# refused fields: (a value that would change the answer, the documented no-op value)
REFUSED = {"frequency_penalty": (0.5, 0), "presence_penalty": (-1.0, 0.0),
           "functions": ([TOOL["function"]], []),
           "function_call": ({"name": "f"}, "none"), "modalities": (["text", "audio"], ["text"]),
           "audio": ({"voice": "alloy", "format": "wav"}, None), "reasoning_effort": ("high", None),
           "verbosity": ("low", None), "web_search_options": ({}, None), "suffix": (" w3", "")}


def _honoured_body(field: str, endpoint: str, baseline: dict) -> dict:
    extra, _ = HONOURED[field]
    if field == "stop":
        extra = {"stop": text(baseline).split()[2]}
    elif field == "logprobs":
        extra = {"logprobs": True if endpoint == CHAT else 2}
    elif field == "logit_bias":
        extra = {"logit_bias": {str(_first_word(baseline)): -100}}
    return {**BASE[endpoint], **extra}


@pytest.mark.parametrize("endpoint,module", [(CHAT, chat_types), (COMPLETIONS, completion_types)])
def test_every_openai_request_field_is_honoured_inert_or_refused_by_name(client, endpoint, module):
    policy = documented(endpoint)
    fields = openai_fields(module)
    assert set(policy) == fields, f"{endpoint}: fields of openai's types vs the doc's table"
    baseline = client.post(endpoint, json=BASE[endpoint]).json()
    for field in sorted(fields):
        kind = policy[field]
        if kind == "honoured":
            body = _honoured_body(field, endpoint, baseline)
            r = client.post(endpoint, json=body)
            check = HONOURED[field][1]
            if check is None:  # seed: reproducible
                assert [text(r.json(), i) for i in (0, 1)] == [text(client.post(endpoint, json=body).json(), i)
                                                                for i in (0, 1)], field
            else:
                assert check(r, baseline), (endpoint, field, r.text[:300])
        elif kind == "inert":
            r = client.post(endpoint, json={**BASE[endpoint], field: INERT_VALUES[field]})
            assert r.status_code == 200 and text(r.json()) == text(baseline), (endpoint, field, r.text[:300])
        else:
            changing, no_op = REFUSED[field]
            r = client.post(endpoint, json={**BASE[endpoint], field: changing})
            assert r.status_code == 400 and r.json()["error"]["param"] == field, (endpoint, field, r.text[:300])
            assert field in r.json()["error"]["message"]
            ok = client.post(endpoint, json={**BASE[endpoint], field: no_op})
            assert ok.status_code == 200 and text(ok.json()) == text(baseline), (endpoint, field, ok.text[:300])


@pytest.mark.parametrize("endpoint", [CHAT, COMPLETIONS])
def test_an_unknown_field_is_refused_by_name(client, endpoint):
    r = client.post(endpoint, json={**BASE[endpoint], "temprature": 0.5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "temprature"


def test_best_of_beyond_n_is_refused(client):
    r = client.post(COMPLETIONS, json={**BASE[COMPLETIONS], "best_of": 3, "n": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "best_of"


# SGLang's chat extensions at their defaults, as sglang-router re-serialises every request it routes
SGLANG_DEFAULTS = {"continue_final_message": False, "skip_special_tokens": True, "separate_reasoning": True,
                   "stream_reasoning": True, "no_stop_trim": False, "return_hidden_states": False, "min_p": 0.0,
                   "min_tokens": 0, "repetition_penalty": 1.0, "top_k": -1, "lora_path": None,
                   "session_params": None, "chat_template_kwargs": None, "sampling_seed": None,
                   "stop_token_ids": None, "regex": None, "ebnf": None, "json_schema": None, "rid": None}


def test_sglang_extensions_at_their_defaults_are_accepted_and_change_nothing(client):
    baseline = client.post(CHAT, json=BASE[CHAT]).json()
    r = client.post(CHAT, json={**BASE[CHAT], **SGLANG_DEFAULTS})
    assert r.status_code == 200 and text(r.json()) == text(baseline), r.text
    r = client.post(CHAT, json={**BASE[CHAT], "continue_final_message": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message"
