"""Resident memory of the served default engine: idle, after one long chat, and after waves of
concurrent chats, against the KV bytes those requests' positions need.

Starts `python -m sglang_dspark.launch --model MODEL` (the default launch: `--dtype auto`, the
shipped drafter, the model's whole context per slot) on loopback and reads the server process's
resident set (VmRSS, /proc) at each point:

- idle, once ready (each point is read once the server has been idle long enough for its
  resident set to settle: an idle engine gives its caches' pages and freed heap back);
- after one chat with a `--long-prompt`-token prompt;
- after each of `--waves` waves of `--wave-chats` chats, `--concurrency` at a time, with prompts
  of 10 to `--long-prompt` tokens and 8 to 128 new tokens (seeded, the same every run), with the
  largest resident set sampled while the wave ran.

Also reported: KV bytes per position (from the server's /server_info), and what the
positions resident in the caches need: while requests run, every slot keeps the pages its longest request reached,
so the KV part of the resident set during a wave is bounded by sum over slots of (longest prompt + new tokens
there) x bytes per position; the report gives that bound for the requests sent.

    python benchmarks/serve_memory.py [--model smollm2-135m-instruct] [--waves 3] [--wave-chats 48]
        [--concurrency 16] [--long-prompt 1500] [--dtype auto] [--out benchmarks/results/serve_memory.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
from sglang_dspark.testing.servers import free_port, start_reference_server, stop

from sglang_dspark.engine.async_engine import IDLE_RELEASE_S  # noqa: E402

WORDS = ("river stone quiet lamp orange window seven garden letter music silver ocean paper table "
         "morning forest candle bridge winter yellow engine market").split()


def resident_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def prompt_of(tokenizer, tokens: int, rng: random.Random) -> str:
    """User text of about `tokens` tokens under the model's tokenizer (the chat template adds a few)."""
    text = " ".join(rng.choice(WORDS) for _ in range(tokens))
    ids = tokenizer(text)["input_ids"][:tokens]
    return tokenizer.decode(ids)


def chat(base: str, model: str, content: str, max_tokens: int) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0}
    r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    return r.json()["usage"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="target directory or zoo name")
    parser.add_argument("--dtype", default="auto", help="launch --dtype")
    parser.add_argument("--waves", type=int, default=3, help="waves of concurrent chats")
    parser.add_argument("--wave-chats", type=int, default=48, help="chats per wave")
    parser.add_argument("--concurrency", type=int, default=16, help="chats in flight at once (also --max-running)")
    parser.add_argument("--long-prompt", type=int, default=1500, help="tokens of the long chat and the longest wave prompt")
    parser.add_argument("--seed", type=int, default=0, help="seed of the wave's prompt and output lengths")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/serve_memory.json"), help="JSON output path")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    from sglang_dspark import zoo

    # a SIGTERM (a timeout) unwinds through the finally below, so the server is stopped with us
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tokenizer = AutoTokenizer.from_pretrained(zoo.resolve_model(args.model))
    rng = random.Random(args.seed)
    port = free_port()
    proc = start_reference_server("--model", args.model, "--dtype", args.dtype,
                                  "--max-running", str(args.concurrency), port=port, timeout_s=600)
    base = f"http://127.0.0.1:{port}"
    points, slot_peak = [], [0] * args.concurrency
    try:
        info = httpx.get(f"{base}/server_info", timeout=30).json()
        model = httpx.get(f"{base}/v1/models", timeout=30).json()["data"][0]["id"]
        per_position = info["kv_cache_bytes"] / (info["max_running_requests"] * info["context_length"])

        def point(name: str, peak: float | None = None) -> None:
            # the server gives memory back once it has been idle IDLE_RELEASE_S: read it once that
            # has passed and the resident set stopped moving
            time.sleep(IDLE_RELEASE_S + 2.0)
            gib, deadline = resident_bytes(proc.pid) / 2**30, time.monotonic() + 10
            while time.monotonic() < deadline:
                time.sleep(0.5)
                now = resident_bytes(proc.pid) / 2**30
                if abs(now - gib) < 0.005:
                    break
                gib = now
            points.append({"point": name, "resident_gib": round(gib, 3),
                           "peak_during_gib": None if peak is None else round(peak, 3)})
            print(f"{name:<28} {gib:6.2f} GiB resident once idle"
                  + ("" if peak is None else f", {peak:.2f} GiB at most while it ran"), flush=True)

        def sampled_peak(stop: threading.Event, out: list[float]) -> None:
            while not stop.wait(0.2):
                out.append(resident_bytes(proc.pid) / 2**30)

        point("idle")
        usage = chat(base, model, prompt_of(tokenizer, args.long_prompt, rng), 32)
        slot_peak[0] = usage["prompt_tokens"] + usage["completion_tokens"]
        point(f"after one {args.long_prompt}-token chat")
        for wave in range(args.waves):
            jobs = [(prompt_of(tokenizer, rng.randint(10, args.long_prompt), rng), rng.randint(8, 128))
                    for _ in range(args.wave_chats)]
            stop_sampling, samples = threading.Event(), []
            sampler = threading.Thread(target=sampled_peak, args=(stop_sampling, samples))
            sampler.start()
            with ThreadPoolExecutor(args.concurrency) as pool:
                usages = list(pool.map(lambda job: chat(base, model, *job), jobs))
            stop_sampling.set()
            sampler.join()
            # which slot served which request is the server's business; the bound takes the longest
            # `concurrency` requests as each slot's longest
            lengths = sorted((u["prompt_tokens"] + u["completion_tokens"] for u in usages), reverse=True)
            slot_peak = sorted(max(a, b) for a, b in zip(sorted(slot_peak, reverse=True), lengths + [0] * len(slot_peak)))
            point(f"after wave {wave + 1} ({args.wave_chats} chats)", max(samples, default=None))
        kv_bound = sum(slot_peak) * per_position / 2**30
    finally:
        stop(proc)
    result = {"benchmark": "serve_memory", "model": args.model, "dtype": args.dtype, "concurrency": args.concurrency,
              "waves": args.waves, "wave_chats": args.wave_chats, "long_prompt": args.long_prompt,
              "kv_bytes_per_position": per_position, "points": points,
              "kv_resident_bound_gib": round(kv_bound, 3),
              "weight_format": (info.get("dspark_fingerprint") or {}).get("weight_format")}
    print(f"KV bytes per position (target + drafter): {per_position:.0f}; the positions the slots reached "
          f"need at most {kv_bound:.2f} GiB")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
