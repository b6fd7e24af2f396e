"""Request bodies. Declared fields are honoured and type-strict (a string where a number belongs is
a 400, never a silent coercion); anything else a body holds is judged by server/fields.py (inert,
neutral, or refused by name), never ignored."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, StrictBool, StrictInt, StrictStr

Float = Annotated[float, Strict()]  # accepts ints, rejects strings and booleans
Stop = StrictStr | list[StrictStr] | None
# OpenAI's chat roles; the chat template decides what it makes of each
Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="allow")  # the extras go through fields.check_extra_fields
    model: StrictStr | None = None
    max_tokens: StrictInt | None = None
    temperature: Float | None = None
    top_p: Float | None = None
    top_k: StrictInt | None = None  # SGLang extension; -1 means off, as in SGLang
    stop: Stop = None
    seed: StrictInt | None = None
    n: StrictInt | None = None
    ignore_eos: StrictBool = False  # SGLang extension
    skip_special_tokens: StrictBool | None = None  # SGLang extension; None: true, or false with tools
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    logit_bias: dict[StrictStr, Float] | None = None  # token id (as a string) -> added to its logit


class JsonSchemaFormat(BaseModel):
    name: StrictStr | None = None
    description: StrictStr | None = None
    schema_: dict | bool | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's response_format: text, json_object, or json_schema {name, schema, strict}."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class FunctionDef(BaseModel):
    name: StrictStr
    description: StrictStr | None = None
    parameters: dict | None = None  # a JSON schema of the arguments
    strict: StrictBool | None = None


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionDef


class FunctionName(BaseModel):
    name: StrictStr


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: FunctionName


class TextPart(BaseModel):
    type: StrictStr
    text: StrictStr | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_calls, ... go to the template
    role: Role
    content: StrictStr | list[TextPart] | None = None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage]
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None  # 0-20, needs logprobs
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None


class CompletionRequest(_Sampling):
    prompt: StrictStr | list[StrictInt] | list[StrictStr] | list[list[StrictInt]]
    logprobs: StrictInt | None = None  # the number of alternatives (0-20); None: no logprobs
    echo: StrictBool = False
    best_of: StrictInt | None = None  # only equal to n: nothing is generated beyond what is returned


class GenerateSamplingParams(BaseModel):
    model_config = ConfigDict(extra="allow")  # the extras go through fields.check_extra_fields
    max_new_tokens: StrictInt | None = None
    temperature: Float = 1.0
    top_p: Float = 1.0
    top_k: StrictInt = -1
    stop: Stop = None
    seed: StrictInt | None = None
    ignore_eos: StrictBool = False
    skip_special_tokens: StrictBool = True
    json_schema: StrictStr | None = None  # SGLang's grammars: a JSON schema as text, a regex, an EBNF
    regex: StrictStr | None = None
    ebnf: StrictStr | None = None


class GenerateRequest(BaseModel):
    text: StrictStr | None = None
    input_ids: list[StrictInt] | None = None
    sampling_params: GenerateSamplingParams = GenerateSamplingParams()
    stream: StrictBool = False
    rid: StrictStr | None = None
    return_logprob: StrictBool = False
    top_logprobs_num: StrictInt = 0
    logprob_start_len: StrictInt = -1  # SGLang's default: output tokens only
    return_text_in_logprobs: StrictBool = False


class InternalStateArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dspark_force_budget_frac: Annotated[float, Strict()] | None = None
    dspark_clear_info_records: StrictBool = False


class SetInternalStateRequest(BaseModel):
    """SGLang's shape: {"server_args": {...}}."""

    model_config = ConfigDict(extra="forbid")
    server_args: InternalStateArgs
