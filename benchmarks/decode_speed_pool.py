"""Pool several decode_speed runs: per launch path (the table source, e.g. `seeded+online`) and
concurrency, every repeat's ratio of the scheduled arm to target-only in the same repeat, with their
median, mean and standard error. One run of 4-5 repeats on a shared host moves by several percent;
the pool says what the runs agree on.

    python benchmarks/decode_speed_pool.py benchmarks/results/decode_speed_a.json ... [--out POOL.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from decode_speed import SCHEDULED  # the arms a run may hold besides target and full


def pool(paths: list[str]) -> dict[tuple[str, int], list[float]]:
    ratios: dict[tuple[str, int], list[float]] = {}
    for path in paths:
        run = json.loads(Path(path).read_text())
        sources = run.get("sources") or {"default": run["default_source"]}
        for row in run["rows"]:
            target = row["target"]["runs_output_tok_s"]
            for arm in (a for a in SCHEDULED if a in row):
                source = sources.get(arm, arm)
                ratios.setdefault((source, row["concurrency"]), []).extend(
                    a / t for a, t in zip(row[arm]["runs_output_tok_s"], target))
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="decode_speed JSON files")
    parser.add_argument("--out", default="benchmarks/results/decode_speed_pool.json", help="JSON output path")
    args = parser.parse_args()
    rows = []
    print(f"{'path':<16} {'C':>3} {'repeats':>8} {'median':>7} {'mean':>7} {'1 SE':>6}  (scheduled / target-only, same repeat)")
    for (source, concurrency), values in sorted(pool(args.runs).items()):
        se = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else float("nan")
        row = {"path": source, "concurrency": concurrency, "repeats": len(values),
               "median": round(statistics.median(values), 3), "mean": round(statistics.mean(values), 3),
               "se": round(se, 3), "ratios": [round(v, 3) for v in values]}
        rows.append(row)
        print(f"{source:<16} {concurrency:>3} {len(values):>8} {row['median']:>7.3f} {row['mean']:>7.3f} {se:>6.3f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"benchmark": "decode_speed_pool", "runs": args.runs, "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
