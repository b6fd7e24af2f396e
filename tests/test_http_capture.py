"""capture-http against our own server in process (tiny engine, loopback), and /set_internal_state."""

from __future__ import annotations

import json
import logging

import httpx
import pytest

from engine_fixtures import tiny_engine
from loopback_server import dead_loopback_server, serve_engine_on_loopback
from sglang_dspark.profile.cli import main as profile_main
from sglang_dspark.profile.fingerprint import dir_sha256, library_versions
from sglang_dspark.profile.http_capture import server_versions, step_samples
from sglang_dspark.profile.measure import fit_section, summarize
from sglang_dspark.profile.schema import SlaProfile


@pytest.fixture(scope="module")
def server():
    with serve_engine_on_loopback(tiny_engine("scheduled", max_running=4)) as served:
        yield served


@pytest.fixture
def dead_server():
    with dead_loopback_server() as url:
        yield url


def _model_dir(path, content: bytes):
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"block_size": 4}))
    (path / "model.safetensors").write_bytes(content)
    return path


def _forced(engine) -> float | None:
    return engine.call(lambda e: e.policy.forced_budget_frac).result(timeout=10)


def test_set_internal_state(server):
    engine, base = server
    url = f"{base}/set_internal_state"
    r = httpx.post(url, json={"server_args": {"dspark_force_budget_frac": 0.5}})
    assert r.status_code == 200 and r.json() == [True]  # SGLang's answer: one bool per DP rank
    assert _forced(engine) == 0.5
    for bad, message in (({"server_args": {"dspark_force_budget_frac": 1.5}}, "must be in [0, 1]"),
                         ({"server_args": {"dspark_force_budget_frac": "x"}}, "valid number"),
                         ({"server_args": {"pp_max_micro_batch_size": 8}}, "Extra inputs"),
                         ({"dspark_force_budget_frac": 0.5}, 'expected SGLang\'s shape {"server_args"'),
                         ([1], "request body: Input should be a valid dictionary")):
        r = httpx.post(url, json=bad)
        assert r.status_code == 400, bad
        assert message in r.json()["error"]["message"], (bad, r.json())
    assert _forced(engine) == 0.5  # a refused update changes nothing
    r = httpx.post(url, json={"server_args": {"dspark_force_budget_frac": None, "dspark_clear_info_records": True}})
    assert r.status_code == 200 and _forced(engine) is None
    assert engine.call(lambda e: len(e.records)).result(timeout=10) == 0


def test_capture_http_writes_a_valid_profile(server, tmp_path, capsys):
    engine, base = server
    out = tmp_path / "http.yaml"
    rc = profile_main(["capture-http", "--base-url", base, "--out", str(out), "--fractions", "0.25,1.0",
                       "--concurrency", "1,3", "--max-new-tokens", "12", "--min-samples", "2", "--warmup-steps", "1",
                       "--tier", "interactive:20:2:3", "--tier", "batch:x0.25:9:3", "--timeout", "60"])
    assert rc == 0, capsys.readouterr().err
    assert capsys.readouterr().out.startswith(f"wrote {out}: http: engine=reference")
    profile = SlaProfile.load(out)  # the schema's own checks passed
    assert profile.fingerprint.engine == "reference" and profile.fingerprint.gamma == engine.engine.gamma == 4
    assert profile.provenance.source == "capture-http"
    alone = float(profile.sps_table()(1, num_requests=1, drafted=False))
    assert [(t.name, t.tok_s_per_user) for t in profile.sla_tiers] == [("interactive", 20.0), ("batch", round(0.25 * alone, 1))]
    assert profile.fingerprint.target_sha256 == "unknown"  # no --model given
    rows = profile.sps.measurements
    assert rows and all(r.repeats >= 2 for r in rows)
    assert {r.num_requests for r in rows} >= {1}
    cost = profile.sps.cost
    assert cost.sample_batch_tokens == sorted({r.batch_tokens for r in rows})
    assert cost.max_batch_tokens == 4 * (4 + 1)
    assert profile.tier("interactive").max_concurrency == 3
    assert _forced(engine) is None  # handed back to the planner
    assert profile_main(["validate", str(out)]) == 0


def test_capture_http_refuses_a_dead_server(tmp_path, capsys, dead_server):
    rc = profile_main(["capture-http", "--base-url", dead_server, "--out", str(tmp_path / "x.yaml"),
                       "--timeout", "5"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith(f"error: GET {dead_server}/server_info") and "\n" not in err


@pytest.mark.parametrize("extra, message", [
    (["--fractions", "0,0.5"], "--fractions: need values in (0, 1] (SGLang refuses 0)"),
    (["--model", "HuggingFaceTB/SmolLM2-135M-Instruct"], "--model HuggingFaceTB/SmolLM2-135M-Instruct: not a local "
                                                          "directory"),
    (["--draft", "{tmp}"], "--draft {tmp}: no config.json, not a model directory"),
    (["--min-samples", "0"], "--min-samples 0: must be >= 1"),
])
def test_capture_http_checks_its_inputs_before_any_request(tmp_path, capsys, dead_server, extra, message):
    """Refused by the flag at fault, not by the dead server: nothing was sent (a long sweep would
    otherwise fail only at its end)."""
    extra = [e.format(tmp=tmp_path) for e in extra]
    rc = profile_main(["capture-http", "--base-url", dead_server, "--out", str(tmp_path / "x.yaml"), *extra])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith(f"error: {message.format(tmp=tmp_path)}") and "\n" not in err, err


def test_the_fingerprint_takes_the_servers_versions(caplog):
    client_torch, client_sglang = library_versions()
    with caplog.at_level(logging.WARNING, logger="sglang_dspark.profile.http_capture"):
        # SGLang's /server_info: its own "version", no torch version
        assert server_versions({"version": "0.9.1", "internal_states": []}, "sglang") == (client_torch, "0.9.1")
    assert "reports no torch version" in caplog.text and "no SGLang version" not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sglang_dspark.profile.http_capture"):
        # our reference server launched with a drafter: its dspark_fingerprint
        reported = {"dspark_fingerprint": {"torch": "3.0.0", "sglang": None}}
        assert server_versions(reported, "reference") == ("3.0.0", None)
        assert caplog.text == ""
        assert server_versions({}, "reference") == (client_torch, client_sglang)  # nothing reported
    assert "reports no torch version" in caplog.text and "reports no SGLang version" in caplog.text


def test_capture_http_fingerprints_the_server_and_the_directories(server, tmp_path, monkeypatch, capsys):
    engine, base = server
    target, draft = _model_dir(tmp_path / "target", b"t"), _model_dir(tmp_path / "draft", b"d")
    monkeypatch.setattr(engine.engine, "identity", {"torch": "9.9.9", "sglang": "0.0.1"})
    out = tmp_path / "fp.yaml"
    rc = profile_main(["capture-http", "--base-url", base, "--out", str(out), "--phase", "static", "--concurrency",
                       "1", "--max-new-tokens", "6", "--min-samples", "1", "--model", str(target), "--draft",
                       str(draft), "--timeout", "60"])
    assert rc == 0, capsys.readouterr().err
    fp = SlaProfile.load(out).fingerprint
    assert (fp.torch, fp.sglang) == ("9.9.9", "0.0.1")  # the server's, not this client's
    assert fp.target_sha256 == dir_sha256(target) and fp.draft_sha256 == dir_sha256(draft)


def test_step_records_become_measurements_and_tables():
    records = [{"bs": 2, "num_verify_tokens": 6, "step_ms": v} for v in (10.0, 12.0, 11.0)]
    records += [{"bs": 1, "num_verify_tokens": 3, "step_gpu_ms": 5.0}]  # SGLang's field; too few samples
    records += [{"bs": 0, "num_verify_tokens": 3, "step_ms": 5.0}, {"bs": 2, "step_ms": 5.0}]  # malformed: skipped
    rows = summarize(step_samples(records), min_samples=2)
    assert [(m.num_requests, m.batch_tokens) for m in rows] == [(2, 6)]
    assert rows[0].median_ms == 11.0 and rows[0].p10_ms == pytest.approx(10.2) and rows[0].repeats == 3
    section = fit_section(rows, 0, skips_drafter_at_budget_0=False)
    assert section.cost.sample_batch_tokens == [6] and section.cost.sample_steps_per_sec == [round(1000 / 11.0, 6)]
    assert section.additive is not None and section.draft_skip_seconds is None  # SGLang always drafts
