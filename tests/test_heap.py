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


def test_the_engine_thread_releases_memory_once_each_time_it_falls_idle(monkeypatch):
    calls: list[int] = []
    trimmed = threading.Event()
    inner = tiny_engine("target", max_running=2)
    release = inner.release_idle_memory

    def counted_release() -> bool:
        calls.append(1)
        done = release()
        trimmed.set()
        return done

    monkeypatch.setattr(inner, "release_idle_memory", counted_release)
    monkeypatch.setattr(async_engine, "IDLE_WAIT_S", 0.01)
    monkeypatch.setattr(async_engine, "IDLE_RELEASE_S", 0.05)
    engine = async_engine.AsyncEngine(inner)
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


@pytest.mark.parametrize("mode", ["target", "full"])
def test_an_idle_engine_gives_its_cache_pages_back_and_serves_the_same_after(mode):
    """The target's and the drafter's caches keep the pages the last requests wrote until the engine
    is idle; then they go back to the OS, and the next requests' greedy output is unchanged."""
    from engine_fixtures import run_to_completion

    engine = tiny_engine(mode, max_running=2)
    prompts = [[5, 6, 7, 8] * 20, [9, 10, 11]]
    params = [SamplingParams(max_tokens=12, temperature=0.0)] * 2
    first = run_to_completion(engine, prompts, params)
    kv = engine.runner.cache.kv
    draft = engine.runner.draft_cache
    caches = [kv] + ([draft.k, draft.v] if mode != "target" else [])
    assert all(float(c.abs().sum()) > 0 for c in caches)  # written, still committed
    engine.submit([5, 6], SamplingParams(max_tokens=50), lambda out: None)
    assert not engine.release_idle_memory()  # a request waits: nothing released
    engine.abort_all()
    assert engine.release_idle_memory()
    assert all(float(c.abs().sum()) == 0 for c in caches)  # dropped pages read as zeros
    if draft is not None:  # nor do staged features keep old steps' hidden states alive
        assert not any(draft._staged) and not any(draft.lengths)
    assert run_to_completion(engine, prompts, params) == first
