"""What a front end (the HTTP server, load generators, benchmarks) may use of an engine.

The server is written against this protocol, not against `Engine`: everything that reaches into
engine state goes through the engine thread (`AsyncEngine`), and a test can serve a scripted fake.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

from sglang_dspark.engine.request import RequestOutput
from sglang_dspark.engine.sampling import SamplingParams


class EngineClient(Protocol):
    tokenizer: Any  # a transformers tokenizer: encode, decode, apply_chat_template, len()
    model_name: str
    max_len: int  # context limit per request: prompt + output tokens
    max_in_flight: int  # requests running or queued at most; submit raises EngineBusy beyond
    metrics: Any  # has render() -> bytes, the Prometheus exposition

    def submit(self, prompt_ids: list[int], params: SamplingParams, callback: Callable[[RequestOutput], None],
               request_id: str | None = None) -> str:
        """Queue a request; raises ValueError ("field: reason") when it would be refused, EngineBusy
        when the engine holds `max_in_flight` requests already. Outputs
        arrive through `callback`, from another thread, the last with finished=True."""

    def abort(self, request_id: str) -> None:
        """End a request (its callback gets a final output with finish_reason "abort")."""

    def abort_all(self) -> None:
        """End every request (a drain's end)."""

    @property
    def alive(self) -> bool:
        """Whether the engine can still make progress (its thread runs); /health says 503 if not."""

    def model_info(self) -> dict:
        """SGLang's /model_info body (model_path, tokenizer_path, architectures, ...); immutable."""

    def server_info(self) -> Future:
        """SGLang's /server_info body, with the per-step DSpark records."""

    def set_internal_state(self, force_budget_frac: Any = ..., clear_records: bool = False) -> Future:
        """SGLang's runtime knobs; the Future holds the forced budget fraction now in effect."""

    def flush_cache(self) -> Future:
        """Future[bool]: True when flushed, False while requests run."""
