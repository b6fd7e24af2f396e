"""Call formats whose marker is a special token (mistral's `[TOOL_CALLS]`, llama 3's
`<|python_tag|>`): with tools given the text is decoded keeping special tokens, as SGLang does, so
its call parser sees the marker. Decoded by the engine's own OutputProcessor with a real Hugging
Face tokenizer (byte-level BPE, the marker added as a special token), so what the parser reads is
what the engine's detokenizer writes."""

from __future__ import annotations

import json
import threading

import pytest
from fastapi.testclient import TestClient
from test_server import FakeEngine, sse_events

from sglang_dspark.engine.output import OutputProcessor
from sglang_dspark.engine.request import Request
from sglang_dspark.server import create_app

pytestmark = pytest.mark.sglang

MARKER = "[TOOL_CALLS]"
CALL = ' [{"name": "get_weather", "arguments": {"city": "Lisbon"}}]'
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CHAT = {"messages": [{"role": "user", "content": "Weather in Lisbon?"}], "max_tokens": 200}
TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if tools %}tools: {{ tools | map(attribute='function.name') | join(',') }}\n{% endif %}assistant:")


def byte_level_tokenizer():
    """A real fast tokenizer: one token per byte (GPT-2's byte alphabet, no merges), EOS, and the
    call marker as an added special token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE({c: i for i, c in enumerate(alphabet)}, [], fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>")
    tokenizer.add_special_tokens({"additional_special_tokens": [MARKER]})
    tokenizer.chat_template = TEMPLATE
    return tokenizer


class DetokenizingEngine(FakeEngine):
    """Emits the marker token and then CALL's bytes, one token per output, through the engine's
    OutputProcessor with the request's own sampling parameters."""

    max_len = 1024

    def __init__(self):
        super().__init__()
        self.tokenizer = byte_level_tokenizer()
        self.reply = [self.tokenizer.convert_tokens_to_ids(MARKER)] + self.tokenizer.encode(CALL)
        self.output = OutputProcessor(self.tokenizer, {self.tokenizer.eos_token_id})

    def submit(self, prompt_ids, params, callback, request_id=None):
        self.submitted.append((list(prompt_ids), params, request_id))
        req = Request(request_id, list(prompt_ids), params, callback, 0.0)
        threading.Thread(target=self._emit, args=(req,)).start()
        return request_id

    def _emit(self, req: Request) -> None:
        for token in self.reply + [self.tokenizer.eos_token_id]:
            self.output.commit(req, [token])
            if req.finished:
                return


@pytest.fixture
def engine():
    return DetokenizingEngine()


@pytest.fixture
def client(engine):
    with TestClient(create_app(engine, tool_call_parser="mistral")) as c:
        yield c


def test_the_tokenizer_drops_the_marker_unless_asked_to_keep_it(engine):
    ids = engine.reply
    assert engine.tokenizer.decode(ids, skip_special_tokens=True) == CALL
    assert engine.tokenizer.decode(ids, skip_special_tokens=False) == MARKER + CALL


@pytest.mark.parametrize("router_defaults", [{}, {"skip_special_tokens": True}])  # as sglang-router re-sends
def test_a_call_behind_a_special_token_marker_is_answered_as_tool_calls(client, engine, router_defaults):
    r = client.post("/v1/chat/completions", json={**CHAT, "tools": [WEATHER], **router_defaults})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Lisbon"}
    assert not choice["message"]["content"]
    assert engine.submitted[-1][1].skip_special_tokens is False


def test_a_streamed_call_behind_the_marker_arrives_as_tool_call_deltas(client):
    r = client.post("/v1/chat/completions", json={**CHAT, "tools": [WEATHER], "stream": True})
    assert r.status_code == 200, r.text
    deltas = [e["choices"][0]["delta"] for e in sse_events(r.text)]
    calls = [tc for d in deltas for tc in d.get("tool_calls") or []]
    assert calls and calls[0]["function"]["name"] == "get_weather"
    assert json.loads("".join(tc["function"].get("arguments") or "" for tc in calls)) == {"city": "Lisbon"}
    assert MARKER not in "".join(d.get("content") or "" for d in deltas)
    assert sse_events(r.text)[-1]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize(("extra", "text"), [({}, CALL), ({"tool_choice": "none", "tools": [WEATHER]}, CALL),
                                             ({"skip_special_tokens": False}, MARKER + CALL)])
def test_without_tools_special_tokens_are_dropped_unless_the_client_keeps_them(client, extra, text):
    choice = client.post("/v1/chat/completions", json={**CHAT, **extra}).json()["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": text} and choice["finish_reason"] == "stop"


@pytest.mark.parametrize(("sampling", "text"), [({}, CALL), ({"skip_special_tokens": False}, MARKER + CALL)])
def test_generate_honours_skip_special_tokens(client, sampling, text):
    r = client.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 200, **sampling}})
    assert r.status_code == 200 and r.json()["text"] == text, r.text


def test_completions_honour_skip_special_tokens(client):
    body = {"prompt": "hi", "max_tokens": 200}
    assert client.post("/v1/completions", json=body).json()["choices"][0]["text"] == CALL
    kept = client.post("/v1/completions", json={**body, "skip_special_tokens": False}).json()
    assert kept["choices"][0]["text"] == MARKER + CALL
    r = client.post("/v1/completions", json={**body, "skip_special_tokens": "no"})
    assert r.status_code == 400

