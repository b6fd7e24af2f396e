"""One request never touches another: values the engine could not take are refused or mapped at
the edge, work is bounded at admission, and a fault inside a step ends only the request that
caused it (engine/isolation.py). Every case runs beside a victim whose text must equal its solo
text, on an engine that drafts every step (a value that fails only when a step drafts cannot pass
by luck)."""

from __future__ import annotations

import re
import threading
import time

import httpx
import pytest
from request_isolation_fixtures import (DRAFT_VOCAB, MAX_LEN, VICTIM, VOCAB, Victim, post, served_full_engine,
                                        stream_text)

from sglang_dspark.engine.isolation import EngineFault, culprits
from sglang_dspark.engine.scheduler import ScheduledBatch


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with served_full_engine(tmp_path_factory.mktemp("iso")) as (client, base):
        solo = stream_text(base, VICTIM)
        assert solo["finish_reason"] == "length" and not solo["errors"]
        yield client, base, solo


def _chat(**fields) -> dict:
    return {"messages": [{"role": "user", "content": "w8 w9"}], "max_tokens": 8, "ignore_eos": True, **fields}


def _gen(**sampling) -> dict:
    return {"text": "w8 w9", "sampling_params": {"max_new_tokens": 8, "ignore_eos": True, **sampling}}


MAPPED = [  # accepted as SGLang maps them: a top_k at or above a vocabulary is no top-k there
    ("/v1/chat/completions", _chat(top_k=100_000)),
    ("/v1/chat/completions", _chat(top_k=VOCAB)),
    ("/v1/chat/completions", _chat(top_k=DRAFT_VOCAB + 1)),
    ("/v1/completions", {"prompt": "w8", "max_tokens": 8, "top_k": 10**30}),
    ("/generate", _gen(top_k=100_000)),
    ("/generate", _gen(top_k=DRAFT_VOCAB + 1)),
]
REFUSED = [  # (path, body, the field the 400 must name)
    ("/v1/chat/completions", _chat(logit_bias={"\u00b2": 1}), "logit_bias"),
    ("/v1/chat/completions", _chat(logit_bias={"\u0663": 1}), "logit_bias"),
    ("/v1/chat/completions", _chat(logit_bias={"7": 1, "007": 2}), "logit_bias"),
    ("/v1/chat/completions", _chat(n=1_000_000), "n"),
    ("/v1/completions", {"prompt": ["w8"] * 5, "n": 4, "max_tokens": 4}, "n"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\ud800 rivers"}]}, "messages.0.content"),
    ("/v1/completions", {"prompt": "w8", "stop": ["\udfff"]}, "stop.0"),
    ("/generate", {"text": "w8 \ud800"}, "text"),
    ("/v1/completions", {"prompt": "w8", "stop": ["x"] * 65}, "stop"),
    ("/v1/completions", {"prompt": "w8 " * (16 * MAX_LEN)}, "prompt"),
    ("/v1/completions", {"prompt": "w8", "temperature": float("inf")}, "temperature"),
    ("/v1/completions", {"prompt": "w8", "top_k": -2}, "top_k"),
    ("/v1/completions", {"prompt": "w8", "max_tokens": 10**30}, "prompt"),
]


@pytest.mark.parametrize("path,body", MAPPED, ids=[f"{p}-{i}" for i, (p, _) in enumerate(MAPPED)])
def test_a_top_k_beyond_a_vocabulary_is_no_top_k_and_touches_no_one(served, path, body):
    _, base, solo = served
    with Victim(base, solo) as victim:
        r = post(base, path, body)
        in_flight = victim.running.is_set() and victim.runs == 0
    assert r.status_code == 200, r.text
    assert in_flight, "precondition: the victim was still decoding when the answer came"
    assert victim.wrong == [] and victim.runs >= 1


@pytest.mark.parametrize("path,body,param", REFUSED, ids=[f"{p}-{f}-{i}" for i, (p, _, f) in enumerate(REFUSED)])
def test_values_the_engine_cannot_take_are_400s_naming_the_field(served, path, body, param):
    _, base, solo = served
    with Victim(base, solo) as victim:
        r = post(base, path, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()
    assert victim.wrong == [] and victim.runs >= 1


def test_after_n_a_million_the_server_answers_at_once(served):
    _, base, solo = served
    r = post(base, "/v1/chat/completions", _chat(n=1_000_000))
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    start = time.monotonic()
    assert httpx.get(f"{base}/health", timeout=1.0).status_code == 200
    assert time.monotonic() - start < 1.0
    assert stream_text(base, VICTIM) == solo


def test_a_full_queue_is_a_429_and_the_limits_are_reported(served):
    client, base, _ = served
    limits = httpx.get(f"{base}/v1/models").json()["data"][0]["limits"]
    assert limits["max_in_flight"] == client.max_in_flight == 4 + 8
    assert httpx.get(f"{base}/get_server_info").json()["request_limits"] == limits
    gate, release = threading.Event(), threading.Event()
    rids = []
    client.call(lambda e: (gate.set(), release.wait(30)))  # the engine thread waits: nothing is admitted
    assert gate.wait(10)
    try:
        for i in range(client.max_in_flight):  # fill every place the engine holds
            rids.append(client.submit([5, 6], _params(), lambda out: None))
        r = post(base, "/v1/completions", {"prompt": "w8", "max_tokens": 4})
        assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full", r.text
    finally:
        for rid in rids:
            client.abort(rid)
        release.set()
    assert post(base, "/v1/completions", {"prompt": "w8", "max_tokens": 4}).status_code == 200


def _params():
    from sglang_dspark.engine.sampling import SamplingParams

    return SamplingParams(max_tokens=4)


MARKER = "w40 w41 w42"  # the prompt whose decode steps the injected fault hits


def _inject(client, when):
    """verify_forward raises RuntimeError("injected fault") for rows of which `when(requests)` says so."""
    runner = client.engine.runner
    original = runner.verify_forward

    def faulty(rows, drafts, lens):
        by_slot = {r.slot: r for r in client.engine.scheduler.running}
        if when([by_slot[row.slot] for row in rows if row.slot in by_slot]):
            raise RuntimeError("injected fault")
        return original(rows, drafts, lens)

    runner.verify_forward = faulty
    return lambda: setattr(runner, "verify_forward", original)


def _marked(client):
    marker = client.tokenizer.encode(MARKER, add_special_tokens=False)
    return lambda reqs: any(r.prompt_ids[-len(marker):] == marker for r in reqs)


def _faults(base: str, name: str) -> float:
    pattern = re.compile(rf"^{name}(\{{[^}}]*\}})? (\S+)$")
    return sum(float(m.group(2)) for line in httpx.get(f"{base}/metrics").text.splitlines()
               if (m := pattern.match(line)))


def test_a_fault_in_one_requests_step_ends_that_request_only(served):
    client, base, solo = served
    undo = _inject(client, _marked(client))
    try:
        before = _faults(base, "sglang_dspark_request_faults_total")
        with Victim(base, solo) as victim:
            plain = post(base, "/v1/completions", {"prompt": MARKER, "max_tokens": 8, "ignore_eos": True})
            streamed = stream_text(base, {"prompt": MARKER, "max_tokens": 8, "ignore_eos": True, "stream": True})
    finally:
        undo()
    assert plain.status_code == 500 and plain.json()["error"]["code"] == "request_fault", plain.text
    assert "injected fault" in plain.json()["error"]["message"]
    assert streamed["finish_reason"] == "abort" and streamed["errors"][0]["code"] == "request_fault"
    assert victim.wrong == [] and victim.runs >= 1
    assert _faults(base, "sglang_dspark_request_faults_total") == before + 2
    assert httpx.get(f"{base}/health").status_code == 200
    assert stream_text(base, VICTIM) == solo


def test_a_fault_every_request_triggers_is_the_engines_and_health_says_so(tmp_path):
    with served_full_engine(tmp_path) as (client, base):
        undo = _inject(client, lambda reqs: True)
        try:
            outs: list[dict] = []
            threads = [threading.Thread(target=lambda: outs.append(stream_text(base, VICTIM))) for _ in range(2)]
            held, release = threading.Event(), threading.Event()
            client.call(lambda e: (held.set(), release.wait(30)))  # both arrive before the engine's next step
            assert held.wait(10)
            for t in threads:
                t.start()
            deadline = time.monotonic() + 20
            while len(client._live) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            release.set()
            for t in threads:
                t.join(60)
        finally:
            undo()
        assert _faults(base, "sglang_dspark_engine_faults_total") == 1
        assert len(outs) == 2
        for out in outs:
            assert out["finish_reason"] == "abort" and out["errors"], out
        assert httpx.get(f"{base}/health").status_code == 503
        assert "injected fault" in httpx.get(f"{base}/health").json()["error"]["message"]


# ---- the bisection itself, on stand-ins for requests ----------------------------------------------
class _Req:
    def __init__(self, i: int):
        self.id = f"r{i}"


def _batch(n: int) -> ScheduledBatch:
    return ScheduledBatch(decode=[_Req(i) for i in range(n)])


@pytest.mark.parametrize("n,bad", [(1, {0}), (5, {3}), (8, {0, 7}), (7, {2, 3, 4})])
def test_bisection_finds_exactly_the_requests_that_fail_alone(n, bad):
    runs = []

    def fails(part):
        runs.append(len(part.decode))
        return any(int(r.id[1:]) in bad for r in part.decode)

    assert {int(r.id[1:]) for r in culprits(_batch(n), fails)} == bad
    assert len(runs) <= 2 * len(bad) * max(1, n.bit_length())  # a few runs per culprit, not one per request


def test_a_fault_no_single_request_explains_is_an_engine_fault():
    with pytest.raises(EngineFault):
        culprits(_batch(4), lambda part: len(part.decode) == 4)  # only the whole batch fails
    with pytest.raises(EngineFault):
        culprits(_batch(3), lambda part: True)  # every request fails alone
