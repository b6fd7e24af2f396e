"""Latency of one DSparkDrafter.draft call (gamma tokens per request) on CPU.

    python benchmarks/drafter_speed.py [--draft DIR] [--context 200] [--threads 2]

Median of repeated calls at R = 1 and R = 16 requests, each with `--context` cached positions;
writes benchmarks/results/drafter_speed.json. The host's load average is recorded alongside,
because these machines are shared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from common import ROOT, load_pair

from sglang_dspark.drafter import DraftKVCache, greedy_sampler, temperature_sampler

DRAFT = ROOT / "launch" / "models" / "smollm2-135m-instruct-dspark"


def time_draft(drafter, num_requests: int, context: int, repeats: int, sampler) -> float:
    feat = len(drafter.config.target_layer_ids) * drafter.config.hidden_size
    cache = DraftKVCache(drafter, num_slots=num_requests, max_len=context + 16)
    for slot in range(num_requests):
        cache.append(slot, torch.arange(context), torch.randn(context, feat))
    slots = list(range(num_requests))
    anchors = torch.randint(0, drafter.config.vocab_size, (num_requests,))
    pos = torch.full((num_requests,), context)
    drafter.draft(cache, slots, anchors, pos, sampler=sampler)  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        drafter.draft(cache, slots, anchors, pos, sampler=sampler)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="smollm2-135m-instruct", help="target directory or zoo name")
    p.add_argument("--draft", default=str(DRAFT))
    p.add_argument("--context", type=int, default=200)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "drafter_speed.json"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    _, _, drafter = load_pair(args.target, args.draft)
    gen = torch.Generator().manual_seed(0)
    result = {"draft": args.draft, "context": args.context, "threads": args.threads,
              "gamma": drafter.gamma, "load_average_before": os.getloadavg()[0], "ms_per_draft_call": {}}
    for name, sampler in (("temperature_1", temperature_sampler(1.0, gen)), ("greedy", greedy_sampler)):
        for r in (1, 16):
            ms = time_draft(drafter, r, args.context, args.repeats, sampler)
            result["ms_per_draft_call"][f"{name}_R{r}"] = ms
            print(f"{name:>13} R={r:>2}: {ms:7.1f} ms per draft call ({drafter.gamma} tokens/request)")
    result["load_average_after"] = os.getloadavg()[0]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
