"""`tools` with a forced `tool_choice` (a named function, or `required`): the call's JSON is
decoded under the grammar of the function's parameter schema (engine/grammar.py), so its
arguments validate, and the answer is OpenAI's `tool_calls`. `auto` (the model decides whether to
call) is read out of the model's free text in its own call format, by SGLang's parser for that
format (`sglang.srt.function_call`, chosen as SGLang does with `--tool-call-parser`); a server
started without one refuses `auto` by name."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from sglang_dspark.engine.grammar import GrammarSpec
from sglang_dspark.server.errors import APIError
from sglang_dspark.server.protocol import ChatCompletionRequest

ANY_OBJECT = {"type": "object"}


def check_parser(name: str) -> str:
    """`name` if SGLang has a tool-call parser of that name (ValueError naming the choices)."""
    from sglang.srt.function_call.function_call_parser import FunctionCallParser

    if name not in FunctionCallParser.ToolCallParserEnum:
        raise ValueError(f"--tool-call-parser {name!r}: not one of SGLang's "
                         f"({', '.join(sorted(FunctionCallParser.ToolCallParserEnum))})")
    return name


def _call_entry(name: str | None, arguments: str, index: int | None = None) -> dict:
    entry = {} if index is None else {"index": index}
    if name is not None:  # a call's first piece: its id and name (later pieces add arguments)
        entry.update(id=f"call_{uuid.uuid4().hex[:24]}", type="function")
    return {**entry, "function": {"name": name, "arguments": arguments} if name is not None
            else {"arguments": arguments}}


class AutoCalls:
    """`tool_choice: auto`: the model writes text, and calls in its own format; SGLang's
    FunctionCallParser for `parser` splits them off, whole (`parse`) or as the text streams
    (`stream`, one parser per choice, as SGLang keeps)."""

    def __init__(self, parser: str, tools):
        from sglang.srt.entrypoints.openai.protocol import Tool

        self.parser_name = parser
        self.tools = [Tool.model_validate(t.model_dump(exclude_none=True)) for t in tools]

    def _parser(self):
        from sglang.srt.function_call.function_call_parser import FunctionCallParser

        return FunctionCallParser(self.tools, self.parser_name)

    def parse(self, text: str) -> tuple[str | None, list[dict]]:
        """(the message content, its tool_calls) of a whole answer."""
        parser = self._parser()
        if not parser.has_tool_call(text):
            return text, []
        normal, calls = parser.parse_non_stream(text)
        return normal or None, [_call_entry(c.name, c.parameters) for c in calls]

    def stream(self):
        """A function of each new piece of text (None once the choice ended): (content to send,
        tool_calls deltas to send)."""
        parser = self._parser()

        def feed(piece: str | None) -> tuple[str, list[dict]]:
            normal, calls = parser.parse_stream_chunk(piece) if piece is not None else parser.parse_stream_end()
            return normal or "", [_call_entry(c.name, c.parameters, c.tool_index) for c in calls]

        return feed


@dataclass(frozen=True)
class ForcedCall:
    name: str | None  # the named function; None for `required` (the output names it)
    spec: GrammarSpec


def forced_call(body: ChatCompletionRequest, parser: str | None = None) -> ForcedCall | AutoCalls | None:
    """The forced call the request asks for, AutoCalls for `auto` under `parser` (a
    --tool-call-parser name), or None when the answer is text."""
    tools, choice = body.tools or [], body.tool_choice
    if not tools:
        if choice not in (None, "none"):
            raise APIError(400, "tool_choice: needs tools", param="tool_choice")
        return None
    if choice == "none":
        return None
    if choice in (None, "auto"):
        if parser is None:
            raise APIError(400, "tool_choice: auto (the default with tools) needs the server started with "
                                "--tool-call-parser (the model's call format); otherwise name a function or use "
                                "required", param="tool_choice", code="unsupported_field")
        if body.response_format is not None and body.response_format.type != "text":
            # its grammar would leave the model no room for its call format
            raise APIError(400, "response_format: not with tool_choice auto", param="response_format")
        if (body.model_extra or {}).get("parallel_tool_calls") is False:  # nothing stops a second call
            raise APIError(400, "parallel_tool_calls: false is not supported with tool_choice auto",
                           param="parallel_tool_calls", code="unsupported_field")
        return AutoCalls(parser, tools)
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
