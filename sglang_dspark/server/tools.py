"""`tools` with a forced `tool_choice` (a named function, or `required`): the call's JSON is
decoded under the grammar of the function's parameter schema (engine/grammar.py), so its
arguments validate, and the answer is OpenAI's `tool_calls`. `auto` (the model decides whether to
call) needs the model's own call format and parser, which the reference engine does not have: it is
refused by name."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from sglang_dspark.engine.grammar import GrammarSpec
from sglang_dspark.server.errors import APIError
from sglang_dspark.server.protocol import ChatCompletionRequest

ANY_OBJECT = {"type": "object"}


@dataclass(frozen=True)
class ForcedCall:
    name: str | None  # the named function; None for `required` (the output names it)
    spec: GrammarSpec


def forced_call(body: ChatCompletionRequest) -> ForcedCall | None:
    """The forced call the request asks for, or None when the answer is text."""
    tools, choice = body.tools or [], body.tool_choice
    if not tools:
        if choice not in (None, "none"):
            raise APIError(400, "tool_choice: needs tools", param="tool_choice")
        return None
    if choice == "none":
        return None
    if choice in (None, "auto"):
        raise APIError(400, "tool_choice: auto (the default with tools) is not supported by this server; name a "
                            "function or use required", param="tool_choice", code="unsupported_field")
    if body.response_format is not None and body.response_format.type != "text":
        raise APIError(400, "response_format: not with a forced tool call", param="response_format")
    if choice == "required":  # {"name": one of the tools, "arguments": that tool's parameters}
        schema = {"anyOf": [{"type": "object", "properties": {"name": {"const": t.function.name},
                                                               "arguments": t.function.parameters or ANY_OBJECT},
                             "required": ["name", "arguments"], "additionalProperties": False} for t in tools]}
        return ForcedCall(None, GrammarSpec("json_schema", json.dumps(schema)))
    named = {t.function.name: t.function for t in tools}
    if choice.function.name not in named:
        raise APIError(400, f"tool_choice: no tool named {choice.function.name!r}", param="tool_choice")
    return ForcedCall(choice.function.name, GrammarSpec("json_schema", json.dumps(
        named[choice.function.name].parameters or ANY_OBJECT)))


def tool_calls(call: ForcedCall, text: str) -> list[dict]:
    """OpenAI's message.tool_calls for the decoded call (arguments as a JSON string)."""
    name, arguments = call.name, text
    if name is None:
        try:
            parsed = json.loads(text)
            name, arguments = parsed["name"], json.dumps(parsed["arguments"])
        except (ValueError, KeyError, TypeError):  # cut short by max_tokens: no call to report
            return []
    return [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": name,
                                                                                    "arguments": arguments}}]
