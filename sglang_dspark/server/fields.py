"""The request-field policy (docs/REQUEST_FIELDS.md): every field is honoured (declared in
protocol.py), inert (cannot change the generated text, so any value is accepted), or refused with a
400 that names it unless its value is the one that changes nothing. Unknown fields are refused too:
a field accepted and ignored is an answer the client did not ask for."""

from __future__ import annotations

from typing import Any

from sglang_dspark.server.errors import APIError

# OpenAI fields about billing, storage, routing or latency; none changes which tokens come out.
INERT = frozenset({
    "user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key",
    "prompt_cache_retention",
    "prediction",  # predicted outputs only speed decoding up; the answer is the model's either way
    "parallel_tool_calls",  # a forced call is one call either way (under auto, tools.py refuses false)
    # SGLang's: they split a reasoning model's output only under --reasoning-parser, which this
    # server does not have (SGLang without one ignores them too)
    "separate_reasoning", "stream_reasoning",
})


def _none_or(*values):
    return lambda v: v is None or v in values


# Refused fields with the values at which they change nothing (clients often send the defaults).
NEUTRAL = {
    "frequency_penalty": _none_or(0, 0.0),
    "presence_penalty": _none_or(0, 0.0),
    "repetition_penalty": _none_or(1, 1.0),  # SGLang extension
    "min_p": _none_or(0, 0.0),  # SGLang extension
    "min_tokens": _none_or(0),  # SGLang extension
    "functions": lambda v: not v,
    "function_call": _none_or("none"),
    "modalities": lambda v: v is None or v == ["text"],
    "audio": _none_or(),
    "reasoning_effort": _none_or(),
    "verbosity": _none_or(),
    "web_search_options": _none_or(),
    "suffix": _none_or(""),
    "structural_tag": _none_or(),  # SGLang's tag-triggered grammars
    "json_schema": _none_or(),  # SGLang's grammar parameters: served on /generate's sampling_params
    "regex": _none_or(),
    "ebnf": _none_or(),
    # the rest of SGLang's chat / completions extensions, at the defaults its clients (sglang-router)
    # send back when they re-serialise a request
    "continue_final_message": _none_or(False),
    "chat_template_kwargs": lambda v: not v,
    "session_params": _none_or(),
    "return_hidden_states": _none_or(False),
    "sampling_seed": _none_or(),
    "rid": _none_or(),
    "spaces_between_special_tokens": _none_or(True),
    "no_stop_trim": _none_or(False),
    "stop_token_ids": lambda v: not v,
    "lora_path": _none_or(),
}


def check_extra_fields(extra: dict[str, Any] | None, prefix: str = "") -> None:
    """Refuse the first field of `extra` (what a body held beyond its declared fields) that is
    neither inert nor at its neutral value."""
    for name, value in (extra or {}).items():
        param = prefix + name
        if name in INERT:
            continue
        if name not in NEUTRAL:
            raise APIError(400, f"{param}: unknown field; not accepted, so that nothing is ignored silently",
                           param=param, code="unsupported_field")
        if not NEUTRAL[name](value):
            raise APIError(400, f"{param}: not supported by this server (only its no-op value is accepted)",
                           param=param, code="unsupported_field")
