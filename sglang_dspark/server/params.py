"""From validated request bodies to what the engine takes: sampling parameters and prompt ids."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool

from sglang_dspark.engine.sampling import MAX_TOP_LOGPROBS, SamplingParams
from sglang_dspark.server.errors import APIError, from_value_error
from sglang_dspark.server.fields import check_extra_fields
from sglang_dspark.server.protocol import ChatCompletionRequest, CompletionRequest, GenerateRequest, _Sampling

DEFAULT_MAX_TOKENS = SamplingParams().max_tokens  # SGLang's /generate default
# what one request may ask of the per-token stop matching (docs/REQUEST_FIELDS.md, "Bounds")
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 512
MAX_CHARS_PER_TOKEN = 32  # prompt text beyond this many characters per token of context cannot fit


def _stop(stop: str | list[str] | None, param: str) -> tuple[str, ...]:
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if any(not s for s in stops):
        raise APIError(400, f"{param}: stop strings must be non-empty", param=param)
    if len(stops) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in stops):
        raise APIError(400, f"{param}: at most {MAX_STOP_STRINGS} stop strings of at most {MAX_STOP_CHARS} "
                            f"characters each (every emitted token is matched against them)", param=param)
    return stops


def _top_k(top_k: int | None, vocab_size: int) -> int:
    """SGLang's mapping: -1 (and omitted) is no top-k, and so is a top_k at or above the vocabulary
    (SGLang's sampler clamps it to the vocabulary); 0 means no top-k here too. Other negative values
    are refused by SamplingParams."""
    return 0 if top_k is None or top_k == -1 or top_k >= vocab_size else top_k


def _token_id(key: str) -> int | None:
    """An ASCII decimal integer's value, else None (str.isdigit also takes '²' and '٣', which int() refuses
    or reads as another number)."""
    return int(key) if key.isascii() and key.isdecimal() else None


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
        token = _token_id(key)
        if token is None or token >= vocab_size:
            raise APIError(400, f"logit_bias: key {key!r} is not a token id in [0, {vocab_size})", param="logit_bias")
        pairs.append((token, float(value)))
    if len({t for t, _ in pairs}) != len(pairs):  # "7" and "007" name one token
        raise APIError(400, "logit_bias: a token id is given more than once", param="logit_bias")
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


def request_limits(engine) -> dict:
    """What one request may ask for, as /v1/models and /get_server_info report it (docs/REQUEST_FIELDS.md)."""
    return {"max_model_len": engine.max_len, "max_in_flight": getattr(engine, "max_in_flight", None),
            "max_stop_strings": MAX_STOP_STRINGS, "max_stop_chars": MAX_STOP_CHARS,
            "max_prompt_chars": MAX_CHARS_PER_TOKEN * engine.max_len, "vocab_size": len(engine.tokenizer)}


def check_choice_count(engine, count: int, param: str = "n") -> None:
    """A request's choices (n, times the prompts of a batch) must fit what the engine can hold at
    once (running + queued); more could never all be admitted, and would only wedge the queue."""
    limit = getattr(engine, "max_in_flight", None)
    if limit is not None and count > limit:
        raise APIError(400, f"{param}: this request asks for {count} generations; the server holds at most {limit} "
                            f"at once (--max-running + --max-queued-requests)", param=param)


def check_text_size(text: str, max_len: int, param: str) -> None:
    """Text longer than MAX_CHARS_PER_TOKEN characters per token of context cannot fit the context
    once tokenized; refused before the tokenizer spends seconds on it."""
    if len(text) > MAX_CHARS_PER_TOKEN * max_len:
        raise APIError(400, f"{param}: {len(text)} characters cannot fit the context of {max_len} tokens",
                       param=param, code="context_length_exceeded")


def reject_unencodable(body) -> None:
    """Every string of the request must be valid Unicode: JSON's "\ud800" parses into a lone
    surrogate, which the tokenizer (and the UTF-8 response) cannot encode. A 400 naming the field."""
    path = _first_unencodable(body.model_dump(exclude_none=True))
    if path is not None:
        raise APIError(400, f"{path}: contains a lone UTF-16 surrogate, which is not valid Unicode text", param=path)


def _first_unencodable(value, path: str = "") -> str | None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "body"
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, item in items:
        if isinstance(key, str) and _first_unencodable(key) is not None:
            return f"{path}.{key!r}".lstrip(".")
        found = _first_unencodable(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


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
        top_k=_top_k(body.top_k, vocab_size),
        stop=_stop(body.stop, "stop"),
        seed=body.seed,
        ignore_eos=body.ignore_eos,
        skip_special_tokens=_skip_special_tokens(body),
    )


def generate_params(body: GenerateRequest, prompt_len: int, room: int, vocab_size: int, grammar=None) -> SamplingParams:
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
        top_k=_top_k(sp.top_k, vocab_size),
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


async def chat_prompt_ids(tokenizer, body: ChatCompletionRequest, max_len: int) -> list[int]:
    if not body.messages:
        raise APIError(400, "messages: must not be empty", param="messages")
    check_text_size("".join(_text_of(m.content) for m in body.messages), max_len, "messages")
    return await run_in_threadpool(_chat_ids, tokenizer, body)


def _text_of(content) -> str:
    if isinstance(content, list):
        return "".join(p.text or "" for p in content)
    return content or ""


async def completion_prompts(tokenizer, body: CompletionRequest, max_len: int) -> list[list[int]]:
    """Each prompt's ids: one string, one id list, or a list of either (a batch)."""
    prompt = body.prompt
    if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int):
        prompts = [prompt]
    else:
        prompts = prompt
    out = []
    for p in prompts:
        if isinstance(p, str):
            check_text_size(p, max_len, "prompt")
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
