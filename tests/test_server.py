"""HTTP surface of the DSpark server against a scripted fake engine (no model, milliseconds)."""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import Future

import pytest
from fastapi.testclient import TestClient

from sglang_dspark.engine.request import ContextLengthError, RequestOutput
from sglang_dspark.server import create_app

REPLY = "Hello there"


class FakeTokenizer:
    """Byte-level: one token per UTF-8 byte, and a visible chat template."""

    def __len__(self) -> int:
        return 256

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode())

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return bytes(ids).decode(errors="replace")

    def apply_chat_template(self, messages, add_generation_prompt: bool, tokenize: bool) -> str:
        assert add_generation_prompt and not tokenize
        if messages[0]["role"] == "assistant":
            raise ValueError("conversation must not start with the assistant")
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


class FakeMetrics:
    def render(self) -> bytes:
        return b"sglang_dspark_verify_steps_total 3.0\n"


class FakeEngine:
    """Replies REPLY one byte per output from its own thread, like the real engine's callbacks.
    With `hold` set it sends one token and then waits until aborted."""

    model_name = "fake-model"
    max_len = 64
    max_in_flight = 64
    alive = True

    def __init__(self):
        self.tokenizer = FakeTokenizer()
        self.metrics = FakeMetrics()
        self.submitted: list[tuple[list[int], object, str]] = []
        self.aborted: list[str] = []
        self.hold = False
        self.stuck = False
        self.knobs: list = []
        self.busy = False
        self._abort_events: dict[str, threading.Event] = {}

    def submit(self, prompt_ids, params, callback, request_id=None):
        if not prompt_ids:
            raise ValueError("prompt: must contain at least one token")
        if len(prompt_ids) + params.max_tokens > self.max_len:
            raise ContextLengthError(f"prompt ({len(prompt_ids)} tokens) plus max_tokens ({params.max_tokens}) "
                                     f"exceeds the context limit of {self.max_len} tokens")
        self.submitted.append((list(prompt_ids), params, request_id))
        self._abort_events[request_id] = event = threading.Event()
        threading.Thread(target=self._run, args=(prompt_ids, params, callback, request_id, event)).start()
        return request_id

    def _run(self, prompt_ids, params, callback, rid, aborted: threading.Event) -> None:
        reply = REPLY.encode()[: params.max_tokens]
        if self.stuck:  # produces nothing until aborted
            aborted.wait(5)
        for i, tok in enumerate(reply):
            if self.hold and i == 1:
                aborted.wait(5)
            if aborted.is_set():
                callback(RequestOutput(rid, [], "", True, "abort", len(prompt_ids), i))
                return
            last = i == len(reply) - 1
            reason = ("length" if len(reply) == params.max_tokens else "stop") if last else None
            callback(RequestOutput(rid, [tok], chr(tok), last, reason, len(prompt_ids), i + 1))

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self._abort_events[request_id].set()

    def model_info(self) -> dict:
        return {"model_path": "/models/fake", "tokenizer_path": "/models/fake", "is_generation": True}

    def server_info(self) -> Future:
        return _done({"internal_states": [{"dspark_info_record": {"mode": "scheduled", "gamma": 4, "records": []}}]})

    def flush_cache(self) -> Future:
        return _done(not self.busy)

    def set_internal_state(self, force_budget_frac=..., clear_records=False) -> Future:
        self.knobs.append((force_budget_frac, clear_records))
        return _done(None if force_budget_frac is ... else force_budget_frac)


def _done(value) -> Future:
    future = Future()
    future.set_result(value)
    return future


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def client(engine):
    with TestClient(create_app(engine)) as c:
        yield c


def sse_events(text: str) -> list:
    events = [line.removeprefix("data: ") for line in text.split("\n\n") if line]
    assert all(not e.startswith("data:") for e in events)
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


# ---- plain endpoints ------------------------------------------------------------------------------

def test_health_says_503_once_the_engine_thread_died(client, engine):
    engine.alive = False
    r = client.get("/health")
    assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"


def test_health_models_info_metrics(client):
    assert client.get("/health").status_code == 200
    models = client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["fake-model"]
    for path in ("/server_info", "/get_server_info"):
        info = client.get(path).json()
        assert info["internal_states"][0]["dspark_info_record"]["gamma"] == 4
    metrics = client.get("/metrics")
    assert metrics.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert b"sglang_dspark_verify_steps_total" in metrics.content


def test_flush_cache_on_get_and_post(client, engine):
    assert client.post("/flush_cache").status_code == 200
    assert client.get("/flush_cache").text == "Cache flushed.\n"  # SGLang serves both methods
    engine.busy = True
    r = client.get("/flush_cache")
    assert r.status_code == 400 and "running" in r.json()["error"]["message"]


def test_health_generate_runs_one_token_end_to_end(client, engine, monkeypatch):
    assert client.get("/health_generate").status_code == 200
    assert engine.submitted[-1][1].max_tokens == 1
    from sglang_dspark.server import native_api

    monkeypatch.setattr(native_api, "HEALTH_GENERATE_TIMEOUT_S", 0.2)
    engine.stuck = True
    r = client.get("/health_generate")
    assert r.status_code == 503 and "no token" in r.json()["error"]["message"]
    assert engine.aborted[-1] == engine.submitted[-1][2]  # the probe request is not left running


def test_context_length_error_has_openais_code(client):
    r = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 60})
    error = r.json()["error"]
    assert r.status_code == 400 and error["code"] == "context_length_exceeded" and error["param"] == "messages"


def test_served_model_name(engine):
    with TestClient(create_app(engine, served_model_name="alias")) as c:
        assert c.get("/v1/models").json()["data"][0]["id"] == "alias"
        assert c.post("/v1/completions", json={"model": "alias", "prompt": "x"}).status_code == 200


# ---- OpenAI endpoints --------------------------------------------------------------------------

def test_chat_non_streaming(client, engine):
    r = client.post("/v1/chat/completions", json={
        "model": "fake-model", "messages": [{"role": "system", "content": "S"},
                                            {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "temperature": 0, "top_p": 0.5, "top_k": 7, "seed": 3, "stop": "zz", "max_completion_tokens": 20,
    })
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"][0]["message"] == {"role": "assistant", "content": REPLY}
    assert body["choices"][0]["finish_reason"] == "stop"
    prompt = list(b"<system>S<user>hi<assistant>")
    assert body["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": len(REPLY),
                             "total_tokens": len(prompt) + len(REPLY)}
    ids, params, rid = engine.submitted[0]
    assert ids == prompt and rid == body["id"]
    assert (params.temperature, params.top_p, params.top_k, params.seed, params.stop, params.max_tokens) == (
        0, 0.5, 7, 3, ("zz",), 20)


def test_chat_streaming_with_usage(client):
    r = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True,
        "stream_options": {"include_usage": True},
    })
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(e["object"] == "chat.completion.chunk" and e["id"] == events[0]["id"] for e in events)
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert text == REPLY[:5]
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 5
    assert all(e["usage"] is None for e in events[:-1])


def test_chat_streaming_without_usage(client):
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "stream": True})
    events = sse_events(r.text)
    assert all("usage" not in e for e in events)
    assert events[-1]["choices"][0]["finish_reason"] == "stop"


def test_completions(client, engine):
    r = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 4, "stop": ["x", "y"]})
    body = r.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == REPLY[:4] and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert engine.submitted[0][1].stop == ("x", "y")

    r = client.post("/v1/completions", json={"prompt": [97, 98], "stream": True,
                                             "stream_options": {"include_usage": True}})
    events = sse_events(r.text)
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == REPLY
    assert events[-1]["usage"] == {"prompt_tokens": 2, "completion_tokens": len(REPLY),
                                   "total_tokens": 2 + len(REPLY)}
    assert engine.submitted[1][0] == [97, 98]


# ---- SGLang native /generate -------------------------------------------------------------------

def test_generate(client, engine):
    r = client.post("/generate", json={"text": "abc", "sampling_params": {
        "max_new_tokens": 3, "temperature": 0.5, "top_k": -1, "seed": 1, "ignore_eos": True}})
    body = r.json()
    assert body["text"] == REPLY[:3] and body["output_ids"] == list(REPLY[:3].encode())
    meta = body["meta_info"]
    assert (meta["prompt_tokens"], meta["completion_tokens"], meta["finish_reason"]) == (3, 3, {"type": "length"})
    assert meta["e2e_latency"] >= 0
    params = engine.submitted[0][1]
    assert (params.max_tokens, params.temperature, params.top_k, params.seed, params.ignore_eos) == (3, 0.5, 0, 1, True)


def test_generate_streaming_is_cumulative(client):
    r = client.post("/generate", json={"input_ids": [1, 2], "stream": True})
    events = sse_events(r.text)
    assert [e["text"] for e in events] == [REPLY[: i + 1] for i in range(len(REPLY))]
    assert events[-1]["output_ids"] == list(REPLY.encode())
    assert events[-1]["meta_info"]["finish_reason"] == {"type": "stop"}
    assert events[0]["meta_info"]["finish_reason"] is None


# ---- errors --------------------------------------------------------------------------------------

CHAT = {"messages": [{"role": "user", "content": "hi"}]}

BAD_REQUESTS = [
    ("/v1/chat/completions", b"{not json", 400, None),
    ("/v1/chat/completions", b"[1, 2]", 400, None),
    ("/v1/chat/completions", {**CHAT, "model": "gpt-4"}, 404, "model"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": -1}, 400, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "temperature": -0.1}, 400, "temperature"),
    ("/v1/chat/completions", {**CHAT, "top_p": 1.5}, 400, "top_p"),
    ("/v1/chat/completions", {**CHAT, "top_p": 0}, 400, "top_p"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": "5"}, 400, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "temperature": "hot"}, 400, "temperature"),
    ("/v1/chat/completions", {**CHAT, "stream": "yes"}, 400, "stream"),
    ("/v1/chat/completions", {**CHAT, "n": 0}, 400, "n"),
    # the field policy (docs/REQUEST_FIELDS.md): refused by name unless at their no-op value
    ("/v1/chat/completions", {**CHAT, "frequency_penalty": 0.5}, 400, "frequency_penalty"),
    # grammars: the fake's byte tokenizer is no transformers tokenizer, so xgrammar cannot read it
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_object"}}, 400, "response_format"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema"}}, 400, "response_format"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "xml"}}, 400, "response_format.type"),
    ("/generate", {"text": "a", "sampling_params": {"regex": "a", "ebnf": "b"}}, 400, "sampling_params"),
    # tools: a forced call only (tool_choice auto, the default with tools, is refused)
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tool_choice"),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}],
                              "tool_choice": {"type": "function", "function": {"name": "g"}}}, 400, "tool_choice"),
    ("/v1/chat/completions", {**CHAT, "tool_choice": "required"}, 400, "tool_choice"),
    ("/v1/chat/completions", {**CHAT, "no_such_field": 1}, 400, "no_such_field"),
    ("/v1/chat/completions", {**CHAT, "logit_bias": {"999": 1}}, 400, "logit_bias"),
    ("/v1/chat/completions", {**CHAT, "logit_bias": {"x": 1}}, 400, "logit_bias"),
    ("/v1/chat/completions", {**CHAT, "logit_bias": {"5": 101}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "a", "best_of": 2}, 400, "best_of"),
    ("/v1/completions", {"prompt": "a", "suffix": "b"}, 400, "suffix"),
    ("/v1/completions", {"prompt": "a", "max_tokens": 0}, 400, "max_tokens"),  # only with echo
    ("/generate", {"text": "a", "sampling_params": {"regex": "a+"}}, 400, "sampling_params.regex"),
    ("/generate", {"text": "a", "sampling_params": {"no_such_param": 1}}, 400, "sampling_params.no_such_param"),
    ("/v1/chat/completions", {**CHAT, "stop": ["ok", ""]}, 400, "stop"),
    ("/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "assistant", "content": "x"}]}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages.0.role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "messages.0.content"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 60}, 400, "messages"),  # prompt + max_tokens > 64
    ("/v1/completions", {"prompt": "x" * 70}, 400, "prompt"),
    ("/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"prompt": [1, 999]}, 400, "prompt"),
    ("/v1/completions", {"prompt": ["a", ""]}, 400, "prompt"),
    ("/v1/completions", {"prompt": [[1], [999]]}, 400, "prompt"),
    ("/v1/completions", {"prompt": ["a", "x" * 70]}, 400, "prompt"),  # the second does not fit
    ("/v1/completions", {}, 400, "prompt"),
    ("/generate", {"sampling_params": {}}, 400, "text"),
    ("/generate", {"text": "a", "input_ids": [1]}, 400, "text"),
    ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": 0}}, 400, "max_new_tokens"),
    ("/generate", {"text": "a", "sampling_params": {"top_k": 1.5}}, 400, "sampling_params.top_k"),
    ("/generate", {"input_ids": [-1]}, 400, "input_ids"),
    ("/v1/completions", {"prompt": "a", "seed": 2**64}, 400, "seed"),  # beyond what a torch generator takes
    ("/generate", {"text": "a", "sampling_params": {"seed": -1}}, 400, "seed"),
]


@pytest.mark.parametrize("path,body,status,param", BAD_REQUESTS)
def test_bad_requests_get_openai_errors_and_server_keeps_serving(client, engine, path, body, status, param):
    kwargs = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) else {"json": body}
    r = client.post(path, **kwargs)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param
    assert engine.submitted == []
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_unknown_route_is_openai_shaped(client):
    r = client.get("/v1/nope")
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"


# ---- client disconnects ----------------------------------------------------------------------------

async def _disconnect_after(app, path: str, body: dict, trigger) -> list[dict]:
    """Drive the ASGI app as a server would; the client disconnects once `trigger(sent)` holds."""
    sent: list[dict] = []
    pending = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]

    async def receive():
        if pending:
            return pending.pop()
        while not trigger(sent):
            await asyncio.sleep(0.005)
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": [(b"content-type", b"application/json")],
             "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 30000)}
    await asyncio.wait_for(app(scope, receive, send), timeout=10)
    return sent


def test_streaming_disconnect_aborts(engine):
    engine.hold = True  # the request would otherwise run on for seconds
    first_chunk = lambda sent: any(m["type"] == "http.response.body" and m.get("body") for m in sent)
    sent = asyncio.run(_disconnect_after(create_app(engine), "/v1/chat/completions",
                                         {**CHAT, "stream": True}, first_chunk))
    assert engine.aborted == [engine.submitted[0][2]]
    assert b"[DONE]" not in b"".join(m.get("body", b"") for m in sent)


def test_non_streaming_disconnect_aborts(engine):
    engine.hold = True
    sent = asyncio.run(_disconnect_after(create_app(engine), "/v1/completions", {"prompt": "abc"},
                                         lambda sent: bool(engine.submitted)))
    assert engine.aborted == [engine.submitted[0][2]]
    assert sent[0]["status"] == 499


def test_finished_requests_are_not_aborted(client, engine):
    client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    client.post("/generate", json={"text": "a"})
    assert len(engine.submitted) == 2 and engine.aborted == []


@pytest.mark.parametrize("stream", [True, False])
def test_a_disconnect_aborts_every_choice_of_a_request(engine, stream):
    engine.hold = True
    if stream:
        trigger = lambda sent: any(m["type"] == "http.response.body" and m.get("body") for m in sent)
    else:
        trigger = lambda sent: len(engine.submitted) == 4
    body = {"prompt": ["ab", "cd"], "n": 2, "stream": stream}
    asyncio.run(_disconnect_after(create_app(engine), "/v1/completions", body, trigger))
    assert sorted(engine.aborted) == sorted(rid for _, _, rid in engine.submitted) and len(engine.aborted) == 4
