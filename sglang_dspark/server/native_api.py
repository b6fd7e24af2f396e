"""SGLang's native endpoints: /generate, /server_info, /model_info, /metrics, /health,
/health_generate, /flush_cache, /set_internal_state."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse, Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from sglang_dspark.engine.sampling import SamplingParams
from sglang_dspark.server.common import CLIENT_CLOSED, engine_of, new_id, submit
from sglang_dspark.server.errors import APIError
from sglang_dspark.server.grammars import compile_grammar, generate_spec
from sglang_dspark.server.logprobs import generate_logprobs, input_logprobs
from sglang_dspark.server.params import (check_text_size, check_token_ids, generate_params, reject_unencodable,
                                         request_limits)
from sglang_dspark.server.protocol import GenerateRequest, SetInternalStateRequest
from sglang_dspark.server.streams import EventStreamResponse, RequestStream, collect, error_event, sse

router = APIRouter()

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
HEALTH_GENERATE_TIMEOUT_S = 20.0  # SGLang's health check waits about as long for its one token
# SGLang's ADMIN_OPTIONAL endpoints: the admin key (or, without one, the API key) opens them
ADMIN_PATHS = frozenset({"/flush_cache", "/set_internal_state"})


@router.get("/health")
async def health(request: Request) -> Response:
    """200 while the engine thread runs; 503 once it died, so a router stops sending traffic here."""
    engine = engine_of(request)
    if not engine.alive:
        fault = getattr(engine, "fault", None)
        reason = f"the engine failed ({fault}); restart the server" if fault else "the engine thread is not running"
        raise APIError(503, reason, type_="service_unavailable")
    return Response(status_code=200)


@router.get("/health_generate")
async def health_generate(request: Request) -> Response:
    """200 once the engine generated one token end to end, 503 when it cannot within the timeout."""
    engine = engine_of(request)
    ids = engine.tokenizer.encode("ping", add_special_tokens=False) or [0]
    stream = RequestStream(engine, ids[:1], SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True),
                           new_id("health"))
    try:
        async with asyncio.timeout(HEALTH_GENERATE_TIMEOUT_S):
            async for out in stream:
                if out.finished:
                    break
    except TimeoutError:
        raise APIError(503, f"the engine generated no token within {HEALTH_GENERATE_TIMEOUT_S:g} s",
                       type_="service_unavailable") from None
    finally:
        stream.close()
    return Response(status_code=200)


@router.get("/server_info")
@router.get("/get_server_info")
async def server_info(request: Request) -> dict:
    engine = engine_of(request)
    return {**await asyncio.wrap_future(engine.server_info()), "request_limits": request_limits(engine)}


@router.get("/model_info")
@router.get("/get_model_info")
async def model_info(request: Request) -> dict:
    """What sglang-router asks a worker when it registers it (SGLang's fields)."""
    return {**engine_of(request).model_info(), "served_model_name": request.app.state.served_model_name}


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(engine_of(request).metrics.render(), headers={"Content-Type": PROMETHEUS_CONTENT_TYPE})


@router.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(request: Request) -> Response:
    if not await asyncio.wrap_future(engine_of(request).flush_cache()):
        raise APIError(400, "cache not flushed: requests are running or waiting", code="engine_busy")
    return PlainTextResponse("Cache flushed.\n")


@router.api_route("/set_internal_state", methods=["POST", "PUT"])
async def set_internal_state(request: Request) -> list[bool]:
    """SGLang's runtime knobs the SPS profiler uses: `{"server_args": {"dspark_force_budget_frac":
    f | null, "dspark_clear_info_records": bool}}`. f in [0, 1] fixes the verify budget at
    f * requests * gamma; null gives it back to the planner. Answered as SGLang answers: one bool
    per DP rank (one here), true when the update was applied."""
    try:
        body = await request.json()
    except ValueError:
        raise APIError(400, "malformed JSON body", param="server_args") from None
    if isinstance(body, dict) and "server_args" not in body:
        raise APIError(400, 'body: expected SGLang\'s shape {"server_args": {"dspark_force_budget_frac": ...}}, '
                            f"got top-level keys {sorted(body)}", param="server_args")
    try:
        args = SetInternalStateRequest.model_validate(body).server_args
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from None
    frac = args.dspark_force_budget_frac
    if frac is not None and not 0.0 <= frac <= 1.0:
        raise APIError(400, f"server_args.dspark_force_budget_frac: must be in [0, 1] or null, got {frac}",
                       param="server_args.dspark_force_budget_frac")
    given = args.model_fields_set
    future = engine_of(request).set_internal_state(
        force_budget_frac=frac if "dspark_force_budget_frac" in given else ...,
        clear_records=args.dspark_clear_info_records)
    await asyncio.wrap_future(future)
    return [True]


@router.post("/generate")
async def generate(body: GenerateRequest, request: Request):
    engine = engine_of(request)
    reject_unencodable(body)
    if (body.text is None) == (body.input_ids is None):
        raise APIError(400, "exactly one of text or input_ids is required", param="text")
    if body.input_ids is not None:
        ids = check_token_ids(body.input_ids, len(engine.tokenizer), "input_ids")
    else:
        check_text_size(body.text, engine.max_len, "text")
        text_ids = await run_in_threadpool(engine.tokenizer.encode, body.text) if body.text else []
        ids = check_token_ids(text_ids, len(engine.tokenizer), "text")
    spec = generate_spec(body.sampling_params)
    grammar = await compile_grammar(request, *spec) if spec else None
    params = generate_params(body, len(ids), engine.max_len - len(ids), len(engine.tokenizer), grammar)
    start = time.perf_counter()
    stream = submit(engine, ids, params, body.rid or new_id("gen"), "input_ids" if body.input_ids else "text")
    shape = _GenerateShape(engine.tokenizer, body, ids, start)
    if body.stream:
        return EventStreamResponse(_generate_chunks(stream, shape), stream.close)
    outputs = await collect(request, stream)
    if outputs is None:
        return CLIENT_CLOSED
    return shape.body(stream.request_id, outputs)


class _GenerateShape:
    """SGLang's /generate body: the text and ids so far, and meta_info."""

    def __init__(self, tokenizer, request: GenerateRequest, prompt_ids: list[int], start: float):
        self.tokenizer, self.request, self.prompt_ids, self.start = tokenizer, request, prompt_ids, start

    def body(self, rid: str, outputs: list) -> dict:
        last = outputs[-1]
        reason = {"type": last.finish_reason} if last.finish_reason else None
        meta = {"id": rid, "prompt_tokens": last.prompt_tokens, "completion_tokens": last.completion_tokens,
                "finish_reason": reason, "e2e_latency": time.perf_counter() - self.start}
        if self.request.return_logprob:
            items = [item for o in outputs for item in (o.logprobs or [])]
            meta.update(generate_logprobs(self.tokenizer, items, self.request.top_logprobs_num,
                                          self.request.return_text_in_logprobs))
            if self.request.logprob_start_len >= 0:
                meta.update(input_logprobs(self.tokenizer, self.prompt_ids, outputs[0].prompt_logprobs or [],
                                           self.request.logprob_start_len, self.request.top_logprobs_num,
                                           self.request.return_text_in_logprobs))
        return {"text": "".join(o.text for o in outputs), "output_ids": [t for o in outputs for t in o.token_ids],
                "meta_info": meta}


async def _generate_chunks(stream: RequestStream, shape: _GenerateShape) -> AsyncIterator[str]:
    outputs = []  # SGLang streams everything so far in every chunk, not deltas
    async for out in stream:
        outputs.append(out)
        if out.error:
            yield error_event(out)
        yield sse(shape.body(stream.request_id, outputs))
    yield sse("[DONE]")
