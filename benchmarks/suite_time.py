"""The fast suite's wall time, this tree against an older commit, side by side in one run.

    python benchmarks/suite_time.py --old-dir /tmp/old [--old c484664] [--repeats 2]

`--old-dir` is a clone at the older commit (made there with `git clone` + checkout when missing;
its `./dev.sh test` creates its own .venv on first use, minutes from pip's cache). Each repeat runs
`./dev.sh test` in this tree, then in the old one, so host drift between hours hits both; the
table gives each run's pytest summary and the new / old ratio per repeat, with medians, and the
JSON goes to benchmarks/results/suite_time.json.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks/results/suite_time.json"
SUMMARY = re.compile(r"(\d+) passed.* in ([0-9.]+)s")


def prepare(old_dir: Path, ref: str) -> str:
    if not old_dir.exists():
        subprocess.run(["git", "clone", "-q", str(ROOT), str(old_dir)], check=True)
    subprocess.run(["git", "-C", str(old_dir), "checkout", "-q", ref], check=True)
    return subprocess.run(["git", "-C", str(old_dir), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()


def run_suite(tree: Path, timeout: float) -> dict:
    """One `./dev.sh test` (setup first, untimed, so an install is not counted)."""
    subprocess.run(["./dev.sh", "setup"], cwd=tree, check=True, capture_output=True)
    start = time.monotonic()
    done = subprocess.run(["./dev.sh", "test"], cwd=tree, capture_output=True, text=True, timeout=timeout)
    wall = time.monotonic() - start
    lines = [line for line in done.stdout.splitlines() if SUMMARY.search(line)]
    if done.returncode != 0 or not lines:
        sys.exit(f"error: ./dev.sh test failed in {tree} (rc {done.returncode}): {done.stdout[-1500:]}")
    passed, pytest_s = SUMMARY.search(lines[-1]).groups()
    return {"wall_s": round(wall, 1), "pytest_s": float(pytest_s), "passed": int(passed), "summary": lines[-1]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old-dir", type=Path, required=True, help="a clone at the older commit (made when missing)")
    p.add_argument("--old", default="c484664",
                   help="the older commit (default c484664: the tree whose 3:21 issue 22 names)")
    p.add_argument("--repeats", type=int, default=2, help="new/old pairs to run (default 2)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per suite run")
    p.add_argument("--out", type=Path, default=OUT, help="JSON output path")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats: must be >= 1")
    old_rev = prepare(args.old_dir, args.old)
    new_rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
    pairs = []
    for i in range(args.repeats):
        new = run_suite(ROOT, args.timeout)
        old = run_suite(args.old_dir, args.timeout)
        pairs.append({"new": new, "old": old, "ratio": round(new["wall_s"] / old["wall_s"], 3)})
        print(f"repeat {i + 1}: new {new['wall_s']:.1f} s ({new['passed']} passed), "
              f"old {old['wall_s']:.1f} s ({old['passed']} passed)", flush=True)
    print(f"\n| repeat | new ({new_rev}) wall s | old ({old_rev}) wall s | new / old |")
    print("|---|---|---|---|")
    for i, pair in enumerate(pairs, 1):
        print(f"| {i} | {pair['new']['wall_s']:.1f} | {pair['old']['wall_s']:.1f} | {pair['ratio']:.3f} |")
    median = {k: statistics.median(pair[k]["wall_s"] for pair in pairs) for k in ("new", "old")}
    ratio = statistics.median(pair["ratio"] for pair in pairs)
    print(f"| median | {median['new']:.1f} | {median['old']:.1f} | {ratio:.3f} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "new": new_rev,
                                    "old": old_rev, "pairs": pairs, "median_wall_s": median,
                                    "median_ratio": ratio}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
