"""OpenAI-compatible endpoints: /v1/models, /v1/chat/completions, /v1/completions (n choices per
prompt, a batch of prompts, echo with prompt logprobs; streaming, logprobs)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Request

from sglang_dspark.server.common import (CLIENT_CLOSED, engine_of, new_id, now, served_name, submit_choices,
                                         usage_of)
from sglang_dspark.server.grammars import compile_grammar, response_format_spec
from sglang_dspark.server.logprobs import chat_logprobs, completion_logprobs, echo_logprobs
from sglang_dspark.server.params import (chat_prompt_ids, check_choice_count, check_model, choices_per_prompt,
                                         completion_prompts, echo_only, openai_params, reject_unencodable,
                                         request_limits)
from sglang_dspark.server.protocol import ChatCompletionRequest, CompletionRequest
from sglang_dspark.server.streams import EventStreamResponse, RequestStream, collect_all, error_event, merged, sse
from sglang_dspark.server.tools import AutoCalls, forced_call, tool_calls

router = APIRouter()


@router.get("/v1/models")
async def models(request: Request) -> dict:
    engine = engine_of(request)
    card = {"id": served_name(request), "object": "model", "created": now(), "owned_by": "sglang_dspark",
            "root": engine.model_name, "max_model_len": engine.max_len, "limits": request_limits(engine)}
    return {"object": "list", "data": [card]}


def _logprob_items(outputs) -> list:
    return [item for o in outputs for item in (o.logprobs or [])]


def _closer(streams: list[RequestStream]):
    return lambda: [s.close() for s in streams]


def _include_usage(body) -> bool:
    return bool(body.stream_options and body.stream_options.include_usage)


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    engine, model = engine_of(request), served_name(request)
    check_model(model, body.model)
    reject_unencodable(body)
    n = choices_per_prompt(body)
    check_choice_count(engine, n)
    call = forced_call(body, getattr(request.app.state, "tool_call_parser", None))
    ids = await chat_prompt_ids(engine.tokenizer, body, engine.max_len)
    if call is not None and not isinstance(call, AutoCalls):
        grammar = await compile_grammar(request, call.spec, "tools")
    else:
        grammar = await compile_grammar(request, response_format_spec(body.response_format), "response_format")
    params = openai_params(body, engine.max_len - len(ids), len(engine.tokenizer), grammar)
    rid = new_id("chatcmpl")
    streams = submit_choices(engine, [ids], [params], n, rid, "messages")
    base = {"id": rid, "created": now(), "model": model}
    if body.stream:
        return EventStreamResponse(_chat_chunks(streams, base, _include_usage(body), engine.tokenizer, call),
                                   _closer(streams))
    results = await collect_all(request, streams)
    if results is None:
        return CLIENT_CLOSED
    choices = []
    for i, outputs in enumerate(results):
        text, reason = "".join(o.text for o in outputs), outputs[-1].finish_reason
        message = {"role": "assistant", "content": text}
        if isinstance(call, AutoCalls):
            content, calls = call.parse(text)
            if calls:  # SGLang's answer: the text around the calls, and finish_reason tool_calls
                message = {"role": "assistant", "content": content, "tool_calls": calls}
                reason = "tool_calls" if reason == "stop" else reason
        elif call is not None:
            message, reason = _call_message(call, text, reason)
        logprobs = chat_logprobs(engine.tokenizer, _logprob_items(outputs)) if params.logprobs else None
        choices.append({"index": i, "message": message, "logprobs": logprobs, "finish_reason": reason})
    return {**base, "object": "chat.completion", "choices": choices, "usage": usage_of([r[-1] for r in results], n)}


def _call_message(call, text: str, reason: str | None) -> tuple[dict, str | None]:
    """The assistant message of a forced tool call, and its finish_reason ("tool_calls" once the
    call's JSON is complete)."""
    calls = tool_calls(call, text)
    done = reason == "stop" and bool(calls)
    return {"role": "assistant", "content": None, "tool_calls": calls}, "tool_calls" if done else reason


async def _chat_chunks(streams: list[RequestStream], base: dict, include_usage: bool, tokenizer, call=None
                       ) -> AsyncIterator[str]:
    base = {**base, "object": "chat.completion.chunk"}
    extra = {"usage": None} if include_usage else {}

    def chunk(i: int, delta: dict, finish_reason=None, logprobs=None) -> str:
        return sse({**base, "choices": [{"index": i, "delta": delta, "logprobs": logprobs,
                                         "finish_reason": finish_reason}], **extra})

    for i in range(len(streams)):
        yield chunk(i, {"role": "assistant", "content": ""})
    finals = [None] * len(streams)
    texts = [""] * len(streams)  # a forced call is sent whole once its JSON is complete
    auto = isinstance(call, AutoCalls)
    feeds = [call.stream() for _ in streams] if auto else []  # tool_choice auto: parsed as it streams
    called = [False] * len(streams)
    async for i, out in merged(streams):
        if auto:
            pieces = [feeds[i](out.text)] + ([feeds[i](None)] if out.finished else [])
            logprobs = chat_logprobs(tokenizer, out.logprobs) if out.logprobs else None
            for content, calls in pieces:
                if content or logprobs:  # this output's logprobs go with its first chunk, even an empty one
                    yield chunk(i, {"content": content}, logprobs=logprobs)
                    logprobs = None
                for c in calls:
                    called[i] = True
                    yield chunk(i, {"tool_calls": [c]})
        elif call is not None:
            texts[i] += out.text
        elif out.text or out.logprobs:
            yield chunk(i, {"content": out.text},
                        logprobs=chat_logprobs(tokenizer, out.logprobs) if out.logprobs else None)
        if out.finished:
            finals[i] = out
            reason = out.finish_reason
            if out.error:
                yield error_event(out)
            if auto:
                reason = "tool_calls" if called[i] and reason == "stop" else reason
            elif call is not None:
                message, reason = _call_message(call, texts[i], reason)
                calls = [{"index": k, **c} for k, c in enumerate(message["tool_calls"])]
                yield chunk(i, {"tool_calls": calls})
            yield chunk(i, {}, reason)
    if include_usage:
        yield sse({**base, "choices": [], "usage": usage_of(finals, len(streams))})
    yield sse("[DONE]")


class _CompletionShape:
    """One completions request's choices: the echoed prompt (text and logprobs) in front of each
    choice when asked, the engine's one token dropped for `max_tokens: 0`."""

    def __init__(self, tokenizer, body: CompletionRequest, prompts: list[list[int]], n: int, logprobs: bool):
        self.tokenizer, self.n, self.logprobs = tokenizer, n, logprobs
        self.echo, self.drop = body.echo, echo_only(body)
        texts = body.prompt if isinstance(body.prompt, list) and body.prompt and isinstance(body.prompt[0], str) \
            else [body.prompt] if isinstance(body.prompt, str) else None
        self.prompts = prompts
        self.prompt_texts = texts or [tokenizer.decode(p, skip_special_tokens=False) for p in prompts]

    def prompt_of(self, choice: int) -> int:
        return choice // self.n

    def first(self, choice: int, out) -> tuple[str, dict | None]:
        """Text and logprobs of a choice's first output (the echo goes in front)."""
        p = self.prompt_of(choice)
        text = ("" if self.drop else out.text)
        items = None if self.drop else out.logprobs
        if not self.echo:
            return text, completion_logprobs(self.tokenizer, items) if self.logprobs and items is not None else None
        logprobs = echo_logprobs(self.tokenizer, self.prompts[p], out.prompt_logprobs or [], items) \
            if self.logprobs else None
        return self.prompt_texts[p] + text, logprobs

    def choice(self, choice: int, outputs: list) -> dict:
        kept = [] if self.drop else outputs
        text = "".join(o.text for o in kept)
        items = _logprob_items(kept)
        logprobs = None
        if self.echo:
            p = self.prompt_of(choice)
            text = self.prompt_texts[p] + text
            if self.logprobs:
                logprobs = echo_logprobs(self.tokenizer, self.prompts[p], outputs[0].prompt_logprobs or [], items)
        elif self.logprobs:
            logprobs = completion_logprobs(self.tokenizer, items)
        reason = "length" if self.drop else outputs[-1].finish_reason
        return {"index": choice, "text": text, "logprobs": logprobs, "finish_reason": reason}

    def usage(self, finals: list) -> dict:
        return usage_of(finals, self.n, 0 if self.drop else None)


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request):
    engine, model = engine_of(request), served_name(request)
    check_model(model, body.model)
    reject_unencodable(body)
    n = choices_per_prompt(body)
    batch = len(body.prompt) if isinstance(body.prompt, list) and body.prompt and not isinstance(body.prompt[0], int) else 1
    check_choice_count(engine, n * batch)
    prompts = await completion_prompts(engine.tokenizer, body, engine.max_len)
    vocab = len(engine.tokenizer)
    params = [openai_params(body, engine.max_len - len(ids), vocab) for ids in prompts]
    shape = _CompletionShape(engine.tokenizer, body, prompts, n, params[0].logprobs)
    rid = new_id("cmpl")
    streams = submit_choices(engine, prompts, params, n, rid, "prompt")
    base = {"id": rid, "object": "text_completion", "created": now(), "model": model}
    if body.stream:
        return EventStreamResponse(_completion_chunks(streams, base, _include_usage(body), shape), _closer(streams))
    results = await collect_all(request, streams)
    if results is None:
        return CLIENT_CLOSED
    return {**base, "choices": [shape.choice(i, outputs) for i, outputs in enumerate(results)],
            "usage": shape.usage([r[-1] for r in results])}


async def _completion_chunks(streams: list[RequestStream], base: dict, include_usage: bool, shape: _CompletionShape
                             ) -> AsyncIterator[str]:
    extra = {"usage": None} if include_usage else {}
    offsets = [None] * len(streams)  # text sent so far per choice; None before its first output
    finals = [None] * len(streams)
    async for i, out in merged(streams):
        if offsets[i] is None:
            text, logprobs = shape.first(i, out)
            offsets[i] = 0
        else:
            text = "" if shape.drop else out.text
            logprobs = completion_logprobs(shape.tokenizer, out.logprobs, offsets[i]) \
                if out.logprobs and not shape.drop else None
        if out.error:
            yield error_event(out)
        if text or out.finished or logprobs:
            reason = ("length" if shape.drop else out.finish_reason) if out.finished else None
            yield sse({**base, "choices": [{"index": i, "text": text, "logprobs": logprobs, "finish_reason": reason}],
                       **extra})
        offsets[i] += len(text)
        if out.finished:
            finals[i] = out
    if include_usage:
        yield sse({**base, "choices": [], "usage": shape.usage(finals)})
    yield sse("[DONE]")
