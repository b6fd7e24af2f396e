"""The server in front of the real reference engine: a tiny random llama target and a tiny drafter,
loaded from disk through build_engine, on its thread (AsyncEngine), served in-process and over a
loopback socket."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from drafter_fixtures import write_tiny_model_dirs
from loopback_server import serve_on_loopback
from sglang_dspark.server import create_app
from sglang_dspark.engine.async_engine import AsyncEngine
from sglang_dspark.engine.engine import EngineConfig
from sglang_dspark.engine.factory import build_engine

@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    return write_tiny_model_dirs(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def engine(model_dirs):
    config = EngineConfig(mode="scheduled", max_running=4, max_len=256, seed=0)
    engine = AsyncEngine(build_engine(*model_dirs, config=config, model_name="tiny"))
    engine.start()
    yield engine
    engine.shutdown()


def _wait_idle(engine, timeout: float = 20.0) -> None:
    """Until the engine thread reports no running or waiting request (read on that thread)."""
    deadline = time.monotonic() + timeout
    while not engine.call(lambda e: e.idle).result(timeout) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert engine.call(lambda e: e.idle).result(timeout)


def test_endpoints_against_real_engine(engine):
    with TestClient(create_app(engine)) as client:
        chat = client.post("/v1/chat/completions", json={
            "model": "tiny", "messages": [{"role": "user", "content": "w5 w6 w7"}],
            "max_tokens": 8, "ignore_eos": True, "temperature": 0}).json()
        assert chat["usage"]["completion_tokens"] == 8 and chat["choices"][0]["finish_reason"] == "length"
        assert chat["usage"]["total_tokens"] == chat["usage"]["prompt_tokens"] + 8

        events = client.post("/v1/completions", json={
            "prompt": "w9 w10", "max_tokens": 6, "ignore_eos": True, "seed": 1, "stream": True,
            "stream_options": {"include_usage": True}}).text.split("\n\n")
        assert events[-2] == "data: [DONE]"
        assert json.loads(events[-3].removeprefix("data: "))["usage"]["completion_tokens"] == 6

        gen = client.post("/generate", json={"input_ids": [5, 6, 7], "sampling_params": {
            "max_new_tokens": 5, "temperature": 0, "ignore_eos": True}}).json()
        assert len(gen["output_ids"]) == 5 and gen["meta_info"]["finish_reason"] == {"type": "length"}

        too_long = client.post("/generate", json={"input_ids": [5] * 250, "sampling_params": {"max_new_tokens": 10}})
        assert too_long.status_code == 400 and "context" in too_long.json()["error"]["message"]

        records = client.get("/server_info").json()["internal_states"][0]["dspark_info_record"]
        assert records["mode"] == "scheduled" and records["records"]
        assert b"sglang_dspark_generation_tokens_total" in client.get("/metrics").content
        _wait_idle(engine)
        assert client.post("/flush_cache").status_code == 200


def _aborted(engine) -> float:
    for line in engine.metrics.render().decode().splitlines():
        if line.startswith('sglang_dspark_requests_finished_total{reason="abort"}'):
            return float(line.split()[-1])
    return 0.0


def test_client_disconnect_frees_the_slot(engine):
    """Over a real socket: the client reads one chunk of a long stream and hangs up."""
    with serve_on_loopback(create_app(engine)) as base:
        before = _aborted(engine)
        body = {"prompt": "w3 w4", "max_tokens": 240, "ignore_eos": True, "stream": True}  # most of the context
        with httpx.Client(timeout=20) as client:
            with client.stream("POST", f"{base}/v1/completions", json=body) as r:
                assert r.status_code == 200
                next(r.iter_lines())
        _wait_idle(engine)
        assert _aborted(engine) == before + 1


def test_model_info_names_a_directory_a_router_can_load_the_tokenizer_from(engine, model_dirs):
    """sglang-router registers a worker from /model_info and loads the tokenizer from model_path."""
    from transformers import AutoTokenizer

    with TestClient(create_app(engine, served_model_name="tiny")) as client:
        for path in ("/model_info", "/get_model_info"):
            info = client.get(path).json()
            assert info["served_model_name"] == "tiny" and info["is_generation"] is True
            assert info["architectures"] == ["LlamaForCausalLM"]
            tokenizer = AutoTokenizer.from_pretrained(info["tokenizer_path"])
            assert tokenizer.encode("w5 w6") == engine.tokenizer.encode("w5 w6")
        assert client.get("/server_info").json()["model_path"] == info["model_path"]
