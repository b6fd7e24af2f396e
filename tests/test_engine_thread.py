"""All of an engine's torch work on one thread: the server builds the engine on the thread that then
steps it (AsyncEngine.built_on_its_thread), and torch work before that (the weight format's timing)
runs on a helper thread (off_the_main_thread). On a 2-core Intel Xeon, decode steps on a thread
other than the one whose OpenMP pool ran first took 1.45x as long; here only which thread ran what
is checked, so nothing depends on this host."""

from __future__ import annotations

import threading

import pytest
from engine_fixtures import tiny_engine

from sglang_dspark.engine.async_engine import AsyncEngine, off_the_main_thread
from sglang_dspark.engine.sampling import SamplingParams


def test_the_engine_is_built_and_stepped_on_one_thread_that_is_not_the_callers():
    threads = {}

    def build():
        threads["build"] = threading.get_ident()
        engine = tiny_engine("scheduled", max_running=2)
        step = engine.step

        def traced_step():
            threads.setdefault("step", set()).add(threading.get_ident())
            step()
        engine.step = traced_step
        return engine

    client = AsyncEngine.built_on_its_thread(build)
    assert threads["build"] != threading.get_ident()
    assert "step" not in threads  # parked until start()
    done = threading.Event()
    outs = []
    client.start()
    try:
        client.submit([5, 6, 7], SamplingParams(max_tokens=4, temperature=0.0),
                      lambda out: (outs.append(out), out.finished and done.set()))
        assert done.wait(timeout=60)
        assert client.call(lambda engine: threading.get_ident()).result(timeout=10) == threads["build"]
    finally:
        client.shutdown()
    assert threads["step"] == {threads["build"]}
    assert outs[-1].finished and outs[-1].completion_tokens == 4
    assert not client.alive


def test_a_build_that_fails_raises_in_the_caller_and_leaves_no_thread():
    def build():
        raise ValueError("no such model")

    before = threading.active_count()
    with pytest.raises(ValueError, match="no such model"):
        AsyncEngine.built_on_its_thread(build)
    assert threading.active_count() == before


def test_an_engine_that_was_built_but_never_started_shuts_down():
    client = AsyncEngine.built_on_its_thread(lambda: tiny_engine("target", max_running=1))
    thread = client._thread
    client.shutdown(timeout=10)
    thread.join(timeout=10)
    assert not thread.is_alive()


def test_off_the_main_thread_returns_or_raises_what_fn_did():
    assert off_the_main_thread(threading.get_ident) != threading.get_ident()
    with pytest.raises(KeyError):
        off_the_main_thread(lambda: {}["x"])
