"""Slow: structured output from the shipped SmolLM2 DSpark pair with drafting forced on
(dspark_force_budget_frac 1.0): at T = 0 and T = 1 every json_schema answer validates, every
json_object answer parses (or, sampled and cut by max_tokens, is a legal prefix of one), every
/generate regex answer matches, and the step records show drafts verified and accepted."""

import json
import re
from pathlib import Path

import httpx
import pytest
from loopback_server import serve_engine_on_loopback

from sglang_dspark.engine.engine import EngineConfig
from sglang_dspark.engine.factory import build_engine

DRAFT = Path(__file__).resolve().parents[1] / "launch" / "models" / "smollm2-135m-instruct-dspark"
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                           "age": {"type": "integer"}, "city": {"type": "string", "maxLength": 24}},
          "required": ["name", "age", "city"], "additionalProperties": False}
PROMPTS = ["Describe a fictional person as JSON with their name, age and city.",
           "Invent a customer record (name, age, city) for a bakery's loyalty program.",
           "Give the name, age and home city of a made-up astronaut."]
REGEX = r"(Yes|No), because [a-z ,]{4,60}\."


def valid(answer: dict) -> bool:
    return (set(answer) == {"name", "age", "city"} and isinstance(answer["name"], str)
            and isinstance(answer["city"], str) and isinstance(answer["age"], int)
            and not isinstance(answer["age"], bool))


def json_object_prefix(text: str) -> bool:
    """Whether `text` is a prefix of what OpenAI's json_object allows (xgrammar's own matcher)."""
    import xgrammar as xgr
    from transformers import AutoTokenizer

    from sglang_dspark import zoo
    from sglang_dspark.engine.grammar import GrammarCompiler, GrammarSpec

    tokenizer = AutoTokenizer.from_pretrained(zoo.resolve_model("smollm2-135m-instruct"))
    compiled = GrammarCompiler.for_tokenizer(tokenizer).compile(GrammarSpec("json_object"))
    return xgr.GrammarMatcher(compiled).accept_string(text)


@pytest.mark.slow
def test_structured_output_under_forced_drafting(smollm2_dir):
    engine = build_engine(smollm2_dir, DRAFT, config=EngineConfig(mode="scheduled", max_running=4, seed=0),
                          model_name="smollm2")
    with serve_engine_on_loopback(engine) as (_, base):
        r = httpx.post(f"{base}/set_internal_state", json={"server_args": {"dspark_force_budget_frac": 1.0}})
        assert r.status_code == 200
        for temperature in (0.0, 1.0):
            for i, prompt in enumerate(PROMPTS):
                messages = [{"role": "user", "content": prompt}]
                common = {"messages": messages, "max_tokens": 96, "temperature": temperature, "seed": i}
                fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
                out = httpx.post(f"{base}/v1/chat/completions", json={**common, "response_format": fmt},
                                 timeout=300).json()["choices"][0]
                assert out["finish_reason"] == "stop" and valid(json.loads(out["message"]["content"])), out
                out = httpx.post(f"{base}/v1/chat/completions",
                                 json={**common, "response_format": {"type": "json_object"}}, timeout=300).json()
                choice = out["choices"][0]
                if choice["finish_reason"] == "stop":
                    assert isinstance(json.loads(choice["message"]["content"]), dict)
                else:  # a sampled object may run past max_tokens: every character must still be legal
                    assert choice["finish_reason"] == "length" and temperature > 0, out
                    assert json_object_prefix(choice["message"]["content"]), out
                gen = httpx.post(f"{base}/generate", json={
                    "text": f"Question: is {prompt.lower()} easy? Answer:",
                    "sampling_params": {"max_new_tokens": 64, "temperature": temperature, "seed": i,
                                        "regex": REGEX}}, timeout=300).json()
                assert re.fullmatch(REGEX, gen["text"]), gen["text"]
        records = httpx.get(f"{base}/server_info").json()["internal_states"][0]["dspark_info_record"]["records"]
        assert sum(r["num_verify_tokens"] - r["bs"] for r in records) > 0  # drafts were verified
        assert sum(r["accepted_drafts"] for r in records) > 0


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string", "maxLength": 32},
                                                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                                                "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"timezone": {"type": "string", "maxLength": 32}}, "required": ["timezone"],
    "additionalProperties": False}}}


@pytest.mark.slow
def test_forced_tool_calls_validate_and_stream_the_same(smollm2_dir):
    import openai

    engine = build_engine(smollm2_dir, DRAFT, config=EngineConfig(mode="full", max_running=4, seed=0),
                          model_name="smollm2")
    with serve_engine_on_loopback(engine) as (_, base):
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="x")
        messages = [{"role": "user", "content": "What is the weather like in Lisbon right now?"}]
        named = {"type": "function", "function": {"name": "get_weather"}}
        kwargs = dict(model="smollm2", messages=messages, tools=[WEATHER, TIME], max_tokens=64, temperature=0)
        out = client.chat.completions.create(tool_choice=named, **kwargs).choices[0]
        assert out.finish_reason == "tool_calls" and out.message.content is None, out
        call = out.message.tool_calls[0]
        args = json.loads(call.function.arguments)
        assert call.function.name == "get_weather" and set(args) == {"city", "unit"}
        assert isinstance(args["city"], str) and args["unit"] in ("celsius", "fahrenheit")
        streamed = [c for chunk in client.chat.completions.create(tool_choice=named, stream=True, **kwargs)
                    for c in chunk.choices]
        deltas = [d for c in streamed for d in (c.delta.tool_calls or [])]
        assert [d.function.arguments for d in deltas] == [call.function.arguments]
        assert streamed[-1].finish_reason == "tool_calls"
        required = client.chat.completions.create(tool_choice="required", **kwargs).choices[0]
        assert required.finish_reason == "tool_calls"
        assert required.message.tool_calls[0].function.name in ("get_weather", "get_time")
        json.loads(required.message.tool_calls[0].function.arguments)
        refused = httpx.post(f"{base}/v1/chat/completions", json={"messages": messages, "tools": [WEATHER]})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "tool_choice"
