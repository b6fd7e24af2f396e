"""Pieces every generation endpoint shares: the engine, ids, submission, usage."""

from __future__ import annotations

import time
import uuid

from fastapi import Request
from fastapi.responses import Response

from sglang_dspark.engine.request import ContextLengthError
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
    except ValueError as exc:  # the engine's other admission checks name their field
        raise from_value_error(exc, prompt_param) from None


def usage(last) -> dict:
    return {
        "prompt_tokens": last.prompt_tokens,
        "completion_tokens": last.completion_tokens,
        "total_tokens": last.prompt_tokens + last.completion_tokens,
    }
