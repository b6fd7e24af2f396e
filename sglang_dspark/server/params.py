"""From validated request bodies to what the engine takes: sampling parameters and prompt ids."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool

from sglang_dspark.engine.sampling import MAX_TOP_LOGPROBS, SamplingParams
from sglang_dspark.server.errors import APIError, from_value_error
from sglang_dspark.server.fields import check_extra_fields
from sglang_dspark.server.protocol import ChatCompletionRequest, CompletionRequest, GenerateRequest, _Sampling

DEFAULT_MAX_TOKENS = SamplingParams().max_tokens  # SGLang's /generate default


def _stop(stop: str | list[str] | None, param: str) -> tuple[str, ...]:
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if any(not s for s in stops):
        raise APIError(400, f"{param}: stop strings must be non-empty", param=param)
    return stops


def _build(param_names: dict[str, str], **kwargs) -> SamplingParams:
    try:
        return SamplingParams(**kwargs)
    except ValueError as exc:
        err = from_value_error(exc)
        if err.param in param_names:  # report the client's own field name
            err.message = err.message.replace(err.param, param_names[err.param], 1)
            err.param = param_names[err.param]
        raise err from None


def _default_max_tokens(room: int) -> int:
    """For a client that gives no limit. `room`: context left after the prompt. OpenAI's API means
    "up to the context" and SGLang's /generate means 128; both are capped at the room (a prompt that
    fits is never refused for a limit the client did not ask for) and at 128 (a forgotten limit
    cannot hold a slot for the whole context)."""
    return max(1, min(DEFAULT_MAX_TOKENS, room))


def _top(count: int | None, param: str) -> int:
    if count is not None and not 0 <= count <= MAX_TOP_LOGPROBS:
        raise APIError(400, f"{param}: must be in [0, {MAX_TOP_LOGPROBS}], got {count}", param=param)
    return count or 0


def _logprob_request(body: _Sampling) -> tuple[bool, int]:
    """(return logprobs, alternatives per token) from OpenAI's chat or completions fields."""
    if isinstance(body, ChatCompletionRequest):
        if body.top_logprobs is not None and not body.logprobs:
            raise APIError(400, "top_logprobs: needs logprobs: true", param="top_logprobs")
        return body.logprobs, _top(body.top_logprobs, "top_logprobs")
    return body.logprobs is not None, _top(body.logprobs, "logprobs")


def _logit_bias(bias: dict[str, float] | None, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """OpenAI's {"token id": bias} as (id, bias) pairs; ids outside the vocabulary are the client's error."""
    pairs = []
    for key, value in (bias or {}).items():
        if not key.isdigit() or int(key) >= vocab_size:
            raise APIError(400, f"logit_bias: key {key!r} is not a token id in [0, {vocab_size})", param="logit_bias")
        pairs.append((int(key), float(value)))
    return tuple(pairs)


def choices_per_prompt(body: _Sampling) -> int:
    """n (default 1); completions' best_of only where it asks for nothing beyond the n returned."""
    n = 1 if body.n is None else body.n
    if n < 1:
        raise APIError(400, f"n: must be >= 1, got {n}", param="n")
    if isinstance(body, CompletionRequest) and body.best_of not in (None, n):
        raise APIError(400, f"best_of: only best_of == n is supported (got best_of {body.best_of}, n {n})",
                       param="best_of")
    return n


def echo_only(body: _Sampling) -> bool:
    """Completions' `echo` with `max_tokens: 0`: the prompt and its logprobs, no completion."""
    return isinstance(body, CompletionRequest) and body.echo and body.max_tokens == 0


def _skip_special_tokens(body: _Sampling) -> bool:
    """SGLang's rule: special tokens are dropped from the text unless the client says otherwise,
    and always kept when the model may call a tool (call markers such as mistral's [TOOL_CALLS] or
    llama 3's <|python_tag|> are special tokens, and the call parser must see them)."""
    if isinstance(body, ChatCompletionRequest) and body.tools and body.tool_choice != "none":
        return False
    return True if body.skip_special_tokens is None else body.skip_special_tokens


def openai_params(body: _Sampling, room: int, vocab_size: int, grammar=None) -> SamplingParams:
    check_extra_fields(body.model_extra)
    max_tokens = body.max_tokens
    if isinstance(body, ChatCompletionRequest) and body.max_completion_tokens is not None:
        max_tokens = body.max_completion_tokens
    if echo_only(body):
        max_tokens = 1  # the engine emits at least one token; the server drops it
    logprobs, top = _logprob_request(body)
    echo = isinstance(body, CompletionRequest) and body.echo
    return _build(
        {},
        logprobs=logprobs,
        top_logprobs=top,
        prompt_logprobs=echo and logprobs,
        grammar=grammar,
        logit_bias=_logit_bias(body.logit_bias, vocab_size),
        max_tokens=_default_max_tokens(room) if max_tokens is None else max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=0 if body.top_k in (None, -1) else body.top_k,
        stop=_stop(body.stop, "stop"),
        seed=body.seed,
        ignore_eos=body.ignore_eos,
        skip_special_tokens=_skip_special_tokens(body),
    )


def generate_params(body: GenerateRequest, prompt_len: int, room: int, grammar=None) -> SamplingParams:
    sp = body.sampling_params
    check_extra_fields(sp.model_extra, "sampling_params.")
    if not -1 <= body.logprob_start_len < prompt_len:
        raise APIError(400, f"logprob_start_len: must be -1 (output tokens only) or a prompt position in "
                            f"[0, {prompt_len}), got {body.logprob_start_len}", param="logprob_start_len")
    return _build(
        {"max_tokens": "max_new_tokens"},
        logprobs=body.return_logprob,
        top_logprobs=_top(body.top_logprobs_num, "top_logprobs_num") if body.return_logprob else 0,
        prompt_logprobs=body.return_logprob and body.logprob_start_len >= 0,
        grammar=grammar,
        max_tokens=_default_max_tokens(room) if sp.max_new_tokens is None else sp.max_new_tokens,
        temperature=sp.temperature,
        top_p=sp.top_p,
        top_k=0 if sp.top_k == -1 else sp.top_k,
        stop=_stop(sp.stop, "stop"),
        seed=sp.seed,
        ignore_eos=sp.ignore_eos,
        skip_special_tokens=sp.skip_special_tokens,
    )


def check_model(engine_name: str, requested: str | None) -> None:
    if requested is not None and requested != engine_name:
        raise APIError(404, f"The model '{requested}' does not exist; this server serves '{engine_name}'",
                       param="model", code="model_not_found")


def _chat_ids(tokenizer, body: ChatCompletionRequest) -> list[int]:
    messages = []
    for i, m in enumerate(body.messages):
        content = m.content
        if isinstance(content, list):
            if any(p.type != "text" or p.text is None for p in content):
                raise APIError(400, f"messages[{i}].content: only text parts are supported",
                               param=f"messages.{i}.content")
            content = "".join(p.text for p in content)
        messages.append({**m.model_dump(exclude_none=True), "content": content or ""})
    tools = {"tools": [t.model_dump(exclude_none=True) for t in body.tools]} if body.tools else {}
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **tools)
    except Exception as exc:  # the template rejects e.g. roles out of order: the client's fault
        raise APIError(400, f"messages: chat template failed: {exc}", param="messages") from None
    return tokenizer.encode(text, add_special_tokens=False)  # the template already placed BOS


async def chat_prompt_ids(tokenizer, body: ChatCompletionRequest) -> list[int]:
    if not body.messages:
        raise APIError(400, "messages: must not be empty", param="messages")
    return await run_in_threadpool(_chat_ids, tokenizer, body)


async def completion_prompts(tokenizer, body: CompletionRequest) -> list[list[int]]:
    """Each prompt's ids: one string, one id list, or a list of either (a batch)."""
    prompt = body.prompt
    if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int):
        prompts = [prompt]
    else:
        prompts = prompt
    out = []
    for p in prompts:
        if isinstance(p, str):
            p = await run_in_threadpool(tokenizer.encode, p) if p else []
        out.append(check_token_ids(p, len(tokenizer), "prompt"))
    return out


def check_token_ids(ids: list[int], vocab_size: int, param: str) -> list[int]:
    """Client-given ids are checked here: an id outside the vocabulary would fail a whole engine step."""
    if not ids:
        raise APIError(400, f"{param}: must not be empty", param=param)
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise APIError(400, f"{param}: token id {bad} is outside the vocabulary [0, {vocab_size})", param=param)
    return ids
