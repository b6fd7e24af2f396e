"""A served tiny engine that drafts every step, with a hot draft vocabulary smaller than the
target's, and a victim request decoded beside whatever a test sends (tests/test_request_isolation.py,
tests/test_request_fuzz.py)."""

from __future__ import annotations

import contextlib
import json
import threading
import time

import httpx
import torch
from drafter_fixtures import write_tiny_model_dirs
from loopback_server import serve_engine_on_loopback

from sglang_dspark.engine.engine import EngineConfig
from sglang_dspark.engine.factory import build_engine

VOCAB = 48
DRAFT_VOCAB = 16  # the drafter's hot vocabulary: top_k between it and VOCAB reached the draft sampler only
MAX_LEN = 256
VICTIM = {"prompt": "w5 w6 w7", "max_tokens": 200, "temperature": 0, "ignore_eos": True, "stream": True}
STEP_PAUSE_S = 0.002  # a victim then decodes for about 0.4 s at least, whatever the host


@contextlib.contextmanager
def served_full_engine(root, *, max_running: int = 4, max_queued: int = 8):
    """(AsyncEngine, base URL): mode "full" (every decode step drafts and verifies all drafts)."""
    target_dir, draft_dir = write_tiny_model_dirs(root)
    config = EngineConfig(mode="full", max_running=max_running, max_len=MAX_LEN, seed=0,
                          max_queued_requests=max_queued)
    engine = build_engine(target_dir, draft_dir, config=config, model_name="tiny")
    engine.runner.drafter.set_draft_vocab(torch.arange(DRAFT_VOCAB))
    step = engine.step

    def paced_step() -> None:
        step()
        time.sleep(STEP_PAUSE_S)

    engine.step = paced_step
    with serve_engine_on_loopback(engine) as served:
        yield served


def stream_text(base: str, body: dict, started: threading.Event | None = None) -> dict:
    """A streamed completion's text, finish_reason and error events; `started` is set at the first token."""
    text, finish, errors = "", None, []
    with httpx.Client(timeout=120) as client, client.stream("POST", f"{base}/v1/completions", json=body) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line.removeprefix("data: "))
            if "error" in event:
                errors.append(event["error"])
                continue
            for c in event["choices"]:
                text += c.get("text") or ""
                finish = c.get("finish_reason") or finish
            if text and started is not None:
                started.set()
    return {"text": text, "finish_reason": finish, "errors": errors}


class Victim:
    """Victim requests decoded back to back on a thread, each compared with the solo text."""

    def __init__(self, base: str, solo: dict):
        self.base, self.solo = base, solo
        self.runs, self.wrong = 0, []
        self.running = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Victim:
        self._thread.start()
        assert self.running.wait(30), "the victim did not start decoding"
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            out = stream_text(self.base, VICTIM, self.running)
            self.runs += 1
            if out != self.solo:
                self.wrong.append(out)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(120)


def post(base: str, path: str, body, timeout: float = 30.0) -> httpx.Response:
    """POST a body as JSON with ASCII escapes (a lone surrogate travels as "\\ud800", valid JSON)."""
    data = body if isinstance(body, (bytes, str)) else json.dumps(body, allow_nan=True)
    return httpx.post(f"{base}{path}", content=data, headers={"Content-Type": "application/json"}, timeout=timeout)
