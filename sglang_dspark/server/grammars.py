"""Request grammars (OpenAI's response_format, SGLang's json_schema / regex / ebnf) compiled for
the served tokenizer, off the event loop; a grammar that does not compile is a 400 naming its field."""

from __future__ import annotations

import json

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from sglang_dspark.engine.grammar import GrammarCompiler, GrammarSpec
from sglang_dspark.server.errors import APIError
from sglang_dspark.server.protocol import GenerateSamplingParams, ResponseFormat


def response_format_spec(fmt: ResponseFormat | None) -> GrammarSpec | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return GrammarSpec("json_object")
    schema = fmt.json_schema.schema_ if fmt.json_schema is not None else None
    if schema is None:
        raise APIError(400, "response_format.json_schema.schema: required for type json_schema",
                       param="response_format")
    return GrammarSpec("json_schema", json.dumps(schema))


def generate_spec(sp: GenerateSamplingParams) -> tuple[GrammarSpec, str] | None:
    """(spec, its sampling_params field) of SGLang's grammar parameters; at most one may be set."""
    given = [(kind, getattr(sp, kind)) for kind in ("json_schema", "regex", "ebnf") if getattr(sp, kind) is not None]
    if len(given) > 1:
        raise APIError(400, "sampling_params: at most one of json_schema, regex, ebnf", param="sampling_params")
    if not given:
        return None
    kind, source = given[0]
    return GrammarSpec(kind, source), f"sampling_params.{kind}"


def _compiler(request: Request) -> GrammarCompiler:
    state = request.app.state
    if getattr(state, "grammar_compiler", None) is None:  # built on first use: it reads the whole vocabulary
        state.grammar_compiler = GrammarCompiler.for_tokenizer(state.engine.tokenizer)
    return state.grammar_compiler


async def compile_grammar(request: Request, spec: GrammarSpec | None, param: str):
    """The compiled grammar for `spec` (None for none)."""
    if spec is None:
        return None
    try:
        compiler = await run_in_threadpool(_compiler, request)
        return await run_in_threadpool(compiler.compile, spec)
    except ValueError as exc:
        raise APIError(400, f"{param}: {exc}", param=param) from None
