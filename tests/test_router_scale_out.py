"""Scale-out with SGLang's own router: two reference replicas on loopback behind
`python -m sglang_router.launch_router`, one killed (SIGKILL) in the middle of a load run.

What a user may expect, and what this checks: the router registers our replicas as it would SGLang
workers (/server_info, /model_info, /health), spreads requests over both, and once a replica dies
every request still gets a complete answer: the router retries requests the dead replica held, and
its health check takes the replica out. Greedy answers are the same whichever replica served them.
Streams cannot be retried once they started; the test reports how many were cut and bounds them by
what the dead replica held."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import httpx
import pytest
from drafter_fixtures import write_tiny_model_dirs
from server_processes import free_port, start_reference_server, stop

pytestmark = pytest.mark.slow

MAX_RUNNING = 4
CLIENTS, PER_CLIENT, MAX_TOKENS = 6, 6, 48
KILL_AFTER = 12  # completed requests before one replica is killed


def _router(ports: list[int]) -> tuple[subprocess.Popen, str]:
    port, metrics_port = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls",
         *[f"http://127.0.0.1:{p}" for p in ports], "--host", "127.0.0.1", "--port", str(port),
         "--policy", "round_robin", "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
         "--health-check-interval-secs", "1", "--health-failure-threshold", "1", "--log-level", "warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"


def _wait_routable(base: str, timeout_s: float = 90.0) -> None:
    """Until a chat completion goes through the router (its workers register in the background)."""
    deadline = time.monotonic() + timeout_s
    body = {"model": "target", "messages": [{"role": "user", "content": "w1"}], "max_tokens": 1}
    while time.monotonic() < deadline:
        try:
            if httpx.post(f"{base}/v1/chat/completions", json=body, timeout=10).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"the router at {base} routed nothing within {timeout_s:g} s")


def _served(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith('sglang_dspark_requests_finished_total{reason="length"}'))


def _prompt(i: int, j: int) -> str:
    return f"w{3 + i} w{10 + j} w{20 + (i * j) % 9}"


def _chat(base: str, i: int, j: int) -> dict:
    body = {"model": "target", "messages": [{"role": "user", "content": _prompt(i, j)}], "max_tokens": MAX_TOKENS,
            "ignore_eos": True, "temperature": 0}
    r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120)
    return {"status": r.status_code, "body": r.json() if r.status_code == 200 else r.text}


def _stream(base: str, i: int, j: int) -> dict:
    body = {"model": "target", "messages": [{"role": "user", "content": _prompt(i, j)}], "max_tokens": MAX_TOKENS,
            "ignore_eos": True, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    text, usage, done = "", None, False
    try:
        with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=120) as r:
            if r.status_code != 200:
                return {"status": r.status_code, "complete": False}
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    event = json.loads(line.removeprefix("data: "))
                    usage = event.get("usage") or usage
                    text += "".join(c["delta"].get("content") or "" for c in event.get("choices", []))
    except httpx.HTTPError:
        pass
    complete = done and usage is not None and usage["completion_tokens"] == MAX_TOKENS
    return {"status": 200, "complete": complete, "text": text}


def test_a_replica_killed_mid_run_behind_sglang_router(tmp_path):
    target, draft = write_tiny_model_dirs(tmp_path, max_position_embeddings=4096)
    ports = [free_port(), free_port()]
    replicas = [start_reference_server("--model", target, "--draft", draft, "--engine", "reference",
                                       "--max-running", str(MAX_RUNNING), port=p) for p in ports]
    router = None
    try:
        router, base = _router(ports)
        _wait_routable(base)
        results: dict[tuple[int, int], dict] = {}
        lock, enough = threading.Lock(), threading.Event()

        def client(i: int) -> None:
            for j in range(PER_CLIENT):
                result = (_stream if i % 2 else _chat)(base, i, j)
                with lock:
                    results[i, j] = result
                    if len(results) >= KILL_AFTER:
                        enough.set()

        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        assert enough.wait(300), "the load run stalled before the kill"
        before_kill = _served(f"http://127.0.0.1:{ports[1]}")
        stop(replicas[1], sig=9)
        for t in threads:
            t.join(300)
        assert not any(t.is_alive() for t in threads)

        chats = {k: r for k, r in results.items() if k[0] % 2 == 0}
        streams = {k: r for k, r in results.items() if k[0] % 2 == 1}
        assert len(results) == CLIENTS * PER_CLIENT
        # every non-streaming request got its whole answer, the dead replica's included (the router retries)
        assert all(r["status"] == 200 for r in chats.values()), [r for r in chats.values() if r["status"] != 200]
        assert all(r["body"]["usage"]["completion_tokens"] == MAX_TOKENS for r in chats.values())
        cut = [k for k, r in streams.items() if not r["complete"]]
        print(f"\nrouter scale-out: {len(results)} requests, killed replica had served {before_kill:g}; "
              f"streams cut by the kill: {len(cut)} of {len(streams)}")
        assert len(cut) <= MAX_RUNNING  # at most what the dead replica held
        assert before_kill > 0  # both replicas took traffic before the kill

        # greedy answers do not depend on the replica: compare with the survivor, asked directly
        survivor = f"http://127.0.0.1:{ports[0]}"
        for (i, j), r in sorted(chats.items())[:: 4]:
            direct = _chat(survivor, i, j)["body"]["choices"][0]["message"]["content"]
            assert r["body"]["choices"][0]["message"]["content"] == direct, (i, j)
        for (i, j), r in sorted(streams.items())[:: 4]:
            if r["complete"]:
                assert r["text"] == _chat(survivor, i, j)["body"]["choices"][0]["message"]["content"], (i, j)
    finally:
        if router is not None:
            stop(router)
        for proc in replicas:
            stop(proc)
