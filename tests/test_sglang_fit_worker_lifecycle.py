"""The fit worker's end of life and the scheduler's shutdown: a worker that hangs is killed at its
deadline (refits move to the fallback thread instead of stopping for good), `close` reaps the
child (no zombie, a hung one killed), and at Scheduler.release_host_resources the learned table is
written at once (not up to EXPORT_SECONDS late) and the worker is gone; a worker whose scheduler
died goes too, even when a process forked from the scheduler holds its socket."""

from __future__ import annotations

import json
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
from multiprocessing.connection import Connection

import pytest
from test_sglang_plugin import _Clock, _learning_run, _profile_with_tier, _synchronous_worker

pytestmark = pytest.mark.sglang


def _samples(n: int = 32):
    from sglang_dspark.core.sps_online import StepSample

    return [StepSample(1 + i % 3, 4 + i % 5, i % 2 == 0, 0.01 + 0.001 * i, i) for i in range(n)]


@pytest.fixture
def worker_factory():
    from sglang_dspark.core.sps_online import OnlineSpsEstimator
    from sglang_dspark.sglang_plugin.fitter import FitWorker

    made = []

    def make(**kwargs) -> FitWorker:
        made.append(FitWorker(OnlineSpsEstimator(), **kwargs))
        assert made[-1].wait_ready(120), "the fit worker did not start"
        return made[-1]

    yield make
    for worker in made:  # leave no process behind a failed assertion
        if worker.proc.poll() is None:
            worker.proc.kill()
            worker.proc.wait(30)


def test_a_hung_fit_is_killed_at_the_deadline_and_the_worker_reaped(worker_factory, caplog):
    clock = _Clock()
    worker = worker_factory(deadline=30.0, clock=clock)
    os.kill(worker.pid, signal.SIGSTOP)  # a fit that never comes back
    assert worker.submit(_samples(), 32) and worker.busy
    clock.now += 29.0
    assert worker.poll() is None and not worker.dead  # still within its deadline
    clock.now += 2.0
    with caplog.at_level("ERROR", logger="sglang_dspark.sglang_plugin.fitter"):
        assert worker.poll() is None
    assert worker.dead and not worker.available
    assert worker.proc.returncode == -signal.SIGKILL  # killed and reaped, not left stopped
    assert any("no fit back 30 s after" in r.getMessage() for r in caplog.records)


def test_close_reaps_the_child_and_kills_one_that_hangs(worker_factory):
    worker = worker_factory()
    worker.close()
    # reaped (no zombie): it read EOF and exited, or, starved of CPU at nice 10 past close's timeout, was
    # killed; which of the two depends on the host's load, not on the code
    assert worker.proc.returncode in (0, -signal.SIGKILL)
    hung = worker_factory()
    os.kill(hung.pid, signal.SIGSTOP)
    hung.close(timeout=1.0)
    assert hung.proc.returncode == -signal.SIGKILL


def test_shutdown_writes_the_learned_table_now_and_stops_the_worker(plugin_env, tmp_path, monkeypatch):
    from sglang_dspark.sglang_plugin import export, observer

    _, path = _profile_with_tier(tmp_path)
    plugin_env(SGLANG_DSPARK_PROFILE=str(path), SGLANG_DSPARK_SPS_LEARNING="1",
               SGLANG_DSPARK_EXPORT_DIR=str(tmp_path / "export"))
    monkeypatch.setattr(export, "EXPORT_SECONDS", 1e9)  # only the first refit writes on its own
    keep_open = []

    def ready(obs):
        _synchronous_worker(monkeypatch)(obs)
        monkeypatch.setattr(obs.worker, "close", lambda *a, **k: keep_open.append(obs.worker))  # shutdown closes it

    seen = _learning_run(monkeypatch, attn_tp_size=1, before=ready)
    obs, learned = seen["observer"], tmp_path / "export" / "learned-sps.dp0.json"
    worker = keep_open[0]
    monkeypatch.delattr(worker, "close")  # the worker's own close again
    early = json.loads(learned.read_text())["steps"]
    assert early < obs.learner.steps  # written at the first refit, stale since
    observer.after_scheduler_shutdown(None, None)
    record = json.loads(learned.read_text())
    assert record["steps"] == obs.learner.steps and record["sps_drafted_samples"] > 0
    assert worker.dead and worker.proc.returncode in (0, -signal.SIGKILL)  # stopped and reaped


SCHEDULER = """
import os, sys, time
from sglang_dspark.core.sps_online import OnlineSpsEstimator
from sglang_dspark.sglang_plugin.fitter import FitWorker
worker = FitWorker(OnlineSpsEstimator())
assert worker.wait_ready(120)
forked = os.fork() if sys.argv[1] == "fork" else -1
if forked == 0:  # e.g. a helper process SGLang forks: it inherits every open descriptor
    time.sleep(600)
    os._exit(0)
print(worker.pid, forked, flush=True)
time.sleep(600)  # killed by the test long before
"""


def _worker_exits_when_its_scheduler_is_killed(fork: bool) -> tuple[bool, int]:
    """SIGKILL a scheduler stand-in that started a fit worker (and, with `fork`, forked a child
    that keeps running); (whether the worker exited within 120 s, its pid). Nothing is left behind."""
    parent = subprocess.Popen([sys.executable, "-c", SCHEDULER, "fork" if fork else "no-fork"],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    pid, forked = map(int, parent.stdout.readline().split())
    # not our children: pidfds to wait on (the worker's is readable once it has exited)
    worker, child = os.pidfd_open(pid), os.pidfd_open(forked) if forked > 0 else None
    exited = []
    try:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=60)
        exited = select.select([worker], [], [], 120)[0]
    finally:
        if child is not None:
            signal.pidfd_send_signal(child, signal.SIGKILL)
            os.close(child)
        if not exited:
            signal.pidfd_send_signal(worker, signal.SIGKILL)  # leave no stray process behind a failure
        os.close(worker)
    return bool(exited), pid


def test_the_fit_worker_dies_with_its_scheduler_process():
    """A scheduler SIGKILLed (OOM killer, a node drain) leaves no fit worker behind."""
    exited, pid = _worker_exits_when_its_scheduler_is_killed(fork=False)
    assert exited, f"fit worker {pid} outlived its parent by 120 s"


def test_the_fit_worker_dies_with_its_scheduler_even_when_a_fork_of_it_holds_the_socket():
    """A process the scheduler forked after starting the worker holds a copy of the worker's socket,
    so the worker never reads EOF when the scheduler is SIGKILLed; it notices being reparented."""
    exited, pid = _worker_exits_when_its_scheduler_is_killed(fork=True)
    assert exited, f"fit worker {pid} outlived its parent by 120 s while a fork held its socket"


@pytest.mark.parametrize("config_sent", [True, False])
def test_a_worker_whose_scheduler_died_before_it_started_exits(config_sent):
    """The scheduler may be SIGKILLed before its child has run a line (a loaded host, a nice-10 child):
    the child then already has its new parent, so it must compare with the pid it was given, not
    with whatever parent it first sees; and it may die before sending the config, which the child
    must not wait for forever either. Here that pid is a process that has exited; the child's
    socket stays open, so only the parent check can end it."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(60)
    ours, theirs = socket.socketpair()
    child = subprocess.Popen([sys.executable, "-m", "sglang_dspark.sglang_plugin.fitter", str(theirs.fileno()),
                              str(gone.pid)], pass_fds=(theirs.fileno(),), env={**os.environ, "HF_HUB_OFFLINE": "1"})
    theirs.close()
    conn = Connection(ours.detach())
    try:
        if config_sent:
            conn.send_bytes(pickle.dumps(("config", {}, None)))
        child.wait(120)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait(30)
        pytest.fail(f"fit worker {child.pid} kept running 120 s after the process that started it had exited")
    finally:
        conn.close()
    assert child.returncode == 0
