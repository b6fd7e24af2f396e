"""The canary prober's command line (sglang_dspark/canary_probe.py) against stub `/generate`
servers: its exposition holds only the canary counters, `--rounds 0` runs until SIGTERM, and every
failure is one line naming the flag or the server's URL. (tests/test_canary.py runs the prober
against real reference servers, one of them with a broken verification.)"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sglang_dspark import canary_probe
from sglang_dspark.canary_probe import CanaryCounters, run_rounds
from sglang_dspark.metrics import EngineMetrics

REPO = Path(__file__).resolve().parents[1]
CANARY_FAMILIES = {"sglang_dspark_canary_replays", "sglang_dspark_canary_mismatches"}


@contextlib.contextmanager
def generate_server(answer):
    """A loopback `/generate` whose answer to a prompt is `answer(prompt) -> (status, json body)`."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            status, payload = answer(body["text"])
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def same_ids(prompt: str):
    return 200, {"text": "", "output_ids": [len(prompt), 1, 2]}


@pytest.fixture
def prompts_file(tmp_path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"domain": "chat", "prompt": p}) + "\n" for p in ("one", "three")))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_main(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        rc = canary_probe.main(argv)
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    captured = capsys.readouterr()
    return rc, captured.out, captured.err.strip()


def families(text: str) -> set[str]:
    """Family names of an exposition (prometheus_client's `*_created` timestamps aside)."""
    return {f.name for f in text_string_to_metric_families(text) if not f.name.endswith("_created")}


def test_the_exposition_holds_only_the_canary_counters():
    """No queue or running-request gauges (a phantom replica in dspark:num_*_reqs), and the same
    names and help as the engine canary's counters, so one alert reads both."""
    counters = CanaryCounters()
    counters.canary_replays.inc()
    assert families(counters.render().decode()) == CANARY_FAMILIES
    engine = {f.name: f.documentation for f in EngineMetrics().registry.collect() if f.name in CANARY_FAMILIES}
    assert {f.name: f.documentation for f in counters.registry.collect()} == engine


def test_a_bounded_run_exits_1_on_a_mismatch_and_keeps_the_evidence(tmp_path, prompts_file, capsys):
    with generate_server(same_ids) as good, generate_server(lambda p: (200, {"output_ids": [9, 9]})) as bad:
        rc, out, _ = run_main(["--dspark-url", good, "--reference-url", good, "--prompts", str(prompts_file),
                               "--rounds", "2", "--interval", "0", "--metrics-port", "0"], capsys)
        assert rc == 0 and out.strip() == "4 greedy requests compared, 0 mismatches"
        rc, out, _ = run_main(["--dspark-url", good, "--reference-url", bad, "--prompts", str(prompts_file),
                               "--interval", "0", "--metrics-port", "0", "--evidence-dir", str(tmp_path / "ev")], capsys)
    assert rc == 1 and out.strip() == "2 greedy requests compared, 2 mismatches"
    evidence = [json.loads(line) for line in (tmp_path / "ev" / "canary_mismatches.jsonl").read_text().splitlines()]
    assert [e["reference_url"] for e in evidence] == [bad, bad] and evidence[0]["first_difference"] == 0


@pytest.mark.parametrize("answer, reason", [
    (lambda p: (503, {"error": "warming up"}), 'HTTP 503: {"error": "warming up"}'),
    (lambda p: (200, {"text": "no ids"}), "the answer has no list of output_ids"),
])
def test_a_failed_request_is_one_line_naming_the_url(prompts_file, capsys, answer, reason):
    with generate_server(same_ids) as good, generate_server(answer) as broken:
        rc, _, err = run_main(["--dspark-url", good, "--reference-url", broken, "--prompts", str(prompts_file),
                               "--interval", "0", "--metrics-port", "0"], capsys)
    assert rc == 2 and err == f"error: POST {broken}/generate: {reason}" + (" (not an SGLang-compatible /generate)"
                                                                          if "output_ids" in reason else "")


def test_a_dead_server_is_one_line_naming_the_url(prompts_file, capsys):
    dead = f"http://127.0.0.1:{free_port()}"
    rc, _, err = run_main(["--dspark-url", dead, "--reference-url", dead, "--prompts", str(prompts_file),
                           "--metrics-port", "0", "--timeout", "5"], capsys)
    assert rc == 2 and err.startswith(f"error: POST {dead}/generate: ConnectError: ") and "\n" not in err
    assert "Errno" not in err


def test_bad_input_is_one_line_exit_2(prompts_file, capsys):
    base = ["--dspark-url", "http://127.0.0.1:1", "--reference-url", "http://127.0.0.1:1"]
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        cases = [
            (["--rounds", "-1"], "error: --rounds -1: must be >= 0 (0: until SIGINT / SIGTERM)"),
            (["--metrics-port", "99999"], "error: argument --metrics-port: '99999' is not a TCP port"),
            (["--metrics-port", str(port)], f"error: --metrics-host 127.0.0.1 --metrics-port {port}: cannot listen "
                                            "(Address already in use)"),
            (["--prompts", "nope"], "error: --prompts nope: unknown prompt source 'nope'"),
            (["--prompts", "missing/file.jsonl"], "error: --prompts missing/file.jsonl: prompt file"),
            (["--max-tokens", "0"], "error: --max-tokens 0: must be >= 1"),
            (["--no-such-flag"], "error: unrecognized arguments: --no-such-flag"),
        ]
        for extra, message in cases:
            rc, out, err = run_main([*base, "--prompts", str(prompts_file), *extra], capsys)
            assert rc == 2 and err.startswith(message) and "\n" not in err and out == "", (extra, err)
            assert "Error:" not in err.split(":", 2)[1], err  # no exception class as a prefix


def test_help_says_how_prometheus_on_another_host_reaches_the_prober(capsys):
    rc, out, _ = run_main(["--help"], capsys)
    text = " ".join(out.split())
    assert rc == 0 and "--metrics-host ADDR" in text and "0.0.0.0" in text and "(default: 127.0.0.1)" in text
    assert "0: run until SIGINT / SIGTERM" in text


def test_a_continuous_run_outlives_a_failing_server(monkeypatch):
    """After its first comparison a continuous run logs a failed request and tries again next round:
    a replica restarting during a rollout must not end the canary. Bounded by `stop`."""
    monkeypatch.setattr(canary_probe, "RETRY_S", 0.01)
    calls = {"n": 0}

    def flaky(prompt: str):
        calls["n"] += 1
        return (503, {"error": "restarting"}) if calls["n"] in (2, 3) else same_ids(prompt)

    stop = threading.Event()

    class Counting:
        def __init__(self, counter):
            self.counter, self.n = counter, 0

        def inc(self):
            self.counter.inc()
            self.n += 1
            if self.n >= 4:
                stop.set()

    counters = CanaryCounters()
    counters.canary_replays = Counting(counters.canary_replays)
    with generate_server(same_ids) as good, generate_server(flaky) as reference:
        args = argparse.Namespace(dspark_url=good, reference_url=reference, rounds=0, interval=0.0, max_tokens=4,
                                  evidence_dir=None, api_key=None, timeout=5.0)
        assert run_rounds(args, ["a", "b"], counters, stop) == (4, 0)
        assert calls["n"] == 6  # two refused requests, retried
        args.rounds, calls["n"] = 1, 1
        with pytest.raises(canary_probe.ProbeError, match=f"POST {reference}/generate: HTTP 503"):
            run_rounds(args, ["a", "b"], counters, threading.Event())  # a bounded run stops at the error


def test_rounds_0_runs_until_sigterm_with_its_counters_scrapeable(prompts_file):
    """The production mode: the counters stay on /metrics between scrapes; SIGTERM ends it (exit 0)."""
    port = free_port()
    with generate_server(same_ids) as good:
        proc = subprocess.Popen([sys.executable, "-m", "sglang_dspark.canary_probe", "--dspark-url", good,
                                 "--reference-url", good, "--prompts", str(prompts_file), "--rounds", "0",
                                 "--interval", "0.05", "--metrics-host", "127.0.0.1", "--metrics-port", str(port)],
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            replays, deadline = 0.0, time.monotonic() + 60
            while replays < 5 and time.monotonic() < deadline and proc.poll() is None:  # more than one pass
                try:
                    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
                    replays = next(s.value for f in text_string_to_metric_families(text)
                                   if f.name == "sglang_dspark_canary_replays" for s in f.samples
                                   if s.name.endswith("_total"))
                except httpx.HTTPError:
                    time.sleep(0.1)
            assert proc.poll() is None and replays >= 5, proc.communicate(timeout=10)
            assert families(text) == CANARY_FAMILIES
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert proc.returncode == 0, err
    assert out.strip().endswith("0 mismatches (stopped by a signal)")
