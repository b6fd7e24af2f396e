"""OpenAI-compatible endpoints: /v1/models, /v1/chat/completions, /v1/completions."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Request

from sglang_dspark.server.common import CLIENT_CLOSED, engine_of, new_id, now, served_name, submit, usage
from sglang_dspark.server.logprobs import chat_logprobs, completion_logprobs
from sglang_dspark.server.params import chat_prompt_ids, check_model, completion_prompt_ids, openai_params
from sglang_dspark.server.protocol import ChatCompletionRequest, CompletionRequest
from sglang_dspark.server.streams import EventStreamResponse, RequestStream, collect, sse

router = APIRouter()


@router.get("/v1/models")
async def models(request: Request) -> dict:
    engine = engine_of(request)
    card = {"id": served_name(request), "object": "model", "created": now(), "owned_by": "sglang_dspark",
            "root": engine.model_name, "max_model_len": engine.max_len}
    return {"object": "list", "data": [card]}


def _logprob_items(outputs) -> list:
    return [item for o in outputs for item in (o.logprobs or [])]


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    engine, model = engine_of(request), served_name(request)
    check_model(model, body.model)
    ids = await chat_prompt_ids(engine.tokenizer, body)
    params = openai_params(body, engine.max_len - len(ids))
    stream = submit(engine, ids, params, new_id("chatcmpl"), "messages")
    base = {"id": stream.request_id, "created": now(), "model": model}
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return EventStreamResponse(_chat_chunks(stream, base, include_usage, engine.tokenizer), stream.close)
    outputs = await collect(request, stream)
    if outputs is None:
        return CLIENT_CLOSED
    message = {"role": "assistant", "content": "".join(o.text for o in outputs)}
    logprobs = chat_logprobs(engine.tokenizer, _logprob_items(outputs)) if params.logprobs else None
    choice = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": outputs[-1].finish_reason}
    return {**base, "object": "chat.completion", "choices": [choice], "usage": usage(outputs[-1])}


async def _chat_chunks(stream: RequestStream, base: dict, include_usage: bool, tokenizer) -> AsyncIterator[str]:
    base = {**base, "object": "chat.completion.chunk"}
    extra = {"usage": None} if include_usage else {}

    def chunk(delta: dict, finish_reason=None, logprobs=None) -> str:
        return sse({**base, "choices": [{"index": 0, "delta": delta, "logprobs": logprobs,
                                         "finish_reason": finish_reason}], **extra})

    yield chunk({"role": "assistant", "content": ""})
    async for out in stream:
        if out.text or out.logprobs:
            yield chunk({"content": out.text}, logprobs=chat_logprobs(tokenizer, out.logprobs) if out.logprobs else None)
        if out.finished:
            yield chunk({}, out.finish_reason)
            if include_usage:
                yield sse({**base, "choices": [], "usage": usage(out)})
    yield sse("[DONE]")


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request):
    engine, model = engine_of(request), served_name(request)
    check_model(model, body.model)
    ids = await completion_prompt_ids(engine.tokenizer, body)
    params = openai_params(body, engine.max_len - len(ids))
    stream = submit(engine, ids, params, new_id("cmpl"), "prompt")
    base = {"id": stream.request_id, "object": "text_completion", "created": now(), "model": model}
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return EventStreamResponse(_completion_chunks(stream, base, include_usage, engine.tokenizer), stream.close)
    outputs = await collect(request, stream)
    if outputs is None:
        return CLIENT_CLOSED
    logprobs = completion_logprobs(engine.tokenizer, _logprob_items(outputs)) if params.logprobs else None
    choice = {"index": 0, "text": "".join(o.text for o in outputs), "logprobs": logprobs,
              "finish_reason": outputs[-1].finish_reason}
    return {**base, "choices": [choice], "usage": usage(outputs[-1])}


async def _completion_chunks(stream: RequestStream, base: dict, include_usage: bool, tokenizer) -> AsyncIterator[str]:
    extra = {"usage": None} if include_usage else {}
    offset = 0
    async for out in stream:
        if out.text or out.finished or out.logprobs:
            logprobs = completion_logprobs(tokenizer, out.logprobs, offset) if out.logprobs else None
            choice = {"index": 0, "text": out.text, "logprobs": logprobs, "finish_reason": out.finish_reason}
            yield sse({**base, "choices": [choice], **extra})
        offset += len(out.text)
        if out.finished and include_usage:
            yield sse({**base, "choices": [], "usage": usage(out)})
    yield sse("[DONE]")
