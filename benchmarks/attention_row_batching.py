"""Would a verify block's rows stay bit-equal to their decodes if SDPA ran them as batch elements?

The reference engine computes one request's verify rows one SDPA call each (the call its decode
would make), which keeps speculative greedy output equal to plain decoding but costs a call per row
(`engine/target_model.py`, `_one_request_attention`). The cheaper form: the rows as batch elements
of one call, over a key length bucketed to `--bucket` with a float -inf mask hiding each row's
future keys, and every decode in the same bucketed, masked form. This checks, on this CPU's kernel,
whether each row of that call equals the one-row call its decode would make (its own bucket), bit
for bit, over contexts that cross bucket and kernel-block boundaries, at each thread count asked.
SmolLM2-135M's attention shapes (3 kv heads, 3 query heads each, head_dim 64).

    python benchmarks/attention_row_batching.py [--threads 1,2] [--dtypes bfloat16,float32] [--seeds 4]

Prints a table and writes benchmarks/results/attention_row_batching.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from common import ROOT

KV_HEADS, GROUP, HEAD_DIM, MAX_LEN = 3, 3, 64, 4096
FIRSTS = (5, 57, 60, 63, 64, 65, 120, 250, 300, 505, 508, 512, 513, 700, 1020, 1024, 1500, 2040)
ROWS = (1, 2, 4, 8, 16)


def masked(q, k, v, seen: list[int], keys: int, dtype) -> torch.Tensor:
    """SDPA of q [n, KVH, G, hd] as n batch elements over the first `keys` keys, row i seeing seen[i]."""
    mask = torch.zeros(len(seen), 1, 1, keys, dtype=dtype)
    for i, s in enumerate(seen):
        mask[i, ..., s:] = float("-inf")
    n = len(seen)
    return F.scaled_dot_product_attention(q, k[None, :, :keys].expand(n, -1, -1, -1),
                                          v[None, :, :keys].expand(n, -1, -1, -1), attn_mask=mask)


def check(dtype, threads: int, bucket: int, seeds: int) -> dict:
    torch.set_num_threads(threads)

    def bucketed(n: int) -> int:
        return min(-(-n // bucket) * bucket, MAX_LEN)

    rows = differ = 0
    examples = []
    for seed in range(seeds):
        gen = torch.Generator().manual_seed(seed)
        k = torch.randn(KV_HEADS, MAX_LEN, HEAD_DIM, generator=gen).to(dtype)
        v = torch.randn(KV_HEADS, MAX_LEN, HEAD_DIM, generator=gen).to(dtype)
        rows, differ = _compare(q_gen=gen, k=k, v=v, dtype=dtype, bucketed=bucketed, rows=rows, differ=differ,
                                examples=examples)
    return {"dtype": str(dtype).removeprefix("torch."), "threads": threads, "seeds": seeds, "rows": rows,
            "differ": differ, "examples": examples[:5]}


def _compare(q_gen, k, v, dtype, bucketed, rows: int, differ: int, examples: list) -> tuple[int, int]:
    for first in FIRSTS:
        for n in ROWS:
            q = torch.randn(n, KV_HEADS, GROUP, HEAD_DIM, generator=q_gen).to(dtype)
            seen = [first + i for i in range(n)]
            block = masked(q, k, v, seen, bucketed(seen[-1]), dtype)
            for i, s in enumerate(seen):
                alone = masked(q[i : i + 1], k, v, [s], bucketed(s), dtype)
                rows += 1
                if not torch.equal(block[i : i + 1], alone):
                    differ += 1
                    examples.append({"context": s, "rows": n, "row": i, "block_keys": bucketed(seen[-1]),
                                     "alone_keys": bucketed(s),
                                     "max_abs_difference": float((block[i] - alone[0]).abs().max())})
    return rows, differ


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", default="1,2", help="comma-separated torch intra-op thread counts")
    p.add_argument("--dtypes", default="bfloat16,float32", help="comma-separated activation dtypes")
    p.add_argument("--bucket", type=int, default=64, help="key lengths are rounded up to a multiple of this")
    p.add_argument("--seeds", type=int, default=4, help="random K/V caches and queries per cell")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "attention_row_batching.json"),
                   help="JSON output path")
    args = p.parse_args()
    results = []
    print("| dtype | threads | rows differing from their decode |")
    print("|---|---|---|")
    for name in args.dtypes.split(","):
        for threads in (int(t) for t in args.threads.split(",")):
            r = check(getattr(torch, name), threads, args.bucket, args.seeds)
            results.append(r)
            first = r["examples"][0] if r["examples"] else None
            where = f" (first: context {first['context']}, {first['rows']} rows)" if first else ""
            print(f"| {r['dtype']} | {threads} | {r['differ']} of {r['rows']}{where} |", flush=True)
    Path(args.out).write_text(json.dumps({"bucket": args.bucket, "torch": torch.__version__, "results": results},
                                         indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
