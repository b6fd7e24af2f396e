"""Whole-model steps of this working tree against another git revision's, side by side in one run.

A refactor must not move the engine's speed. `--base` is checked out as a detached git worktree, and
two worker processes load the same SmolLM2-135M target and shipped drafter in `--format` (int4 by
default: the served CPU format), one importing the base tree's package and benchmarks, one this
tree's. The driver asks them for one timed call at a time, alternating base / this call by call, so
host load hits both alike. The calls are a decode step (`TargetModel.forward_segments` of R requests
with B new tokens after `context` cached ones, as target_forward.py), a 200-token prompt (the path a
prefill takes: int4's bfloat16 copy) and a draft call (drafter_speed.py's greedy arm at R = 1, 16).

    python benchmarks/tree_ab.py [--base HEAD] [--reps 15] [--format int4] [--threads 2]

Prints a table (base ms, this tree's ms, ratio; medians) and writes benchmarks/results/tree_ab_<format>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, write_result

STEPS = [(1, 1, 200), (1, 4, 200), (1, 8, 200), (4, 1, 200), (4, 4, 200), (1, 1, 1000), (1, 8, 1000)]
DRAFTS = (1, 16)  # requests per draft call
# a pause before each call: an idle worker's OpenMP threads spin a while after its call returns, and
# would otherwise take the cores from the other tree's next call; the worker then makes one untimed
# call to wake its own threads before the timed one
SETTLE_S = 0.02

WORKER = r"""
import json, sys, time
tree = sys.argv[1]
# the venv's editable install points at the main checkout: drop its finder so `tree` is what imports
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path[:0] = [tree + "/benchmarks", tree]
import torch
torch.set_num_threads(int(sys.argv[3]))
import sglang_dspark
assert sglang_dspark.__file__.startswith(tree), sglang_dspark.__file__
from common import load_pair
from target_forward import step_fn
from drafter_speed import DRAFT, Bench
from sglang_dspark.engine.target_model import Segment
target, _, drafter = load_pair("smollm2-135m-instruct", str(DRAFT), sys.argv[2])
reps = int(sys.argv[4])

def prompt_fn():
    cache = target.new_kv_cache(1, 232)
    seg = [Segment(0, 0, torch.randint(0, 49152, (200,), generator=torch.Generator().manual_seed(1)))]
    try:  # the working tree says which Linear path a prompt takes; older trees set a context switch
        from sglang_dspark.engine.quantized_linear import prefill_weights
    except ImportError:
        return lambda: target.forward_segments(seg, cache, logits_for="last", prompt=True)
    def run():
        with prefill_weights():
            target.forward_segments(seg, cache, logits_for="last")
    return run

fns = {}
for line in sys.stdin:
    key = line.strip()
    if key not in fns:
        kind, *args = key.split(":")
        if kind == "step":
            fns[key] = step_fn(target, *map(int, args))
        elif kind == "prompt":
            fns[key] = prompt_fn()
        else:
            bench = Bench(drafter, int(args[0]), 300, staged=2, max_calls=2 * reps + 12)
            fns[key] = lambda bench=bench: bench.call("greedy_argmax")
    with torch.inference_mode():
        fns[key]()  # untimed: wakes this worker's threads and caches after the other tree's call
        t0 = time.perf_counter()
        fns[key]()
        ms = (time.perf_counter() - t0) * 1e3
    print(json.dumps({"ms": ms, "weight_format": target.weight_format}), flush=True)
"""


class Worker:
    """One tree's package in its own process, timing one named call per request."""

    def __init__(self, tree: Path, fmt: str, threads: int, reps: int):
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, str(tree), fmt, str(threads), str(reps)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=tree,
                                     env={**os.environ, "HF_HUB_OFFLINE": "1"})

    def time(self, key: str) -> dict:
        self.proc.stdin.write(key + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"worker for {key} exited with {self.proc.wait()}")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def median(xs: list[float]) -> float:
    s = sorted(xs)
    return (s[(len(s) - 1) // 2] + s[len(s) // 2]) / 2


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", default="HEAD", help="git revision to compare the working tree against")
    p.add_argument("--format", default="int4", help="weight format of both models (as launch --dtype)")
    p.add_argument("--reps", type=int, default=15, help="timed calls per case and tree (after 2 warm-up calls)")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads in each worker")
    p.add_argument("--only", nargs="*", choices=("step", "prompt", "draft"),
                   help="time only these kinds of call (default: all)")
    p.add_argument("--out", help="JSON path (default benchmarks/results/tree_ab_<format>.json)")
    args = p.parse_args()
    rev = subprocess.run(["git", "rev-parse", args.base], cwd=ROOT, capture_output=True, text=True)
    if rev.returncode != 0:
        print(f"error: --base {args.base}: not a git revision", file=sys.stderr)
        return 2
    base_tree = Path(tempfile.mkdtemp(prefix="tree_ab_")) / "base"
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(base_tree), rev.stdout.strip()], cwd=ROOT,
                   check=True)
    try:
        return run(args, rev.stdout.strip(), base_tree)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=ROOT)


def run(args, rev: str, base_tree: Path) -> int:
    keys = [f"step:{r}:{b}:{c}" for r, b, c in STEPS] + ["prompt:200"] + [f"draft:{r}" for r in DRAFTS]
    keys = [k for k in keys if not args.only or k.split(":")[0] in args.only]
    workers = {"base": Worker(base_tree, args.format, args.threads, args.reps),
               "this": Worker(ROOT, args.format, args.threads, args.reps)}
    times = {k: {"base": [], "this": []} for k in keys}
    formats = set()
    for key in keys:
        for i in range(2 + args.reps):
            for name in (("base", "this") if i % 2 == 0 else ("this", "base")):
                time.sleep(SETTLE_S)
                out = workers[name].time(key)
                formats.add(out["weight_format"])
                if i >= 2:
                    times[key][name].append(out["ms"])
    for w in workers.values():
        w.close()
    rows = [{"case": k, "base_ms": median(v["base"]), "this_ms": median(v["this"]),
             "ratio": median(v["this"]) / median(v["base"])} for k, v in times.items()]
    print(f"base {rev[:10]} vs working tree, weights {'/'.join(sorted(formats))}, medians of {args.reps}")
    print("| case | base ms | this tree ms | this / base |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['base_ms']:.2f} | {r['this_ms']:.2f} | {r['ratio']:.3f} |")
    ratios = [r["ratio"] for r in rows]
    print(f"median ratio {median(ratios):.3f}, range {min(ratios):.3f} - {max(ratios):.3f}")
    write_result(args.out or ROOT / "benchmarks" / "results" / f"tree_ab_{args.format}.json",
                 {"base": rev, "format": args.format, "reps": args.reps, "threads": args.threads,
                  "load_average_before": os.getloadavg()[0], "median_ratio": median(ratios), "cases": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
