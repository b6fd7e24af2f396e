"""The reference server under overload and faults: twice its concurrency loses no request, clients
that hang up free their slots and the gauges say so at once, and SIGTERM drains (every request ends
with a response)."""

from __future__ import annotations

import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from drafter_fixtures import write_tiny_model_dirs
from engine_fixtures import tiny_engine
from loopback_server import serve_engine_on_loopback
from sglang_dspark.testing.servers import free_port, start_reference_server, stop

from sglang_dspark.engine.async_engine import AsyncEngine

MAX_RUNNING = 4


@pytest.fixture(scope="module")
def server():
    with serve_engine_on_loopback(tiny_engine("scheduled", max_running=MAX_RUNNING)) as served:
        yield served


def _stream(base: str, max_tokens: int, stop_after: int | None = None) -> dict:
    """A streaming completion; with `stop_after`, hang up after that many chunks."""
    body = {"prompt": "w5 w6 w7", "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    chunks, usage, finish = 0, None, None
    with httpx.Client(timeout=60) as client, client.stream("POST", f"{base}/v1/completions", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line.removeprefix("data: "))
            chunks += 1
            usage = event.get("usage") or usage
            finish = next((c["finish_reason"] for c in event["choices"] if c.get("finish_reason")), finish)
            if stop_after is not None and chunks >= stop_after:
                break
    return {"chunks": chunks, "usage": usage, "finish_reason": finish}


def _gauges(base: str) -> tuple[float, float]:
    text = httpx.get(f"{base}/metrics").text
    value = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
             if line.startswith(("sglang_dspark_num_running_reqs ", "sglang_dspark_num_queued_reqs "))}
    return value["sglang_dspark_num_running_reqs"], value["sglang_dspark_num_queued_reqs"]


def _taken_and_running(base: str) -> tuple[float, float]:
    """(requests the server has taken: running, queued or finished; running), from one /metrics read."""
    text = httpx.get(f"{base}/metrics").text
    running = queued = finished = 0.0
    for line in text.splitlines():
        if line.startswith("sglang_dspark_num_running_reqs "):
            running = float(line.split()[1])
        elif line.startswith("sglang_dspark_num_queued_reqs "):
            queued = float(line.split()[1])
        elif line.startswith("sglang_dspark_requests_finished_total{"):
            finished += float(line.split()[-1])
    return running + queued + finished, running


def _until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def _after_a_step(engine, steps_before: int):
    """(waiting, running, the gauges' exposition) read on the engine thread once it ran a decode step."""
    while True:
        state = engine.call(lambda e: e.records.total > steps_before
                            and (e.num_waiting, e.num_running, e.metrics.render())).result(30)
        if state:
            return state


def test_twice_the_concurrency_loses_no_request_and_no_token(server):
    engine, base = server
    hold = threading.Event()
    steps_before = engine.call(lambda e: e.records.total).result(30)
    held = engine.call(lambda e: hold.wait(30))  # no step until every request has arrived
    with ThreadPoolExecutor(2 * MAX_RUNNING) as pool:
        futures = [pool.submit(_stream, base, 40) for _ in range(2 * MAX_RUNNING)]
        assert _until(lambda: len(engine._live) == 2 * MAX_RUNNING, timeout=30)
        hold.set()
        held.result(30)
        waiting, running, text = _after_a_step(engine, steps_before)
        results = [f.result(timeout=120) for f in futures]
    assert all(r["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 40 for r in results)
    assert (waiting, running) == (MAX_RUNNING, MAX_RUNNING)  # half of them queued
    assert f"sglang_dspark_num_queued_reqs {float(MAX_RUNNING)}" in text.decode()  # and the gauge showed it


def _finished(base: str) -> dict[str, float]:
    """sglang_dspark_requests_finished_total by reason."""
    prefix = 'sglang_dspark_requests_finished_total{reason="'
    return {line[len(prefix):].split('"')[0]: float(line.split()[-1])
            for line in httpx.get(f"{base}/metrics").text.splitlines() if line.startswith(prefix)}


def test_clients_that_hang_up_free_every_slot_and_the_gauges_say_so(server):
    engine, base = server
    before = _finished(base)
    with ThreadPoolExecutor(20) as pool:
        results = list(pool.map(lambda _: _stream(base, 200, stop_after=2), range(20)))
    assert all(r["chunks"] == 2 and r["finish_reason"] is None for r in results)  # all left mid-stream
    assert _until(lambda: _gauges(base) == (0.0, 0.0)), _gauges(base)
    # Freed by the hang-up, not by running out their 200 tokens: every one of them ended "abort".
    after = _finished(base)
    ended = {k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)}
    assert ended == {"abort": 20.0}, ended
    free = engine.call(lambda e: (e.idle, e.scheduler.has_free_slot, len(e.scheduler._free_slots))).result(10)
    assert free == (True, True, MAX_RUNNING)


@pytest.mark.slow
def test_sigterm_drains_every_request_to_a_response(tmp_path):
    target, draft = write_tiny_model_dirs(tmp_path, max_position_embeddings=8192)
    port = free_port()
    proc = start_reference_server("--model", target, "--draft", draft, "--engine", "reference", "--max-running", "4",
                                  "--drain-timeout", "1", port=port)
    try:
        base = f"http://127.0.0.1:{port}"
        results, started = [], threading.Event()

        def client(i: int) -> None:
            if i == 0:
                started.set()
            results.append(_stream(base, 8000 if i % 2 else 60))  # half of them cannot finish in the drain

        threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        started.wait(10)
        # every request reached the server and the long ones run (the short ones may already be done:
        # 60 tokens of the tiny model can finish between two polls, so "4 running" was a race)
        assert _until(lambda: (lambda taken, running: taken >= 6 and running >= 3)(*_taken_and_running(base)),
                      timeout=30)
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(timeout=60)
        assert proc.wait(timeout=60) == 0
    finally:
        stop(proc)
    assert len(results) == 6  # every client got a complete response
    assert {r["finish_reason"] for r in results} <= {"length", "abort"}
    assert sum(r["finish_reason"] == "abort" for r in results) >= 3  # the long ones ended at the drain's end
    assert all(r["usage"] is not None for r in results)


def test_a_request_the_engine_thread_fails_to_take_still_gets_its_final_output(monkeypatch):
    from sglang_dspark.engine.sampling import SamplingParams

    engine = AsyncEngine(tiny_engine("scheduled", max_running=2))
    monkeypatch.setattr(engine.engine, "submit", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("a bug")))
    outputs, finished = [], threading.Event()
    engine.start()
    try:
        engine.submit([5, 6], SamplingParams(max_tokens=4), lambda out: (outputs.append(out), finished.set()))
        assert finished.wait(20)
    finally:
        engine.shutdown()
    assert [(o.finished, o.finish_reason) for o in outputs] == [(True, "abort")]


def test_a_request_id_in_flight_cannot_be_reused_until_it_finished():
    from sglang_dspark.engine.sampling import SamplingParams

    engine = AsyncEngine(tiny_engine("scheduled", max_running=2))
    finished = threading.Event()
    engine.submit([5, 6], SamplingParams(max_tokens=4), lambda out: out.finished and finished.set(), "x")
    with pytest.raises(ValueError, match="rid: a request with id 'x' is already in flight"):
        engine.submit([7, 8], SamplingParams(max_tokens=4), lambda out: None, "x")
    engine.start()
    try:
        assert finished.wait(20)
        again = threading.Event()
        engine.submit([7, 8], SamplingParams(max_tokens=4), lambda out: out.finished and again.set(), "x")
        assert again.wait(20)
    finally:
        engine.shutdown()
