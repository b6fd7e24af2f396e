"""`tool_choice: auto` under `--tool-call-parser`: the model's text, in its own call format, is
split by SGLang's FunctionCallParser (here `hermes`, the `<tool_call>{...}</tool_call>` format)
into content and OpenAI `tool_calls`, whole and while it streams; against the scripted fake engine
of test_server (one byte per output), so every chunk boundary of the call is exercised."""

from __future__ import annotations

import json

import pytest
import test_server
from fastapi.testclient import TestClient
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from test_server import FakeEngine, sse_events

from sglang_dspark.server import create_app

pytestmark = pytest.mark.sglang

CALL_REPLY = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lisbon"}}\n</tool_call>'
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
BODY = {"messages": [{"role": "user", "content": "Weather in Lisbon?"}], "tools": [WEATHER], "max_tokens": 200}


class ToolTemplateTokenizer(test_server.FakeTokenizer):
    def apply_chat_template(self, messages, add_generation_prompt: bool, tokenize: bool, tools=None) -> str:
        names = ",".join(t["function"]["name"] for t in tools or [])  # the tools reach the template
        return f"<tools>{names}" + super().apply_chat_template(messages, add_generation_prompt, tokenize)


class RoomyEngine(FakeEngine):
    max_len = 512  # the call's bytes are its tokens

    def __init__(self):
        super().__init__()
        self.tokenizer = ToolTemplateTokenizer()


@pytest.fixture
def client(monkeypatch):
    monkeypatch.setattr(test_server, "REPLY", CALL_REPLY)
    with TestClient(create_app(RoomyEngine(), tool_call_parser="hermes")) as c:
        yield c


@pytest.mark.parametrize("choice", [{"tool_choice": "auto"}, {}])  # auto is the default with tools
def test_a_call_in_the_models_format_is_answered_as_tool_calls(client, choice):
    r = client.post("/v1/chat/completions", json={**BODY, **choice})
    assert r.status_code == 200, r.text
    out = ChatCompletion.model_validate(r.json()).choices[0]
    assert out.finish_reason == "tool_calls"
    assert out.message.content == "Let me check."
    [call] = out.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Lisbon"}


def test_a_streamed_call_arrives_as_tool_call_deltas(client):
    r = client.post("/v1/chat/completions", json={**BODY, "tool_choice": "auto", "stream": True})
    assert r.status_code == 200, r.text
    chunks = [ChatCompletionChunk.model_validate(e) for e in sse_events(r.text)]
    deltas = [c.choices[0].delta for c in chunks]
    content = "".join(d.content or "" for d in deltas)
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert content.strip() == "Let me check."
    assert "<tool_call>" not in content and "get_weather" not in content  # the call is not sent as text too
    assert calls[0].id.startswith("call_") and calls[0].function.name == "get_weather"
    assert all(tc.index == 0 for tc in calls) and all(tc.id is None for tc in calls[1:])
    assert json.loads("".join(tc.function.arguments or "" for tc in calls)) == {"city": "Lisbon"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_text_without_a_call_stays_text(client, monkeypatch):
    monkeypatch.setattr(test_server, "REPLY", "It is sunny.")
    out = client.post("/v1/chat/completions", json=BODY).json()["choices"][0]
    assert out["finish_reason"] == "stop" and out["message"] == {"role": "assistant", "content": "It is sunny."}
    events = sse_events(client.post("/v1/chat/completions", json={**BODY, "stream": True}).text)
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events) == "It is sunny."
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    assert not any(e["choices"][0]["delta"].get("tool_calls") for e in events)


def test_auto_with_a_json_response_format_is_refused(client):
    r = client.post("/v1/chat/completions", json={**BODY, "response_format": {"type": "json_object"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"


def test_auto_refuses_parallel_tool_calls_false_it_could_not_keep(client):
    r = client.post("/v1/chat/completions", json={**BODY, "parallel_tool_calls": False})
    assert r.status_code == 400 and r.json()["error"]["param"] == "parallel_tool_calls"
    assert client.post("/v1/chat/completions", json={**BODY, "parallel_tool_calls": True}).status_code == 200


def test_an_unknown_parser_name_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="not one of SGLang's.*hermes"):
        create_app(RoomyEngine(), tool_call_parser="hermess")


def test_without_a_parser_auto_stays_refused(monkeypatch):
    monkeypatch.setattr(test_server, "REPLY", CALL_REPLY)
    with TestClient(create_app(RoomyEngine())) as c:
        r = c.post("/v1/chat/completions", json=BODY)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    assert "--tool-call-parser" in r.json()["error"]["message"]
