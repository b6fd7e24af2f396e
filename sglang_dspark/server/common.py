"""Pieces every generation endpoint shares: the engine, ids, submission (n choices per prompt), usage."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace

from fastapi import Request
from fastapi.responses import Response

from sglang_dspark.engine.request import ContextLengthError, EngineBusy
from sglang_dspark.engine.sampling import SamplingParams
from sglang_dspark.server.errors import APIError, from_value_error
from sglang_dspark.server.streams import RequestStream

# nginx's "client closed request": logged for non-streaming requests whose client left.
CLIENT_CLOSED = Response(status_code=499)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def engine_of(request: Request):
    """The app's EngineClient (engine/protocol.py)."""
    return request.app.state.engine


def served_name(request: Request) -> str:
    return request.app.state.served_model_name


def submit(engine, ids: list[int], params: SamplingParams, request_id: str, prompt_param: str) -> RequestStream:
    try:
        return RequestStream(engine, ids, params, request_id)
    except ContextLengthError as exc:
        raise APIError(400, str(exc), param=prompt_param, code="context_length_exceeded") from None
    except EngineBusy as exc:  # only the current load: the client may retry
        raise APIError(429, str(exc), code="queue_full", type_="rate_limit_error") from None
    except ValueError as exc:  # the engine's other admission checks name their field
        raise from_value_error(exc, prompt_param) from None


def submit_choices(engine, prompts: list[list[int]], params: list[SamplingParams], n: int, request_id: str,
                   prompt_param: str) -> list[RequestStream]:
    """n requests per prompt, in OpenAI's choice order (prompt-major). Choice i of a seeded request
    draws from seed + i, so the n choices differ and each is reproducible. A refusal aborts the ones
    already submitted."""
    streams: list[RequestStream] = []
    single = len(prompts) * n == 1
    for i, (ids, sp) in enumerate(zip(prompts, params)):  # a batch is refused before any of it runs
        if len(prompts) > 1 and len(ids) + sp.max_tokens > engine.max_len:
            raise APIError(400, f"prompt {i} ({len(ids)} tokens) plus max_tokens ({sp.max_tokens}) exceeds the "
                                f"context limit of {engine.max_len} tokens", param=prompt_param,
                           code="context_length_exceeded")
    try:
        for ids, sp in zip(prompts, params):
            for i in range(n):
                seeded = sp if sp.seed is None or i == 0 else replace(sp, seed=(sp.seed + i) % 2**64)
                rid = request_id if single else f"{request_id}-{len(streams)}"
                streams.append(submit(engine, ids, seeded, rid, prompt_param))
    except BaseException:
        for stream in streams:
            stream.close()
        raise
    return streams


def usage_of(finals: list, n: int, completion_tokens: int | None = None) -> dict:
    """Usage over all choices, given each choice's final output: each prompt counted once, every
    choice's completion tokens (or `completion_tokens` when the server dropped them)."""
    prompt = sum(o.prompt_tokens for o in finals[::n])
    completion = sum(o.completion_tokens for o in finals) if completion_tokens is None else completion_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
