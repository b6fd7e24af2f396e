"""`profile snapshot`: a live reference server's learned SPS table becomes a profile that `profile
validate` accepts and `launch --profile` uses; and launch seeds from a profile of other hardware."""

from __future__ import annotations

import logging
import statistics
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from drafter_fixtures import write_tiny_model_dirs
from loopback_server import serve_engine_on_loopback

from sglang_dspark import launch
from sglang_dspark.engine.engine import EngineConfig
from sglang_dspark.engine.factory import build_engine
from sglang_dspark.profile.cli import main as profile_main
from sglang_dspark.profile.schema import SlaProfile


@pytest.fixture(scope="module")
def learned_server(tmp_path_factory):
    target, draft = write_tiny_model_dirs(tmp_path_factory.mktemp("snap"))
    identity = launch._identity(target, draft)
    config = EngineConfig(mode="scheduled", max_running=4, max_len=200, probe_every=4)
    engine = build_engine(target, draft, config=config, model_name="tiny", identity=identity)
    with serve_engine_on_loopback(engine) as (_, base):
        def one(i: int) -> None:
            r = httpx.post(f"{base}/generate", json={"input_ids": [5 + i, 9, 11], "sampling_params": {
                "max_new_tokens": 48, "temperature": 0, "ignore_eos": True}}, timeout=120)
            assert r.status_code == 200, r.text

        with ThreadPoolExecutor(4) as pool:  # several batch sizes, enough steps for probes
            list(pool.map(one, range(8)))
        yield target, draft, base


def test_server_info_reports_the_learned_table(learned_server):
    _, _, base = learned_server
    rec = httpx.get(f"{base}/server_info").json()["internal_states"][0]["dspark_info_record"]
    assert rec["sps_source"] == "online" and rec["sps_drafted_samples"] > 0 and rec["probe_steps"] > 0
    assert rec["sps"]["bias_seconds"] > 0 and rec["sps_step_times_ms"]
    assert rec["sps_prediction_error"] is not None and rec["sps_table_age_s"] >= 0
    metrics = httpx.get(f"{base}/metrics").text
    assert 'sglang_dspark_sps_table_source{source="online"} 1.0' in metrics
    assert "sglang_dspark_sps_prediction_error " in metrics and "sglang_dspark_probe_steps_total " in metrics


def test_snapshot_validates_and_launch_uses_it(learned_server, tmp_path, capsys):
    target, draft, base = learned_server
    out = tmp_path / "learned.yaml"
    assert profile_main(["snapshot", "--base-url", base, "--out", str(out), "--tier", "fast:20:2:4",
                        "--tier", "half:x0.5:2:4"]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out}")
    profile = SlaProfile.load(out)
    alone = 1.0 / profile.sps_table().seconds_at(1, 1, False)  # one request, not drafting, on the table written
    assert profile.tier("fast").tok_s_per_user == 20.0
    assert profile.tier("half").tok_s_per_user == pytest.approx(0.5 * float(alone), abs=0.05)
    assert profile.provenance.source == "snapshot" and profile.sps.additive is not None
    assert profile.sps.measurements and out.with_suffix(".png").is_file()
    # What the (now idle) server reports it learned: the snapshot's table is that table, and its
    # measurements are the medians of the step times it reports
    rec = httpx.get(f"{base}/server_info").json()["internal_states"][0]["dspark_info_record"]
    reported = dict(rec["sps"])
    assert profile.sps.draft_skip_seconds == reported.pop("draft_skip_seconds", None)
    assert profile.sps.additive.model_dump().keys() == reported.keys()
    for key, value in profile.sps.additive.model_dump().items():
        assert value == pytest.approx(reported[key], rel=1e-9), key
    times = {(r, b): statistics.median(ms) for r, b, ms in rec["sps_step_times_ms"]}
    assert {(m.num_requests, m.batch_tokens): m.median_ms for m in profile.sps.measurements} == pytest.approx(times, abs=1e-4)
    assert profile_main(["validate", str(out), "--model", target, "--draft", draft]) == 0
    assert "fingerprint matches" in capsys.readouterr().out
    assert launch.main(["--model", target, "--draft", draft, "--profile", str(out), "--engine", "reference",
                        "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert f"profile={out} (learned)" in printed and "FORCED" not in printed and "as a seed" not in printed


def test_snapshot_refuses_servers_that_do_not_learn(tmp_path, capsys):
    from engine_fixtures import tiny_engine

    with serve_engine_on_loopback(tiny_engine("full")) as (_, base):
        assert profile_main(["snapshot", "--base-url", base, "--out", str(tmp_path / "x.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert "does not learn its SPS table" in err and "\n" not in err


def test_a_profile_from_other_hardware_seeds_the_online_table(learned_server, tmp_path, capsys, caplog):
    target, draft, base = learned_server
    out = tmp_path / "elsewhere.yaml"
    assert profile_main(["snapshot", "--base-url", base, "--out", str(out)]) == 0
    profile = SlaProfile.load(out)
    foreign = profile.replaced(fingerprint=profile.fingerprint.model_copy(update={"hardware": "cpu: Other CPU x64"}))
    foreign.save(out)
    with caplog.at_level(logging.INFO):
        assert launch.main(["--model", target, "--draft", draft, "--profile", str(out), "--engine", "reference",
                            "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "as a seed (measured elsewhere: hardware: profile 'cpu: Other CPU x64'" in printed
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "seeded from" in messages and "python -m sglang_dspark.profile snapshot --base-url" in messages
    # without learning, a profile of other hardware is refused as before
    assert launch.main(["--model", target, "--draft", draft, "--profile", str(out), "--engine", "reference",
                        "--dry-run", "--sps-learning", "off"]) == 2
    assert "fingerprint does not match" in capsys.readouterr().err
