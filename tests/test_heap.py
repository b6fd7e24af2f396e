"""Freed heap memory goes back to the OS: after loading (weights cast from float32, `auto`'s timing
copies) and whenever the serving engine falls idle after work (a long prompt's attention scores).
benchmarks/serve_memory.py measures what this saves on the served SmolLM2."""

from __future__ import annotations

import os
import threading

import pytest
import torch
from engine_fixtures import tiny_engine

import sglang_dspark.engine.async_engine as async_engine
from sglang_dspark.engine import heap
from sglang_dspark.engine.sampling import SamplingParams

PAGE = os.sysconf("SC_PAGE_SIZE")


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


@pytest.mark.skipif(heap._malloc_trim() is None, reason="no malloc_trim in this C library (not glibc)")
def test_freed_small_tensors_are_returned_to_the_os():
    # 64 KiB tensors: below glibc's mmap threshold (128 KiB at least), so they live in malloc's
    # arena, as a model's per-layer weights and activations do once the threshold has grown; a
    # later one, still held, pins the arena's top, so free() cannot shrink it
    tensors = [torch.ones(16 * 1024) for _ in range(6400)]
    held = [torch.ones(16 * 1024)]
    before_free = _resident_bytes()
    del tensors
    after_free = _resident_bytes()
    assert heap.release_freed_memory()
    after_trim = _resident_bytes()
    assert before_free - after_free < 100 * 2**20  # free() alone keeps most of the 400 MiB
    assert after_free - after_trim > 300 * 2**20, (before_free, after_free, after_trim)
    assert float(held[0][0]) == 1.0


def test_the_engine_thread_trims_once_each_time_it_falls_idle(monkeypatch):
    calls: list[int] = []
    trimmed = threading.Event()

    def fake_release() -> bool:
        calls.append(1)
        trimmed.set()
        return True

    monkeypatch.setattr(async_engine, "release_freed_memory", fake_release)
    monkeypatch.setattr(async_engine, "IDLE_WAIT_S", 0.01)
    engine = async_engine.AsyncEngine(tiny_engine("target", max_running=2))
    engine.start()
    try:
        for round_ in range(2):
            trimmed.clear()
            done = threading.Event()
            engine.submit([5, 6, 7], SamplingParams(max_tokens=4, temperature=0.0),
                          lambda out: out.finished and done.set())
            assert done.wait(60) and trimmed.wait(60)
            # idle from here on: no further trim until work arrives again
            assert engine.call(lambda e: e.idle).result(60)
            assert len(calls) == round_ + 1
    finally:
        engine.shutdown()
    assert len(calls) == 2
