"""int4's paths for a block of prompt rows, whole-model: the int4 kernel (what decode and verify rows
take) against oneDNN's bfloat16 GEMM over the same values (`Int4Linear.weight_bf16`, what prompt
chunks take, `Int4Linear.prompt_rows`), called once whatever the rows (`one call`, the engine's
way) or in calls of exactly 256 zero-padded rows (`fixed`, benchmarks/prefill_ways.py). Every
Linear of SmolLM2's 30 decoder layers once, at the engine's fused shapes (qkv, o, gate-up, down),
distinct weights (so they stream from memory as in a real step), random values; interleaved, the
fastest of `--reps` per path (a busy neighbour only adds time).

    python benchmarks/int4_prefill.py [--rows 1,8,32,64,256,1024] [--reps 3] [--threads 2]

Prints a table and writes benchmarks/results/int4_prefill.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch import nn

from common import ROOT

from prefill_ways import prefill_way

from sglang_dspark.engine.cpu import cpu_rows
from sglang_dspark.engine.cpu.quantized_linear import Int4Linear
from sglang_dspark.profile.fingerprint import hardware_id

# SmolLM2-135M's decoder Linear shapes (out, in) as TargetModel fuses them: qkv, o, gate-up, down
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
PATHS = ("kernel", "one call", "fixed")
LAYERS = 30


def model_layers(seed: int = 0) -> list[Int4Linear]:
    torch.manual_seed(seed)
    layers = []
    for _ in range(LAYERS):
        for out_f, in_f in SHAPES:
            linear = nn.Linear(in_f, out_f, bias=False)
            with torch.no_grad():
                linear.weight.normal_(0, 0.02)
            layers.append(Int4Linear(linear, cpu_rows.ops()))  # the engine's kernel where it runs
    return layers


def time_pass(layers: list[Int4Linear], x: dict[int, torch.Tensor], path: str) -> float:
    with prefill_way(layers, path):  # as prompt rows: each way decides its own path
        start = time.perf_counter()
        for layer in layers:
            layer.prompt_rows(x[layer.in_features])
        return time.perf_counter() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="1,8,32,64,256,1024", help="comma-separated row counts of one call")
    p.add_argument("--reps", type=int, default=3, help="interleaved timings per path and row count; the fastest is kept")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/int4_prefill.json"), help="JSON output path")
    args = p.parse_args()
    try:
        rows = [int(r) for r in args.rows.split(",") if r]
    except ValueError:
        p.error(f"--rows: comma-separated integers, got {args.rows!r}")
    if not rows or min(rows) < 1 or args.reps < 1:
        p.error("--rows must be >= 1 and --reps >= 1")
    torch.set_num_threads(args.threads)
    layers = model_layers()
    results = []
    print(f"{'rows':>6} {'int4 kernel ms':>15} {'copy, one call ms':>18} {'copy, fixed ms':>15} {'fixed / one call':>17}")
    for m in rows:
        x = {k: torch.randn(m, k, dtype=torch.bfloat16) for k in {s[1] for s in SHAPES}}
        times = {path: [] for path in PATHS}
        for i in range(args.reps + 1):
            for path in PATHS:
                seconds = time_pass(layers, x, path)
                if i:  # the first round warms them up
                    times[path].append(seconds)
        ms = {path: min(t) * 1e3 for path, t in times.items()}
        results.append({"rows": m, **{f"{path.replace(' ', '_')}_ms": round(v, 2) for path, v in ms.items()},
                        "fixed_over_one_call": round(ms["fixed"] / ms["one call"], 3)})
        print(f"{m:>6} {ms['kernel']:>15.1f} {ms['one call']:>18.1f} {ms['fixed']:>15.1f} "
              f"{ms['fixed'] / ms['one call']:>17.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "int4_prefill", "threads": args.threads, "layers": LAYERS,
                               "shapes": SHAPES, "reps": args.reps, "host": hardware_id(),
                               "results": results}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
