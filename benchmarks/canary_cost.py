"""What the correctness canary costs in throughput: the reference engine (scheduled, its SPS table
learned online from no profile) under a closed-loop load of C users with spare KV slots, at canary shares 0 (off), 1 % (the
default), 10 % and 100 % (every greedy request); arms interleaved, the order rotating each repeat.

Each user sends its next greedy request as soon as the previous one finished, for `--duration`
seconds per run; replays run only in free slots with nobody waiting, so they cost through the bigger
batches they make. Reported per arm: user output tok/s (the median run), replays and mismatches, and
the median over repeats of each arm's ratio to canary-off within the repeat.

    python benchmarks/canary_cost.py [--users 4] [--max-running 8] [--duration 60] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from pathlib import Path

import torch
from common import add_common_args, heldout_prompts, load_pair

SHARES = (0.0, 0.01, 0.1, 1.0)  # off, the default, a stress, every greedy request


def closed_loop(engine, prompts: list[list[int]], params, users: int, duration_s: float) -> dict:
    """`users` clients, each submitting its next prompt when the last finished, until `duration_s`."""
    from sglang_dspark.engine.async_engine import AsyncEngine

    client = AsyncEngine(engine)
    lock, stop, all_done = threading.Lock(), threading.Event(), threading.Event()
    state = {"tokens": 0, "requests": 0, "in_flight": 0, "next": 0}

    def submit() -> None:
        with lock:
            ids = prompts[state["next"] % len(prompts)]
            state["next"] += 1
            state["in_flight"] += 1
        client.submit(ids, params, callback)

    def callback(out) -> None:  # engine thread
        if not out.finished:
            return
        with lock:
            state["tokens"] += out.completion_tokens
            state["requests"] += 1
            state["in_flight"] -= 1
            last = state["in_flight"] == 0
        if not stop.is_set():
            submit()
        elif last:
            all_done.set()

    client.start()
    start = time.perf_counter()
    for _ in range(users):
        submit()
    time.sleep(duration_s)
    stop.set()
    if not all_done.wait(timeout=600):
        raise RuntimeError("requests still running 600 s after the run ended")
    wall = time.perf_counter() - start
    client.shutdown()
    return {"user_tok_s": state["tokens"] / wall, "requests": state["requests"], "wall_s": wall,
            "replays": engine.canary.replays, "mismatches": engine.canary.mismatches}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser, "canary_cost")
    parser.add_argument("--users", type=int, default=4, help="concurrent closed-loop users")
    parser.add_argument("--max-running", type=int, default=8, help="KV slots (more than --users: spare capacity)")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load per run")
    parser.add_argument("--max-tokens", type=int, default=64, help="completion tokens per request")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs of every arm")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    from sglang_dspark.engine.engine import Engine, EngineConfig
    from sglang_dspark.engine.sampling import SamplingParams

    target, tokenizer, drafter = load_pair(args.model, args.draft)
    prompts = heldout_prompts(tokenizer, 64)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    runs = {share: [] for share in SHARES}
    for rep in range(args.repeats):
        for share in SHARES[rep % len(SHARES):] + SHARES[: rep % len(SHARES)]:
            engine = Engine(target, tokenizer, drafter, model_name=args.model,
                            config=EngineConfig(mode="scheduled", max_running=args.max_running, max_len=1024,
                                                canary_share=share))
            runs[share].append(closed_loop(engine, prompts, params, args.users, args.duration))
            r = runs[share][-1]
            print(f"  share {share:<5} run {rep + 1}: {r['user_tok_s']:7.2f} tok/s, {r['requests']} requests, "
                  f"{r['replays']} replays, {r['mismatches']} mismatches", flush=True)
    rows = []
    print(f"\n{'share':>6} {'user tok/s':>11} {'vs off':>8} {'replays':>8} {'mismatches':>11}   (vs off: median of per-repeat ratios)")
    for share in SHARES:
        ratio = statistics.median(a["user_tok_s"] / b["user_tok_s"] for a, b in zip(runs[share], runs[0.0]))
        median_run = sorted(runs[share], key=lambda r: r["user_tok_s"])[len(runs[share]) // 2]
        rows.append({"share": share, **median_run, "vs_off": round(ratio, 3),
                     "runs_user_tok_s": [round(r["user_tok_s"], 2) for r in runs[share]],
                     "replays_total": sum(r["replays"] for r in runs[share]),
                     "mismatches_total": sum(r["mismatches"] for r in runs[share])})
        print(f"{share:>6} {median_run['user_tok_s']:>11.2f} {ratio:>8.3f} {rows[-1]['replays_total']:>8} "
              f"{rows[-1]['mismatches_total']:>11}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"benchmark": "canary_cost", "users": args.users,
                                          "max_running": args.max_running, "duration_s": args.duration,
                                          "max_tokens": args.max_tokens, "repeats": args.repeats, "rows": rows},
                                         indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
