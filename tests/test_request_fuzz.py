"""Property-based fuzzing of every generation endpoint, with a victim in flight.

Requests are drawn over each endpoint's schema with edge values (0, -1, the vocabulary and the
context +- 1, NaN, inf, huge), Unicode (digits of other scripts, lone surrogates, NUL), stop lists,
grammars, tools, and streaming clients that hang up. They are sent while victim requests decode
back to back on an engine that drafts every step. Every answer must come within ANSWER_BOUND_S, be
no 5xx, and a 400 must be JSON that names a field; every victim's text must equal its solo text;
the server must answer a normal request afterwards.

The fast suite runs FAST_EXAMPLES, the slow suite SLOW_EXAMPLES. The seed is printed (and taken
from FUZZ_SEED when set), and hypothesis prints a failing example shrunk, so a failure reproduces.
"""

from __future__ import annotations

import json
import os
import random

import httpx
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from request_isolation_fixtures import MAX_LEN, VICTIM, VOCAB, Victim, post, served_full_engine, stream_text

FAST_EXAMPLES = 200
SLOW_EXAMPLES = 2000
ANSWER_BOUND_S = 30.0  # a hostile request may not hold its connection longer than this

INTS = st.sampled_from([0, -1, 1, 2, VOCAB - 1, VOCAB, VOCAB + 1, MAX_LEN - 1, MAX_LEN, MAX_LEN + 1,
                        2**31, 2**63, 2**64, -2**63, 10**30]) | st.integers(-3, 40)
FLOATS = st.sampled_from([0.0, -0.0, 1e-9, 0.5, 1.0, 2.0, 100.0, 1e308, float("nan"), float("inf"),
                          float("-inf"), -1.0]) | st.floats(-2, 3, allow_nan=False)
ODD = st.sampled_from(["\ud800", "\udfff", "\x00", "\u00b2", "\u0663", "\ufeff", "w5 w6", "w9", "", " ",
                       "\U0001f600", "a" * 600])
TEXT = st.one_of(ODD, st.text(max_size=20), st.lists(ODD, max_size=4).map("".join))
STOPS = st.one_of(st.none(), TEXT, st.lists(TEXT, max_size=70))
ODD_DIGITS = st.sampled_from(["\u00b2", "\u0663", "\u0967", "\uff15", "\u2460", "1\u00b2", "\U0001d7ce"])
BIAS_KEYS = st.one_of(st.sampled_from(["0", "7", "007", str(VOCAB - 1), str(VOCAB), "-1", "1e3", " 5", "5 ",
                                       "\ud800", ""]), ODD_DIGITS, st.text(max_size=4))
LOGIT_BIAS = st.one_of(st.none(), st.dictionaries(BIAS_KEYS, st.one_of(FLOATS, INTS, TEXT), min_size=1, max_size=4))
SCHEMAS = st.sampled_from([
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    {"type": "string", "pattern": "(a*)*b"}, {"type": "array", "items": {"$ref": "#"}}, {"type": "nonsense"},
    {"enum": []}, True, {"type": "object", "properties": {"x" * 300: {"type": "string", "maxLength": 10**9}}},
])
REGEXES = st.sampled_from(["(a*)*b", "[", "w[0-9]+", "(w5 )*", "\\", "a{1000000}", ".*", "(?=x)"])
TOOLS = st.sampled_from([
    None, [], [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    [{"type": "function", "function": {"name": "", "parameters": {"type": "nope"}}}], [{"type": "other"}],
])
TOOL_CHOICE = st.sampled_from([None, "none", "auto", "required", {"type": "function", "function": {"name": "f"}},
                               {"type": "function", "function": {"name": "missing"}}, 7])
COMMON = {
    "max_tokens": st.one_of(st.none(), INTS), "temperature": st.one_of(st.none(), FLOATS),
    "top_p": st.one_of(st.none(), FLOATS), "top_k": st.one_of(st.none(), INTS), "n": st.one_of(st.none(), INTS),
    "seed": st.one_of(st.none(), INTS), "stop": STOPS, "logit_bias": LOGIT_BIAS, "stream": st.booleans(),
    "ignore_eos": st.booleans(), "logprobs": st.one_of(st.none(), st.booleans(), INTS),
    "model": st.one_of(st.none(), st.sampled_from(["tiny", "other", ""])),
}


def _some(fields: dict) -> st.SearchStrategy[dict]:
    """A dict with a random subset of `fields`, each drawn from its strategy."""
    return st.fixed_dictionaries({}, optional=fields)


def _few(base: dict, fields: dict, inner: str | None = None) -> st.SearchStrategy[dict]:
    """`base` (a request the engine serves) with one or two of `fields` drawn hostile (under `inner`
    when given): most such requests get past the other checks to the one field under test."""
    keys = st.lists(st.sampled_from(sorted(fields)), min_size=1, max_size=2, unique=True)
    picked = keys.flatmap(lambda ks: st.fixed_dictionaries({k: fields[k] for k in ks}))
    if inner is None:
        return picked.map(lambda d: {**base, **d})
    return picked.map(lambda d: {**base, inner: {**base[inner], **d}})


MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "tool", "robot"]),
                                 "content": st.one_of(TEXT, st.none(), st.just([{"type": "text", "text": "w5"}]),
                                                      st.just([{"type": "image_url"}]))})
CHAT = st.tuples(st.just("/v1/chat/completions"), st.builds(lambda base, messages: {**base, "messages": messages},
    _some({**COMMON, "top_logprobs": INTS, "tools": TOOLS, "tool_choice": TOOL_CHOICE,
           "response_format": st.one_of(st.sampled_from([{"type": "text"}, {"type": "json_object"}, {"type": "x"}]),
                                        SCHEMAS.map(lambda s: {"type": "json_schema",
                                                               "json_schema": {"name": "s", "schema": s}}))}),
    st.lists(MESSAGE, max_size=3)))
PROMPT = st.one_of(TEXT, st.lists(INTS, max_size=6), st.lists(TEXT, max_size=3), st.lists(st.lists(INTS, max_size=3),
                                                                                          max_size=3))
COMPLETION = st.tuples(st.just("/v1/completions"), st.builds(lambda base, prompt: {**base, "prompt": prompt},
    _some({**COMMON, "echo": st.booleans(), "best_of": INTS}), PROMPT))
SAMPLING_FIELDS = {"max_new_tokens": INTS, "temperature": FLOATS, "top_p": FLOATS, "top_k": INTS, "stop": STOPS,
                   "ignore_eos": st.booleans(), "regex": REGEXES, "json_schema": SCHEMAS.map(json.dumps),
                   "seed": INTS, "logit_bias": LOGIT_BIAS}
SAMPLING = _some(SAMPLING_FIELDS)
GENERATE = st.tuples(st.just("/generate"), st.builds(lambda base, sp: {**base, "sampling_params": sp},
    _some({"text": TEXT, "input_ids": st.lists(INTS, max_size=6), "stream": st.booleans(),
           "return_logprob": st.booleans(), "logprob_start_len": INTS, "top_logprobs_num": INTS}), SAMPLING))
CHAT_FIELDS = {**COMMON, "top_logprobs": INTS, "tools": TOOLS, "tool_choice": TOOL_CHOICE, "messages": st.lists(MESSAGE, max_size=3)}
ONE_FIELD = st.one_of(
    st.tuples(st.just("/v1/chat/completions"),
              _few({"messages": [{"role": "user", "content": "w5 w6"}], "max_tokens": 8}, CHAT_FIELDS)),
    st.tuples(st.just("/v1/completions"), _few({"prompt": "w5 w6", "max_tokens": 8},
                                               {**COMMON, "echo": st.booleans(), "prompt": PROMPT})),
    st.tuples(st.just("/generate"), _few({"text": "w5 w6", "sampling_params": {"max_new_tokens": 8}},
                                         SAMPLING_FIELDS, inner="sampling_params")),
)
REQUESTS = st.one_of(ONE_FIELD, ONE_FIELD, ONE_FIELD, CHAT, COMPLETION, GENERATE)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with served_full_engine(tmp_path_factory.mktemp("fuzz")) as (client, base):
        solo = stream_text(base, VICTIM)
        yield base, solo


def _check(base: str, path: str, body: dict) -> int:
    """The answer's status, once checked."""
    if body.get("stream"):  # a streaming client that hangs up after the first event
        data = json.dumps(body, allow_nan=True)
        with httpx.Client(timeout=ANSWER_BOUND_S) as client, client.stream(
                "POST", f"{base}{path}", content=data, headers={"Content-Type": "application/json"}) as r:
            status = r.status_code
            if status != 200:
                r.read()
                _check_error(r)
            else:
                next(r.iter_lines(), None)
        assert status < 500
        return status
    r = post(base, path, body, timeout=ANSWER_BOUND_S)
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        _check_error(r)
    return r.status_code


def _check_error(r: httpx.Response) -> None:
    assert r.status_code < 500, r.text
    error = r.json()["error"]
    assert error["message"]
    if r.status_code in (400, 404):
        assert error["param"], f"a {r.status_code} that names no field: {error}"


def check_fuzzed_requests(base: str, solo: dict, examples: int) -> None:
    fuzz_seed = int(os.environ.get("FUZZ_SEED", random.randrange(2**32)))
    print(f"request fuzz: seed {fuzz_seed} (FUZZ_SEED={fuzz_seed} reproduces), {examples} examples")

    @seed(fuzz_seed)
    @settings(max_examples=examples, deadline=None, database=None, print_blob=True,
              suppress_health_check=list(HealthCheck))
    @given(REQUESTS)
    def each(request):
        status = _check(base, *request)
        statuses[status] = statuses.get(status, 0) + 1

    statuses: dict[int, int] = {}
    with Victim(base, solo) as victim:
        each()
    print(f"request fuzz: answers by status {dict(sorted(statuses.items()))}, {victim.runs} victims")
    assert statuses.get(200, 0) >= examples // 10, "the fuzz must also reach the engine, not only the validation"
    assert victim.wrong == [], f"victims whose text changed or that were aborted: {victim.wrong[:2]}"
    assert victim.runs >= 1
    assert httpx.get(f"{base}/health", timeout=5).status_code == 200
    assert stream_text(base, VICTIM) == solo


def test_fuzzed_requests_touch_no_victim(served):
    check_fuzzed_requests(*served, FAST_EXAMPLES)


@pytest.mark.slow
def test_fuzzed_requests_touch_no_victim_long(served):
    check_fuzzed_requests(*served, SLOW_EXAMPLES)
