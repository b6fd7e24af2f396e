"""SGLang's native endpoints: /generate, /server_info, /metrics, /flush_cache, /health, /set_internal_state."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool

from sglang_dspark.server.common import CLIENT_CLOSED, engine_of, new_id, submit
from sglang_dspark.server.errors import APIError
from sglang_dspark.server.params import check_token_ids, generate_params
from sglang_dspark.server.protocol import GenerateRequest
from sglang_dspark.server.streams import EventStreamResponse, RequestStream, collect, sse

router = APIRouter()

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@router.get("/health")
async def health() -> Response:
    return Response(status_code=200)


@router.get("/server_info")
@router.get("/get_server_info")
async def server_info(request: Request) -> dict:
    return engine_of(request).server_info()


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(engine_of(request).metrics.render(), headers={"Content-Type": PROMETHEUS_CONTENT_TYPE})


@router.post("/flush_cache")
async def flush_cache(request: Request) -> Response:
    if not engine_of(request).flush_cache():
        raise APIError(400, "cache not flushed: requests are running or waiting", code="engine_busy")
    return PlainTextResponse("Cache flushed.\n")


INTERNAL_STATE_KEYS = ("dspark_force_budget_frac", "dspark_clear_info_records")


@router.api_route("/set_internal_state", methods=["POST", "PUT"])
async def set_internal_state(request: Request) -> dict:
    """SGLang's runtime knobs the SPS profiler uses: `{"server_args": {"dspark_force_budget_frac":
    f | null, "dspark_clear_info_records": bool}}`. f in [0, 1] fixes the verify budget at
    f * requests * gamma; null gives it back to the planner."""
    try:
        body = await request.json()
    except ValueError:
        raise APIError(400, "malformed JSON body", param="server_args") from None
    args = body.get("server_args") if isinstance(body, dict) else None
    if not isinstance(args, dict) or not args:
        raise APIError(400, "server_args: a non-empty object is required", param="server_args")
    for key in args:
        if key not in INTERNAL_STATE_KEYS:
            raise APIError(400, f"server_args.{key}: not supported (supported: {', '.join(INTERNAL_STATE_KEYS)})",
                           param=f"server_args.{key}")
    frac = args.get("dspark_force_budget_frac")
    if "dspark_force_budget_frac" in args and frac is not None:
        if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0.0 <= frac <= 1.0:
            raise APIError(400, f"server_args.dspark_force_budget_frac: must be a number in [0, 1] or null, got {frac!r}",
                           param="server_args.dspark_force_budget_frac")
    clear = args.get("dspark_clear_info_records", False)
    if not isinstance(clear, (bool, int)):
        raise APIError(400, "server_args.dspark_clear_info_records: must be a boolean",
                       param="server_args.dspark_clear_info_records")
    engine = engine_of(request)
    if "dspark_force_budget_frac" in args:
        engine.forced_budget_frac = None if frac is None else float(frac)
    if clear:
        engine.records.clear()
    return {"updated": True, "server_args": {"dspark_force_budget_frac": engine.forced_budget_frac}}


@router.post("/generate")
async def generate(body: GenerateRequest, request: Request):
    engine = engine_of(request)
    if (body.text is None) == (body.input_ids is None):
        raise APIError(400, "exactly one of text or input_ids is required", param="text")
    if body.input_ids is not None:
        ids = check_token_ids(body.input_ids, len(engine.tokenizer), "input_ids")
    else:
        text_ids = await run_in_threadpool(engine.tokenizer.encode, body.text) if body.text else []
        ids = check_token_ids(text_ids, len(engine.tokenizer), "text")
    params = generate_params(body.sampling_params, engine.max_len - len(ids))
    start = time.perf_counter()
    stream = submit(engine, ids, params, body.rid or new_id("gen"), "input_ids" if body.input_ids else "text")
    if body.stream:
        return EventStreamResponse(_generate_chunks(stream, start), stream.close)
    outputs = await collect(request, stream)
    if outputs is None:
        return CLIENT_CLOSED
    text, output_ids = "".join(o.text for o in outputs), [t for o in outputs for t in o.token_ids]
    return _generate_body(stream.request_id, text, output_ids, outputs[-1], start)


def _generate_body(rid: str, text: str, output_ids: list[int], last, start: float) -> dict:
    reason = {"type": last.finish_reason} if last.finish_reason else None
    meta = {"id": rid, "prompt_tokens": last.prompt_tokens, "completion_tokens": last.completion_tokens,
            "finish_reason": reason, "e2e_latency": time.perf_counter() - start}
    return {"text": text, "output_ids": output_ids, "meta_info": meta}


async def _generate_chunks(stream: RequestStream, start: float) -> AsyncIterator[str]:
    # SGLang streams the text and ids so far in every chunk, not deltas
    text, output_ids = "", []
    async for out in stream:
        text += out.text
        output_ids += out.token_ids
        yield sse(_generate_body(stream.request_id, text, output_ids, out, start))
    yield sse("[DONE]")
