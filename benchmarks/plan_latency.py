"""Planner latency: ours against SGLang 0.5.23's `compute_verify_token_budget`, same process.

Both compute the step's verify budget from a survival matrix [R, G] and a jagged SPS table; ours
also hands out the per-request lengths (upstream needs a second call for that, not timed here).
Prints a table of medians and writes benchmarks/results/plan_latency.json.

    python benchmarks/plan_latency.py [--repeats 2000] [--out benchmarks/results/plan_latency.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from sglang_dspark.core.schedule import plan_verify_lens
from sglang_dspark.core.sps import SpsTable


def median_us(fn, repeats: int) -> float:
    for _ in range(min(50, repeats)):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


def jagged_table(max_tokens: int) -> SpsTable:
    g = torch.Generator().manual_seed(0)
    b = torch.arange(1, max_tokens + 1)
    sps = 1.0 / (0.02 + 0.0004 * b + 0.004 * (b % 16 != 0) * torch.rand(max_tokens, generator=g))
    return SpsTable.from_points(b.tolist(), sps.tolist())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2000, help="timed calls per cell (median reported)")
    parser.add_argument("--gamma", type=int, default=7, help="draft block size G")
    parser.add_argument("--out", default="benchmarks/results/plan_latency.json", help="JSON output path")
    args = parser.parse_args()

    from sglang.srt.speculative.dspark_components.dspark_planner import (
        DSparkScheduleConfig,
        compute_verify_token_budget,
    )
    from sglang.srt.speculative.dspark_components.dspark_sps import SpsCostTable as UpstreamTable

    rows = []
    for R in (1, 16, 64, 256):
        table = jagged_table(R * (args.gamma + 1))
        upstream_table = UpstreamTable.from_json(table.to_json())
        conf = torch.rand(R, args.gamma, generator=torch.Generator().manual_seed(R))
        survival = torch.cumprod(conf, dim=1)
        cfg = DSparkScheduleConfig(gamma=args.gamma)
        upstream = lambda: compute_verify_token_budget(history_survival_probs=survival, sps_table=upstream_table, cfg=cfg)  # noqa: E731
        ours = lambda: plan_verify_lens(conf, table, early_stop=False)  # noqa: E731
        assert int(ours().sum()) == upstream().budget  # same answer before timing it
        # Interleave the two so machine noise hits both alike.
        ours_us, up_us = [], []
        for _ in range(5):
            ours_us.append(median_us(ours, args.repeats // 5))
            up_us.append(median_us(upstream, args.repeats // 5))
        o, u = statistics.median(ours_us), statistics.median(up_us)
        rows.append({"R": R, "gamma": args.gamma, "ours_us": round(o, 1), "upstream_us": round(u, 1), "ratio": round(o / u, 3)})

    print(f"{'R':>5} {'ours us':>9} {'sglang us':>10} {'ours/sglang':>12}")
    for row in rows:
        print(f"{row['R']:>5} {row['ours_us']:>9.1f} {row['upstream_us']:>10.1f} {row['ratio']:>12.3f}")
    result = {
        "benchmark": "plan_latency",
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "torch_threads": torch.get_num_threads()},
        "repeats": args.repeats,
        "rows": rows,
        "goal": "ours <= 0.5 x upstream at every R",
        "goal_met": all(r["ratio"] <= 0.5 for r in rows),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
