"""Live alerting: a real Prometheus (Debian's `prometheus` package, installed by dev.sh) scrapes two
reference servers under load, evaluates the shipped rules, and the alerts of two induced faults
fire, read from Prometheus's HTTP API:

- a drafter whose drafts are never accepted (verify-all replica): DSparkAcceptedLengthCollapse;
- a verifier that lets a rejected draft through every fifth step, with the correctness canary
  replaying every greedy request: DSparkCanaryMismatch.

The healthy-verification replica's canary stays at zero under the same load. The rules are the
shipped ones with every `for:` set to 0 s (the `for` durations have their own promtool unit tests,
ops/prometheus/tests/); scrape and evaluation run every second."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch
import yaml
from engine_fixtures import (RejectedDrafter, ToyTokenizer, greedy_reference, tiny_drafter_for, tiny_engine,
                             tiny_hf_target)
from loopback_server import serve_on_loopback
from sglang_dspark.testing.servers import free_port, stop

from sglang_dspark.engine import engine as engine_module
from sglang_dspark.engine.async_engine import AsyncEngine
from sglang_dspark.engine.engine import Engine, EngineConfig
from sglang_dspark.engine.target_model import TargetModel
from sglang_dspark.server import create_app

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
OPS = ROOT / "ops" / "prometheus"
PROMPT = [5, 9, 14, 22, 7]
MAX_NEW = 40
DEADLINE_S = 180  # the alerts fire within seconds; this bounds a broken setup


def _rules_without_for(tmp: Path) -> list[str]:
    paths = []
    for src in sorted((OPS / "rules").glob("*.yml")):
        doc = yaml.safe_load(src.read_text())
        for group in doc["groups"]:
            group["interval"] = "1s"
            for rule in group["rules"]:
                if "alert" in rule:
                    rule["for"] = "0s"
        (tmp / src.name).write_text(yaml.safe_dump(doc))
        paths.append(str(tmp / src.name))
    return paths


def _prometheus_config(tmp: Path, targets: dict[str, str]) -> Path:
    """The shipped prometheus.yml, its reference job pointed at `targets` (name -> host:port)."""
    config = yaml.safe_load((OPS / "prometheus.yml").read_text())
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "dspark-reference")
    job["static_configs"] = [{"targets": list(targets.values()),
                              "labels": {**job["static_configs"][0]["labels"], "dspark_mode": "full"}}]
    job["scrape_interval"] = "1s"
    config["scrape_configs"] = [job]
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = _rules_without_for(tmp)
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@contextlib.contextmanager
def _prometheus(config: Path, tmp: Path):
    port = free_port()
    proc = subprocess.Popen([shutil.which("prometheus") or "prometheus", f"--config.file={config}",
                             f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/-/ready", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        assert proc.poll() is None, proc.stderr.read()
        yield base
    finally:
        stop(proc)


def _firing(prometheus: str, names: dict[str, str]) -> set[tuple[str, str]]:
    """(alert, replica name) of every firing alert; `names` maps an instance (host:port) to a name."""
    alerts = httpx.get(f"{prometheus}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
    return {(a["labels"]["alertname"], names[a["labels"]["instance"]]) for a in alerts if a["state"] == "firing"}


def _rejected_drafts_engine() -> Engine:
    hf = tiny_hf_target()
    target = TargetModel.from_hf_model(hf)
    inner = tiny_drafter_for(target)
    drafter = RejectedDrafter(inner, PROMPT, greedy_reference(hf, PROMPT, MAX_NEW + inner.gamma + 2))
    config = EngineConfig(mode="full", max_running=4, max_len=256, canary_share=1.0)
    return Engine(target, ToyTokenizer(), drafter, config=config, model_name="tiny")


def test_induced_faults_fire_their_alerts_in_a_real_prometheus(tmp_path, monkeypatch):
    assert shutil.which("prometheus"), "prometheus is not installed: ./dev.sh setup installs Debian's package"
    collapsed = AsyncEngine(_rejected_drafts_engine())
    corrupting = AsyncEngine(tiny_engine("full", max_running=4, canary_share=1.0))
    real_verify, calls = engine_module.verify_step, {"n": 0}

    def broken_on_one_engine(batch, drafts, draft_probs, logits, lens, shared):
        num_acc, nxt = real_verify(batch, drafts, draft_probs, logits, lens, shared)
        if threading.current_thread() is corrupting._thread:
            calls["n"] += 1
            wrong = (num_acc < lens) & (calls["n"] % 5 == 0)
            if bool(wrong.any()):
                i = int(wrong.nonzero()[0])
                nxt[i] = drafts[i, num_acc[i]]  # a rejected draft emitted as if accepted
        return num_acc, nxt

    monkeypatch.setattr(engine_module, "verify_step", broken_on_one_engine)
    stop_load = threading.Event()
    for engine in (collapsed, corrupting):
        engine.start()
    try:
        with serve_on_loopback(create_app(collapsed)) as a, serve_on_loopback(create_app(corrupting)) as b:
            failures: list[str] = []

            def load(base: str, seed: int) -> None:  # a greedy load until the alerts are read
                g = torch.Generator().manual_seed(seed)
                with httpx.Client(timeout=60) as client:
                    while not stop_load.is_set():
                        ids = PROMPT if base == a else torch.randint(4, 40, (5,), generator=g).tolist()
                        r = client.post(f"{base}/generate", json={"input_ids": ids, "sampling_params": {
                            "max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}})
                        if r.status_code != 200:
                            failures.append(r.text)

            threads = [threading.Thread(target=load, args=(base, i), daemon=True)
                       for i, base in enumerate((a, b, a, b))]
            for t in threads:
                t.start()
            targets = {"collapsed": a.removeprefix("http://"), "corrupting": b.removeprefix("http://")}
            with _prometheus(_prometheus_config(tmp_path, targets), tmp_path) as prometheus:
                wanted = {("DSparkAcceptedLengthCollapse", "collapsed"), ("DSparkCanaryMismatch", "corrupting")}
                deadline, firing = time.monotonic() + DEADLINE_S, set()
                while time.monotonic() < deadline and not wanted <= firing:
                    time.sleep(1)
                    firing = _firing(prometheus, {v: k for k, v in targets.items()})
                assert wanted <= firing, f"firing: {sorted(firing)}"
                assert ("DSparkCanaryMismatch", "collapsed") not in firing  # honest verification: no mismatch
            stop_load.set()
            for t in threads:
                t.join(120)
            assert not failures, failures[:3]
        healthy = collapsed.call(lambda e: (e.canary.replays, e.canary.mismatches)).result(10)
        assert healthy[0] > 0 and healthy[1] == 0
        accepted = collapsed.call(lambda e: sum(r.accepted_drafts for r in e.records)).result(10)
        assert accepted == 0  # the fault really is "no draft accepted"
    finally:
        stop_load.set()
        for engine in (collapsed, corrupting):
            engine.shutdown()
