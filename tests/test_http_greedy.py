"""Over HTTP, greedy DSpark-scheduled completions equal target-only greedy completions token for
token, with 1 and 8 concurrent clients (tiny models, a real uvicorn server on loopback)."""

from concurrent.futures import ThreadPoolExecutor

import httpx
import torch
from engine_fixtures import VOCAB, TickClock, tiny_engine, tiny_hf_target
from loopback_server import serve_engine_on_loopback

from sglang_dspark.core.sps import SpsTable


def completions(base: str, prompts: list[list[int]], concurrency: int) -> list[list[int]]:
    def one(prompt):
        body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 32, "temperature": 0, "ignore_eos": True}}
        r = httpx.post(f"{base}/generate", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["output_ids"]

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, prompts))


def test_scheduled_greedy_equals_target_only_over_http():
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(4, VOCAB, (int(n),), generator=g).tolist() for n in torch.randint(2, 30, (20,), generator=g)]
    hf = tiny_hf_target()
    sps = SpsTable.from_points([1, 4, 8, 16, 32], [100.0, 95.0, 80.0, 60.0, 35.0], max_batch_tokens=64)
    results = {}
    for mode in ("target", "scheduled"):
        # a tick clock: the learned table sees the same step times on every machine, and drafts
        with serve_engine_on_loopback(tiny_engine(mode, hf=hf, sps=sps, max_running=8, clock=TickClock())) as (engine, base):
            for concurrency in (1, 8):
                results[mode, concurrency] = completions(base, prompts, concurrency)
        if mode == "scheduled":
            assert sum(r.accepted_drafts for r in engine.engine.records) > 0  # the thread has stopped
    reference = results["target", 1]
    assert all(len(out) == 32 for out in reference)
    for key, outputs in results.items():
        assert outputs == reference, key
