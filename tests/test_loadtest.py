"""Load tests (sglang_dspark/loadtest): the metric arithmetic on synthetic records, the CLI's input
errors, the report from synthetic runs, and end to end against the reference server on loopback:
a headless sweep and its frontier, the gate failing on an unreachable tier, distributed Locust
(one master, one worker) and the Locust load shape run as a Locust user would."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from loopback_server import dead_loopback_server, serve_engine_on_loopback, serve_on_loopback
from sglang_dspark.loadtest.__main__ import main
from sglang_dspark.loadtest.report import load_arms
from sglang_dspark.loadtest.sse import read_sse
from sglang_dspark.loadtest.steps import StepLog
from sglang_dspark.loadtest.summary import (
    attainment, itl_s, percentiles, summarize_step, ttft_s, user_tok_s,
)
from sglang_dspark.loadtest.tiers import Tier, gate_failures, parse_tier, profile_tiers
from sglang_dspark.loadtest.workload import DEFAULT_PROMPTS, OutputLength, Workload, prompts_by_domain

REPO = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STEP_FIELDS = {"users", "requests", "failures", "ttft_ms", "itl_ms", "user_tok_s", "aggregate_output_tok_s",
               "attainment"}


def record(chunk_s, n_out, *, ok=True, t_send=100.0, total_s=None):
    return {"ok": ok, "error": None if ok else "HTTP 500: boom", "chunk_s": list(chunk_s), "n_out": n_out,
            "t_send": t_send, "total_s": total_s if total_s is not None else (chunk_s[-1] if chunk_s else 0.1)}


# ---- metric arithmetic -------------------------------------------------------------------------

def test_ttft_itl_and_per_user_speed_of_one_request():
    # 7 tokens in 4 chunks arriving 0.2, 0.3, 0.5 and 0.6 s after the send
    r = record([0.2, 0.3, 0.5, 0.6], 7)
    assert ttft_s(r) == 0.2
    assert itl_s(r) == pytest.approx([0.1, 0.2, 0.1])  # one gap per pair of chunks, not per token
    # (n_out - 1) tokens after the first, over the 0.4 s between first and last chunk
    assert user_tok_s(r) == pytest.approx(6 / 0.4)


def test_per_user_speed_is_undefined_without_two_tokens_over_time():
    assert user_tok_s(record([0.2], 5)) is None  # everything in one chunk: no time between first and last
    assert user_tok_s(record([0.2, 0.3], 1)) is None
    failed = record([0.2, 0.3], 4, ok=False)
    assert user_tok_s(failed) is None and ttft_s(failed) is None and itl_s(failed) == []


def test_percentiles_interpolate_linearly_between_order_statistics():
    # sorted 1, 2, 3, 4: the q-th percentile sits at rank q/100 * (n - 1) = 0.03 q, interpolated
    got = percentiles([4, 1, 3, 2], (5, 50, 90, 99))
    assert got == pytest.approx({"p5": 1.15, "p50": 2.5, "p90": 3.7, "p99": 3.97})
    assert percentiles([], (50,)) == {"p50": None}


def test_attainment_counts_failures_and_undefined_speeds_as_misses():
    # 10 tokens each: 9 after the first, over 9 / speed seconds (exact in binary for these speeds)
    records = [record([0.5, 0.5 + 9 / speed], 10) for speed in (8.0, 16.0, 32.0)]
    records += [record([0.1, 0.2], 10, ok=False), record([0.1], 10)]
    assert attainment(records, 16.0) == pytest.approx(2 / 5)  # 16 and 32: "at or above"
    assert attainment(records, 5.0) == pytest.approx(3 / 5)
    assert attainment([], 5.0) is None


def test_step_summary_on_synthetic_records():
    # three requests of 5 tokens: sent at 0, 1 and 2 s; each ends 1 s after its send
    records = [record([0.1, 0.2, 0.4, 0.5], 5, t_send=t, total_s=1.0) for t in (0.0, 1.0, 2.0)]
    records.append(record([0.3], 3, ok=False, t_send=2.5, total_s=0.3))
    step = summarize_step(records, {"fast": 9.0, "slow": 5.0})
    assert (step["requests"], step["failures"], step["output_tokens"]) == (4, 1, 15)
    # 15 tokens of the successful requests between the first send (0 s) and the last end (3 s)
    assert step["aggregate_output_tok_s"] == pytest.approx(15 / 3.0)
    assert step["ttft_ms"] == pytest.approx({"p50": 100.0, "p90": 100.0, "p99": 100.0})
    # gaps 0.1, 0.2, 0.1 per request: pooled, sorted 0.1 x6 then 0.2 x3; rank 0.5 * 8 = 4 is 0.1
    assert step["itl_ms"]["p50"] == pytest.approx(100.0)
    assert step["itl_ms"]["p99"] == pytest.approx(200.0)
    speed = 4 / 0.4  # (5 - 1) / (0.5 - 0.1)
    assert step["user_tok_s"] == pytest.approx({"p5": speed, "p50": speed, "p95": speed})
    assert step["attainment"] == pytest.approx({"fast": 3 / 4, "slow": 3 / 4})
    assert step["errors"] == {"HTTP 500: boom": 1}


def test_a_request_belongs_to_the_step_in_force_when_it_was_sent():
    log = StepLog()
    assert log.at(5.0, default_users=3) == (0, 3)  # no shape: one step
    log.mark(0, 1, at=10.0)
    log.mark(1, 4, at=20.0)
    assert [log.at(t, default_users=99) for t in (9.0, 10.0, 19.9, 20.0, 35.0)] == [
        (0, 1), (0, 1), (0, 1), (1, 4), (1, 4)]


def test_read_sse_times_content_chunks_and_reads_usage():
    def chat(content):
        return b'data: ' + json.dumps({"choices": [{"delta": {"content": content}}], "usage": None}).encode()

    lines = [(1.0, chat("")), (1.0, b""), (1.5, chat(" w5 w6")), (1.5, b""), (1.7, chat(" w7")),
             (1.8, b'data: {"choices": [], "usage": {"completion_tokens": 3}}'), (1.8, b"data: [DONE]")]
    result = read_sse(lines, t_send=1.0)
    assert result.chunk_s == [0.5, 0.7] and result.completion_tokens == 3 and result.done and result.error is None
    completion = [(2.0, b'data: {"choices": [{"text": " w1"}]}'), (2.5, b'data: {"error": {"message": "bad"}}')]
    result = read_sse(completion, t_send=1.0)
    assert result.chunk_s == [1.0] and result.error == "bad" and not result.done


# ---- workload and tiers ------------------------------------------------------------------------

def test_output_lengths_and_workload_are_reproducible():
    assert OutputLength.parse("64").sample(random.Random(0)) == 64
    uniform = OutputLength.parse("uniform:8:12")
    draws = [uniform.sample(random.Random(i)) for i in range(50)]
    assert set(draws) <= set(range(8, 13)) and len(set(draws)) > 1
    assert min(OutputLength.parse("lognormal:3:2").sample(random.Random(i)) for i in range(50)) >= 2
    for bad in ("0", "uniform:9:3", "normal:5:1", "x"):
        with pytest.raises(ValueError, match="output length"):
            OutputLength.parse(bad)

    prompts = {"math": ("w1 w2", "w3"), "code": ("w4",)}

    def sequence(seed):
        w = Workload(random.Random(seed), prompts=prompts, output_length=uniform, endpoint="mixed")
        return [w.next_request() for _ in range(20)]

    assert sequence(1) == sequence(1) != sequence(2)
    for req in sequence(1):
        text = req.body["messages"][0]["content"] if req.endpoint == "chat" else req.body["prompt"]
        assert text == prompts[req.domain][req.prompt_index]
        assert req.body["ignore_eos"] is True and req.body["stream"] is True
        assert req.body["stream_options"] == {"include_usage": True} and req.body["max_tokens"] == req.max_tokens
        assert ("messages" in req.body) == (req.endpoint == "chat") and "model" not in req.body


def test_prompt_sets_per_domain():
    table = prompts_by_domain(DEFAULT_PROMPTS)
    assert set(table) == {"code", "chat", "math"} and all(table.values())
    assert list(prompts_by_domain(DEFAULT_PROMPTS, "math,code")) == ["math", "code"]
    with pytest.raises(ValueError, match="domains poetry: builtin:heldout has"):
        prompts_by_domain(DEFAULT_PROMPTS, "poetry")


def test_tiers_from_flags_and_from_the_shipped_profile():
    assert parse_tier("interactive:12.5") == Tier("interactive", 12.5)
    for bad in ("interactive", "x:0", ":5", "x:fast"):
        with pytest.raises(ValueError, match="NAME:TOK_S"):
            parse_tier(bad)
    tiers = profile_tiers(REPO / "sla_profiles" / "smollm2-135m-instruct-cpu.yaml")
    assert [(t.name, t.tok_s_per_user, t.max_concurrency) for t in tiers] == [
        ("interactive", 12.3, 4), ("batch", 3.7, 16)]


def test_gate_checks_only_steps_within_the_tiers_concurrency():
    steps = [{"users": u, "attainment": {"t": share}} for u, share in ((1, 0.95), (4, 0.5), (16, None))]
    assert gate_failures(steps, Tier("t", 10.0, max_concurrency=2), 0.9) == []
    reasons = gate_failures(steps, Tier("t", 10.0), 0.9)
    assert [r.split(":")[0] for r in reasons] == ["concurrency 4", "concurrency 16"]
    assert "50.0% of requests, below 90%" in reasons[0] and "no requests" in reasons[1]


# ---- CLI input errors and the report -----------------------------------------------------------

@pytest.fixture
def dead_host():
    with dead_loopback_server() as url:
        yield url


def run_cli(argv, capsys):
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    captured = capsys.readouterr()
    return rc, captured.err.strip()


@pytest.mark.parametrize("extra, message", [
    (["--tier", "fast"], "error: --tier 'fast': expected NAME:TOK_S"),
    (["--tier", "a:5", "--gate", "b"], "error: --gate 'b' names no tier (tiers: a)"),
    (["--users", "1,x"], "error: --users: users '1,x'"),
    (["--max-tokens", "uniform:9:3"], "error: --max-tokens: output length 'uniform:9:3'"),
    (["--duration", "soon"], "error: --duration: time 'soon'"),
    (["--duration", "0s"], "error: --duration: time '0s'"),
    (["--domain", "poetry"], "error: domains poetry: builtin:heldout has code, chat, math"),
    (["--no-such-flag"], "error: unrecognized arguments: --no-such-flag"),
    (["--profile", "{tmp}/missing.yaml"], "error: --profile {tmp}/missing.yaml: cannot read (No such file"),
    ([], "error: cannot reach {host}: GET /v1/models"),  # it closes every connection unanswered
])
def test_bad_input_exits_2_with_one_line(extra, message, capsys, tmp_path, dead_host):
    fill = {"host": dead_host, "tmp": tmp_path}
    rc, err = run_cli(["run", "--host", dead_host, "--out", str(tmp_path / "run"),
                       *(e.format(**fill) for e in extra)], capsys)
    assert rc == 2 and err.startswith(message.format(**fill)) and "\n" not in err, err
    assert not (tmp_path / "run").exists()


def test_help_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for shown in ("--users N,N,... concurrency steps", "(default: 1,4,16)", "(default: 30s)", "(default: 0.9)",
                  "(default: 128)", "--profile FILE", "--gate NAME", "--api-key KEY", "--workers N"):
        assert shown in out


def synthetic_run(path: Path, scale: float) -> Path:
    steps = [{"step": i, "users": u, "requests": 10, "failures": 0, "aggregate_output_tok_s": scale * u * 5,
              "user_tok_s": {"p5": 4.0, "p50": scale * 20 / u, "p95": 30.0}, "ttft_ms": {"p50": 50.0},
              "itl_ms": {"p50": 40.0}, "attainment": {"interactive": 1.0 / u}} for i, u in enumerate((1, 4))]
    path.mkdir()
    (path / "report.json").write_text(json.dumps({"tiers": [{"name": "interactive", "tok_s_per_user": 8.0}],
                                                  "steps": steps}))
    return path


def test_report_from_two_runs_writes_frontier_and_tier_table(tmp_path, capsys):
    runs = [synthetic_run(tmp_path / "target-only", 1.0), synthetic_run(tmp_path / "scheduled", 1.5)]
    rc, err = run_cli(["report", *map(str, runs), "--out", str(tmp_path / "cmp")], capsys)
    assert rc == 0, err
    assert (tmp_path / "cmp" / "frontier.png").read_bytes().startswith(PNG_MAGIC)
    md = (tmp_path / "cmp" / "report.md").read_text()
    assert "## Tier interactive: 8 tok/s per user" in md
    assert "| arm | users | per-user p50 (tok/s) | aggregate (tok/s) | attainment |" in md
    assert "| target-only | 4 | 5.00 | 20.0 | 25.0% |" in md and "| scheduled | 1 | 30.00 | 7.5 | 100.0% |" in md
    assert "(n_out - 1) / (t_last - t_first)" in md
    assert [name for name, _ in load_arms(runs, "a,b")] == ["a", "b"]
    rc, err = run_cli(["report", str(runs[0]), "--out", str(tmp_path / "x"), "--labels", "a,b"], capsys)
    assert rc == 2 and err == "error: --labels: 2 names for 1 run directories"


# ---- end to end against the reference server ---------------------------------------------------

@pytest.fixture(scope="module")
def reference_server():
    """The reference server (tiny engine) on a loopback port. The only place in this file that knows
    the engine and server API, so a change there is adapted here alone."""
    from engine_fixtures import tiny_engine

    with serve_engine_on_loopback(tiny_engine("scheduled", max_running=8)) as (_, base):
        yield base


def sweep(base, out, *extra):
    return ["run", "--host", base, "--users", "1,2", "--duration", "1s", "--max-tokens", "uniform:8:16",
            "--tier", "reachable:1", "--tier", "unreachable:1e6", "--out", str(out), *extra]


def check_report(out: Path, users: list[int]) -> list[dict]:
    report = json.loads((out / "report.json").read_text())
    assert "(n_out - 1) / (t_last - t_first)" in report["definitions"]["user_tok_s"]
    assert [s["users"] for s in report["steps"]] == users
    for step in report["steps"]:
        assert STEP_FIELDS <= step.keys() and step["requests"] > 0 and step["failures"] == 0
        assert set(step["ttft_ms"]) == set(step["itl_ms"]) == {"p50", "p90", "p99"}
        assert set(step["user_tok_s"]) == {"p5", "p50", "p95"} and step["aggregate_output_tok_s"] > 0
        assert step["attainment"] == {"reachable": 1.0, "unreachable": 0.0}
    return report["steps"]


def test_headless_sweep_writes_the_report_and_the_frontier(reference_server, tmp_path, capsys):
    rc, err = run_cli(sweep(reference_server, tmp_path / "run", "--gate", "reachable"), capsys)
    assert rc == 0, err
    for step in check_report(tmp_path / "run", [1, 2]):
        assert step["locust"]["requests"] == step["requests"]  # Locust's own count agrees with the records
    rc, err = run_cli(["report", str(tmp_path / "run"), "--out", str(tmp_path / "cmp")], capsys)
    assert rc == 0, err
    assert (tmp_path / "cmp" / "frontier.png").read_bytes().startswith(PNG_MAGIC)


def test_gating_an_unreachable_tier_fails_the_run(reference_server, tmp_path, capsys):
    rc, err = run_cli(sweep(reference_server, tmp_path / "run", "--gate", "unreachable", "--users", "1"), capsys)
    assert rc == 1 and err.startswith("error: gate failed: concurrency 1: tier unreachable") and "\n" not in err
    check_report(tmp_path / "run", [1])  # the report is written all the same


def _finished_requests(base: str) -> float:
    """Requests the reference server finished, any reason (its own counter, not the load test's)."""
    return sum(float(line.split()[-1]) for line in httpx.get(f"{base}/metrics").text.splitlines()
               if line.startswith("sglang_dspark_requests_finished_total{"))


def test_distributed_locust_gives_the_same_report(reference_server, tmp_path, capsys):
    before = _finished_requests(reference_server)
    rc, err = run_cli(sweep(reference_server, tmp_path / "run", "--workers", "1", "--users", "2"), capsys)
    assert rc == 0, err
    (step,) = check_report(tmp_path / "run", [2])
    # the master counted each request the server answered once: the worker's records are not doubled
    assert step["requests"] == _finished_requests(reference_server) - before
    assert json.loads((tmp_path / "run" / "report.json").read_text())["workers"] == 1
    log = (tmp_path / "run" / "step0_u2" / "locust.log").read_text()  # master and worker write here
    assert "1 workers connected" in log and "Got quit message from master" in log


@contextlib.contextmanager
def slow_server(delay_s: float):
    """An OpenAI-compatible loopback server whose every streamed answer starts `delay_s` after the
    request: longer than a step, so only requests allowed to finish past the step's end count."""
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    app = FastAPI()

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": "slow", "object": "model"}]}

    async def stream(chat: bool):
        await asyncio.sleep(delay_s)
        for word in (" a", " b", " c"):
            choice = {"delta": {"content": word}} if chat else {"text": word}
            yield f"data: {json.dumps({'choices': [choice], 'usage': None})}\n\n"
            await asyncio.sleep(0.05)
        yield 'data: {"choices": [], "usage": {"completion_tokens": 3}}\n\n'
        yield "data: [DONE]\n\n"

    @app.post("/v1/chat/completions")
    def chat_completions():
        return StreamingResponse(stream(True), media_type="text/event-stream")

    @app.post("/v1/completions")
    def completions():
        return StreamingResponse(stream(False), media_type="text/event-stream")

    with serve_on_loopback(app) as base:
        yield base


def test_requests_in_flight_when_a_step_ends_still_count(tmp_path, capsys):
    with slow_server(delay_s=2.5) as base:  # every request outlasts the 1 s step
        rc, err = run_cli(["run", "--host", base, "--users", "1", "--duration", "1s", "--max-tokens", "3",
                           "--out", str(tmp_path / "run")], capsys)
    assert rc == 0, err
    step = json.loads((tmp_path / "run" / "report.json").read_text())["steps"][0]
    assert step["requests"] >= 1 and step["failures"] == 0


def test_locust_shape_run_as_a_locust_user_would(reference_server, tmp_path):
    records = tmp_path / "records.json"
    cmd = [sys.executable, "-m", "locust", "-f", f"{REPO}/loadtests/locustfile.py,{REPO}/loadtests/shape.py",
           "--headless", "--host", reference_server, "--only-summary", "--llm-steps", "1,2", "--llm-step-time", "1s",
           "--stop-timeout", "60",  # the last step's requests finish however slow this host is
           "--llm-max-tokens", "8", "--llm-records", str(records), "--json-file", str(tmp_path / "stats")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(records.read_text())
    assert {(r["step"], r["users"]) for r in rows} == {(0, 1), (1, 2)}
    assert all(r["ok"] and r["n_out"] == 8 for r in rows)
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert {e["name"] for e in stats if e["method"] == "METRIC"} == {"ttft_ms", "itl_ms", "user_tok_s"}
    # Locust's own row has the whole stream's time and bytes, not time to headers and length 0
    post, = (e for e in stats if e["method"] == "POST")
    assert post["num_requests"] == len(rows) and post["total_content_length"] > 0
    assert post["total_response_time"] == pytest.approx(1000 * sum(r["total_s"] for r in rows))
