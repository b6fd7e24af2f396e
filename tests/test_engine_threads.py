"""The engine thread's OS name and its OpenMP team, as /server_info reports them (engine/threads.py)."""

import sys
import threading

import pytest
import torch

from sglang_dspark.engine.threads import ENGINE_THREAD, native_threads, set_engine_threads

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names are read from /proc")


def on_a_thread(fn):
    """fn() on a short-lived thread, torch's thread count restored after (conftest sets it)."""
    out, before = [], torch.get_num_threads()
    worker = threading.Thread(target=lambda: out.append(fn()))
    worker.start()
    worker.join()
    torch.set_num_threads(before)
    return out[0]


def test_the_engine_thread_and_the_workers_it_starts_carry_its_name():
    def run():
        threads = set_engine_threads(2)
        torch.randn(256, 256) @ torch.randn(256, 256)  # a parallel op: the thread's OpenMP team starts
        return threads, threads.report(), native_threads()[threading.get_native_id()][0]

    threads, report, own_name = on_a_thread(run)
    assert own_name == ENGINE_THREAD
    assert threads.set_by == "--threads 2"
    assert report["torch_threads"] == 2
    # the engine thread and its worker (ATen may build without OpenMP: then the thread alone)
    assert report["engine_team_native_threads"] in (1, 2)
    assert report["worker_waits"] >= 0


def test_without_the_flag_the_report_says_what_decided(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert on_a_thread(lambda: set_engine_threads(None)).set_by == "OMP_NUM_THREADS=3"
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    assert on_a_thread(lambda: set_engine_threads(None)).set_by.startswith("torch's default for the ")
