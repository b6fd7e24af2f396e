"""Slow: structured output from the shipped SmolLM2 DSpark pair with drafting forced on
(dspark_force_budget_frac 1.0): at T = 0 and T = 1 every json_schema answer validates, every
json_object answer parses, every /generate regex answer matches, and the step records show drafts
verified and accepted."""

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
                assert out["choices"][0]["finish_reason"] == "stop", out
                assert isinstance(json.loads(out["choices"][0]["message"]["content"]), dict)
                gen = httpx.post(f"{base}/generate", json={
                    "text": f"Question: is {prompt.lower()} easy? Answer:",
                    "sampling_params": {"max_new_tokens": 64, "temperature": temperature, "seed": i,
                                        "regex": REGEX}}, timeout=300).json()
                assert re.fullmatch(REGEX, gen["text"]), gen["text"]
        records = httpx.get(f"{base}/server_info").json()["internal_states"][0]["dspark_info_record"]["records"]
        assert sum(r["num_verify_tokens"] - r["bs"] for r in records) > 0  # drafts were verified
        assert sum(r["accepted_drafts"] for r in records) > 0
