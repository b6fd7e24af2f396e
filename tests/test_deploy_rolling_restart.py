"""A rolling restart that loses nothing, for real on loopback: two reference replicas started with
the cpu-reference manifest's own args (SmolLM2 with the shipped drafter and the profile from the
manifest's ConfigMap; mount paths and ports mapped to this machine) behind sglang-router started
with the router manifest's args (static workers instead of service discovery: there is no
cluster), under the load test's 4 streaming users. Each replica in turn goes through what the
manifests prescribe: the preStop hook (the manifest's own command: it leaves the router), SIGTERM,
the drain (exit 0 within the grace period), a restart, the probes answering, and back into the
router (the router's pod watch does that in a cluster; here the systemd unit's ExecStartPost,
`router_workers join`). Every request of the load test through the router completes: zero failed
or cut streams (the kill test, tests/test_router_scale_out.py, cuts up to what the dead replica
held). All of it on a CPU-starved host: a busy process per core competes with the replicas, the
router and the load from start to end, since a production replica under load is slow too and the
router's health checks must not eject the one left serving."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from deploy_manifests import containers, render
from sglang_dspark.testing.servers import busy_cpus, free_port, start_reference_server, stop

from sglang_dspark import zoo

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
DRAFT = ROOT / "launch" / "models" / "smollm2-135m-instruct-dspark"
LOAD_USERS, LOAD_STEP_S, MAX_TOKENS = 4, 10, 16


def _replica_manifest() -> tuple[dict, dict, str]:
    """(pod spec, container, profile text) of the cpu-reference Deployment as kustomize renders it."""
    (doc, container), = containers("cpu-reference")
    (cm,) = [d for d in render("cpu-reference") if d["kind"] == "ConfigMap"]
    return doc["spec"]["template"]["spec"], container, cm["data"]["profile.yaml"]


FAULT_WORDS = ("Traceback", "Error", "error", "failed")


def _started(*args: str, port: int, faults: deque) -> subprocess.Popen:
    """A reference server, its output read on so that it never blocks on a full pipe; lines that
    report a fault are kept in `faults`, for the failure message."""
    proc = start_reference_server(*args, port=port)
    _keep_lines(proc.stdout, faults, f"[{port}]", FAULT_WORDS)
    return proc


def _keep_lines(stream, into: deque, prefix: str, words: tuple[str, ...] = ()) -> None:
    """Read `stream` on a daemon thread (so the process never blocks on a full pipe), keeping the
    lines that hold any of `words` (every line without words) in `into`."""
    def read() -> None:
        for line in stream:
            if not words or any(w in line for w in words):
                into.append(f"{prefix} {line.rstrip()}")
    threading.Thread(target=read, daemon=True).start()


def _mapped(words: list[str], paths: dict[str, str]) -> list[str]:
    return [paths.get(w, w) for w in words]


def _router_args(port: int, metrics_port: int, workers: list[str]) -> list[str]:
    """The router manifest's args with service discovery replaced by static workers on loopback."""
    (_, router), = containers("router")
    args, out, i = router["args"], [], 0
    takes_value = {"--selector", "--service-discovery-port", "--service-discovery-namespace"}
    while i < len(args):
        if args[i] == "--service-discovery":
            i += 1
        elif args[i] in takes_value:
            i += 2
        else:
            out.append(args[i])
            i += 1
    return [*out, "--worker-urls", *workers, "--host", "127.0.0.1", "--port", str(port),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port), "--log-level", "warn"]


def _wait(condition, timeout_s: float, what: str, poll_s: float = 0.25):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except httpx.HTTPError:
            pass
        time.sleep(poll_s)
    raise AssertionError(f"{what} within {timeout_s:g} s")


def _probe_ok(url: str, probe: dict) -> bool:
    return httpx.get(f"{url}{probe['httpGet']['path']}", timeout=5).status_code == 200


def _served(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("sglang_dspark_requests_finished_total{"))


class Load:
    """`python -m sglang_dspark.loadtest run` steps of LOAD_STEP_S, one after another until stopped:
    the load covers the restarts however long they take, and every step writes its report."""

    def __init__(self, host: str, model: str, out: Path):
        self.host, self.model, self.out, self.reports = host, model, out, []
        self._stop, self._thread, self.errors = threading.Event(), None, []

    def __enter__(self):
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        for i in range(1000):
            if self._stop.is_set():
                return
            out = self.out / f"run{i}"
            done = subprocess.run([sys.executable, "-m", "sglang_dspark.loadtest", "run", "--host", self.host,
                                   "--users", str(LOAD_USERS), "--duration", f"{LOAD_STEP_S}s",
                                   "--max-tokens", str(MAX_TOKENS), "--model", self.model, "--out", str(out)],
                                  capture_output=True, text=True, timeout=600, cwd=ROOT,
                                  env={**os.environ, "HF_HUB_OFFLINE": "1"})
            if done.returncode != 0:
                self.errors.append(done.stdout[-2000:] + done.stderr[-2000:])
            self.reports.append(out / "report.json")

    def wait_for_runs(self, n: int, timeout_s: float) -> None:
        _wait(lambda: len(self.reports) >= n, timeout_s, f"{n} load runs did not finish", poll_s=0.5)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(600)


def test_a_rolling_restart_through_the_router_loses_no_request(tmp_path):
    pod, container, profile_text = _replica_manifest()
    (tmp_path / "profile.yaml").write_text(profile_text)
    target = zoo.resolve_model("smollm2-135m-instruct", zoo.DEFAULT_CACHE, materialise=True)
    paths = {"/models/target": target, "/models/draft": str(DRAFT), "/etc/dspark/profile.yaml": str(tmp_path / "profile.yaml")}
    replica_args = _mapped(container["args"], paths)
    grace_s = pod["terminationGracePeriodSeconds"]
    hook = container["lifecycle"]["preStop"]["exec"]["command"]
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    faults: deque[str] = deque(maxlen=40)
    router_said: deque[str] = deque(maxlen=40)
    router_port = free_port()
    base = f"http://127.0.0.1:{router_port}"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "DSPARK_ROUTER": base,
           "POD_IP": "127.0.0.1"}
    contention: list[subprocess.Popen] = []
    replicas: list[subprocess.Popen] = []
    router: subprocess.Popen | None = None
    try:  # everything started from here on is stopped in `finally`, whichever start fails
        contention += busy_cpus()
        with ThreadPoolExecutor(2) as pool:  # both load their models at once
            starts = [pool.submit(_started, *replica_args, port=p, faults=faults) for p in ports]
        replicas += [f.result() for f in starts if f.exception() is None]
        for f in starts:
            f.result()  # the first failed start, raised once the other replica is kept to be stopped
        router = subprocess.Popen([sys.executable, "-m", "sglang_router.launch_router",
                                   *_router_args(router_port, free_port(), urls)],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  start_new_session=True)
        _keep_lines(router.stdout, router_said, "[router]")  # its warnings: why it refused, in a failure
        for url in urls:  # the manifest's probes answer on the replica started with its args
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                assert _probe_ok(url, container[probe]), (url, probe)
        _wait(lambda: httpx.get(f"{base}/readiness", timeout=5).status_code == 200, 90, "the router is not ready")
        _wait(lambda: sum(w["is_healthy"] for w in httpx.get(f"{base}/workers", timeout=5).json()["workers"]) == 2,
              90, "the router does not list both replicas healthy")
        # the router lists the model by its path; clients name it as the replicas serve it
        model = replica_args[replica_args.index("--served-model-name") + 1]
        with Load(base, model, tmp_path / "load") as load:
            _wait(lambda: all(_served(u) > 0 for u in urls), 120, "the load did not reach both replicas")
            timeline = []
            for i, (port, url) in enumerate(zip(ports, urls)):
                # preStop: the manifest's own hook, its port mapped to this replica's
                script = hook[2].replace(":30000", f":{port}")
                done = subprocess.run([*hook[:2], script], capture_output=True, text=True, timeout=60, env=env)
                assert done.returncode == 0 and not done.stderr, done.stderr  # it left; no fallback sleep
                listed = [w["url"] for w in httpx.get(f"{base}/workers", timeout=5).json()["workers"]]
                assert url not in listed, listed  # the router sends it nothing new
                t0 = time.monotonic()
                rc = stop(replicas[i], timeout_s=grace_s)  # SIGTERM; the drain must end within the grace period
                drained_s = time.monotonic() - t0
                assert rc == 0 and drained_s < grace_s, (rc, drained_s)
                replicas[i] = _started(*replica_args, port=port, faults=faults)
                _wait(lambda: _probe_ok(url, container["readinessProbe"]), 120, "the restarted replica is not ready")
                done = subprocess.run([sys.executable, "-m", "sglang_dspark.router_workers", "join", "--router", base,
                                       "--worker", url, "--timeout", "60"], capture_output=True, text=True, timeout=90)
                assert done.returncode == 0, done.stderr
                _wait(lambda: _served(url) > 0, 120, f"replica {i} took no request after it rejoined")
                timeline.append(f"replica {i}: drained in {drained_s:.1f} s, back in {time.monotonic() - t0:.0f} s")
            runs_now = len(load.reports)
            load.wait_for_runs(runs_now + 1, 300)  # one whole run with both replicas back
        assert not load.errors, load.errors[0]
        reports = [json.loads(p.read_text()) for p in load.reports]
        steps = [s for r in reports for s in r["steps"]]
        requests, failures = sum(s["requests"] for s in steps), sum(s["failures"] for s in steps)
        locust_failures = sum(s["locust"]["failures"] for s in steps)
        print(f"\nrolling restart, {len(contention)} busy processes beside it: {'; '.join(timeline)}; "
              f"{len(reports)} load runs of {LOAD_USERS} streaming users: "
              f"{requests} requests, {failures} failed or cut (Locust: {locust_failures}); reports: {load.out}")
        assert requests > 0
        # which load run (10 s each from the start) and why: a flake on a loaded CI host says what it was
        failed = [(f"run {i}", s["failures"], s["errors"]) for i, r in enumerate(reports) for s in r["steps"]
                  if s["failures"]]
        assert failures == 0 and locust_failures == 0, (
            f"{'; '.join(timeline)}: {failed}; replicas said: {list(faults)}; the router said: {list(router_said)}")
    finally:
        for busy in contention:
            stop(busy)
        if router is not None:
            stop(router)
        for proc in replicas:
            stop(proc)
