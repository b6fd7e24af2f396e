"""Repeatability of SPS capture: two profiles of the same engine, compared probe by probe.

For every (R, B) measured in both, the relative difference |a - b| / b of the median step time;
reports the median over probes (goal: within 10 %).

    python benchmarks/profile_repeatability.py FIRST.yaml SECOND.yaml [--out benchmarks/results/profile_repeatability.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from sglang_dspark.profile.schema import SlaProfile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", help="profile YAML")
    parser.add_argument("second", help="profile YAML of a second capture")
    parser.add_argument("--out", default="benchmarks/results/profile_repeatability.json", help="JSON output path")
    args = parser.parse_args()
    a, b = (SlaProfile.load(p) for p in (args.first, args.second))
    ms_a = {(m.num_requests, m.batch_tokens): m.median_ms for m in a.sps.measurements}
    ms_b = {(m.num_requests, m.batch_tokens): m.median_ms for m in b.sps.measurements}
    common = sorted(set(ms_a) & set(ms_b))
    diffs = [abs(ms_a[k] - ms_b[k]) / ms_b[k] for k in common]
    result = {
        "benchmark": "profile_repeatability", "first": args.first, "second": args.second,
        "common_probes": len(common), "median_rel_diff": round(statistics.median(diffs), 4),
        "p90_rel_diff": round(sorted(diffs)[int(0.9 * (len(diffs) - 1))], 4),
        "goal": "median relative difference <= 0.10", "goal_met": statistics.median(diffs) <= 0.10,
        "probes": [{"num_requests": k[0], "batch_tokens": k[1], "first_ms": ms_a[k], "second_ms": ms_b[k]} for k in common],
    }
    print(f"{len(common)} common probes: median |relative difference| {result['median_rel_diff']:.1%}, "
          f"p90 {result['p90_rel_diff']:.1%} (goal <= 10 %: {'met' if result['goal_met'] else 'NOT met'})")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
