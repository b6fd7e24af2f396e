"""Slow, end to end: the README's serve command starts, becomes ready and answers a chat."""

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_quickstart_serve_answers_a_chat_completion():
    port = free_port()
    proc = subprocess.Popen(
        ["bash", "dev.sh", "serve", "--port", str(port)], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    lines = []
    try:
        deadline = time.monotonic() + 900  # first run fetches and converts the model
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            lines.append(line)
            if "DSpark server ready on" in line:
                break
        assert any("DSpark server ready on" in line for line in lines), "".join(lines[-30:])
        body = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "What is 2 + 3?"}],
                "max_tokens": 16, "temperature": 0}
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        reply = r.json()
        assert reply["choices"][0]["message"]["content"].strip()
        assert 0 < reply["usage"]["completion_tokens"] <= 16
        info = httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=10).json()
        assert info["internal_states"][0]["dspark_info_record"]["mode"] == "scheduled"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
