"""Whole-model steps on this tree's CPU row kernels against another revision's, side by side in one run.

`kernels/cpu_rows.cpp` as of git revision `--base` is built beside the working tree's under a
renamed op namespace, and one int4 SmolLM2-135M (30 distinct layers and the lm_head: weights stream
from memory as in a served step) runs `TargetModel.forward_segments` on either: its `row_kernels`
and every quantized Linear's ops swapped between the two builds call by call, alternating, so host
load hits both alike. Cases are target_forward.py's (R requests with 200 tokens of context, B tokens
in the step) plus the same at 1,000 tokens of context; then the parts alone: every Linear of the
model once at M rows (the GEMMs), and 30 layers of one request's attention rows; medians of `--reps`.

    python benchmarks/kernels_ab.py [--base HEAD] [--reps 15] [--threads 2]

Prints tables (base ms, this tree's ms, ratio) and writes benchmarks/results/kernels_ab.json.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from common import ROOT, load_target_format, timed, write_result

CASES = [(1, b, 200) for b in (1, 2, 4, 6, 8, 12, 16)] + [(4, b, 200) for b in (1, 2, 4)] + \
        [(1, b, 1000) for b in (1, 8)]  # (R, tokens per request, context)
GEMM_ROWS = (1, 4, 6, 7, 8, 16)
ATTENTION = [(rows, context) for context in (200, 1000) for rows in (1, 8)]


def build_base(rev: str):
    """torch.ops namespace of cpu_rows.cpp at `rev`, its library renamed so both builds load."""
    from torch.utils.cpp_extension import load

    from sglang_dspark.kernels import cpu_rows

    source = subprocess.run(["git", "show", f"{rev}:sglang_dspark/kernels/cpu_rows.cpp"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    renamed = re.sub(r"TORCH_LIBRARY(_IMPL)?\(dspark_cpu_rows\b", r"TORCH_LIBRARY\1(dspark_cpu_rows_base", source)
    if renamed == source:
        raise SystemExit(f"{rev}: cpu_rows.cpp registers no dspark_cpu_rows library")
    path = Path(tempfile.mkdtemp()) / "cpu_rows_base.cpp"
    path.write_text(renamed)
    digest = hashlib.sha256(renamed.encode()).hexdigest()[:12]  # one cached build per source, as cpu_rows.py
    load(name=f"sglang_dspark_cpu_rows_base_{digest}", sources=[str(path)],
         extra_cflags=cpu_rows.CFLAGS, extra_ldflags=["-fopenmp"], is_python_module=False)
    return torch.ops.dspark_cpu_rows_base


def use_ops(model, ops) -> None:
    """Point the model's attention/elementwise calls and its quantized Linear layers at `ops`."""
    model.row_kernels = ops
    for m in model.modules():
        if getattr(m, "_ops", None) is not None:
            m._ops = ops


def step_fn(model, ops, R: int, n: int, context: int):
    from sglang_dspark.engine.target_model import Segment

    cache = model.new_kv_cache(R, context + 32)
    g = torch.Generator().manual_seed(0)
    use_ops(model, ops)
    with torch.inference_mode():
        model.forward_segments([Segment(r, 0, torch.randint(0, 49152, (context,), generator=g)) for r in range(R)],
                               cache, logits_for="last")
    new = [Segment(r, context, torch.randint(0, 49152, (n,), generator=g)) for r in range(R)]

    def run():
        use_ops(model, ops)
        with torch.inference_mode():
            model.forward_segments(new, cache)  # rewrites the same positions: rollback is free
    return run


def gemm_fn(model, ops, rows: int):
    """Every quantized Linear of the model once at `rows` rows on `ops`."""
    layers = [m for m in model.modules() if getattr(m, "_ops", None) is not None]
    xs = {m.in_features: torch.randn(rows, m.in_features).bfloat16() for m in layers}

    def run():
        use_ops(model, ops)
        with torch.inference_mode():
            for m in layers:
                m(xs[m.in_features])
    return run


def attention_fn(model, ops, rows: int, context: int):
    """30 layers of one request's `rows` rows after `context` cached tokens on `ops`."""
    cfg = model.config
    H, KVH, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    g = torch.Generator().manual_seed(0)
    kv = [torch.randn(2, 1, KVH, context + rows, hd, generator=g).bfloat16() for _ in range(cfg.num_hidden_layers)]
    q = torch.randn(rows, H, hd, generator=g).bfloat16()
    slots, keys = torch.zeros(rows, dtype=torch.long), torch.arange(context + 1, context + rows + 1)
    return lambda: [ops.rows_attention(q, layer_kv, slots, keys, hd ** -0.5) for layer_kv in kv]


def compare(label: str, fns: dict, reps: int, meta: dict) -> dict:
    t = timed(fns, reps)
    row = {**meta, "base_ms": round(t["base"], 3), "this_ms": round(t["this"], 3), "ratio": round(t["this"] / t["base"], 3)}
    print(f"{label} {row['base_ms']:>8.2f} {row['this_ms']:>8.2f} {row['ratio']:>9.3f}", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct", help="target directory or zoo name")
    ap.add_argument("--base", default="HEAD", help="git revision whose cpu_rows.cpp is the baseline")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    ap.add_argument("--reps", type=int, default=15, help="timed calls per case and build")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/kernels_ab.json", help="JSON output")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from sglang_dspark import zoo
    from sglang_dspark.kernels import cpu_rows
    from sglang_dspark.profile.fingerprint import hardware_id

    ours = cpu_rows.ops()
    if ours is None:
        raise SystemExit(f"the row kernels do not run here: {cpu_rows.status()}")
    base = build_base(args.base)
    model = load_target_format(zoo.resolve_model(args.model), "int4")
    rows = []
    print(f"base: cpu_rows.cpp at {args.base}; int4 whole-model steps, median ms of {args.reps}")
    print(f"{'R':>2} {'B':>3} {'context':>7} {'base ms':>8} {'this ms':>8} {'this/base':>9}")
    for R, n, context in CASES:
        rows.append(compare(f"{R:>2} {R * n:>3} {context:>7}",
                            {"base": step_fn(model, base, R, n, context), "this": step_fn(model, ours, R, n, context)},
                            args.reps, {"requests": R, "batch_tokens": R * n, "context": context}))
    gemms, attention = [], []
    print(f"\nevery Linear once at M rows\n{'M':>3} {'base ms':>8} {'this ms':>8} {'this/base':>9}")
    for m in GEMM_ROWS:
        gemms.append(compare(f"{m:>3}", {"base": gemm_fn(model, base, m), "this": gemm_fn(model, ours, m)}, args.reps,
                             {"rows": m}))
    print(f"\n30 layers of attention rows\n{'rows':>4} {'context':>7} {'base ms':>8} {'this ms':>8} {'this/base':>9}")
    for n, context in ATTENTION:
        attention.append(compare(f"{n:>4} {context:>7}", {"base": attention_fn(model, base, n, context),
                                                           "this": attention_fn(model, ours, n, context)},
                                 args.reps, {"rows": n, "context": context}))
    for name in ("base", "this"):
        one = next(r[f"{name}_ms"] for r in rows if r["requests"] == 1 and r["batch_tokens"] == 1 and r["context"] == 200)
        eight = next(r[f"{name}_ms"] for r in rows if r["requests"] == 1 and r["batch_tokens"] == 8 and r["context"] == 200)
        print(f"{name}: B = 8 costs {eight / one:.2f}x B = 1 at R = 1")
    write_result(args.out, {"benchmark": "kernels_ab", "model": args.model, "base": args.base,
                            "base_commit": subprocess.run(["git", "rev-parse", args.base], cwd=ROOT, capture_output=True,
                                                          text=True).stdout.strip(),
                            "hardware": hardware_id(), "threads": args.threads, "reps": args.reps,
                            "torch": torch.__version__, "statistic": "median ms per step, builds alternating call by call",
                            "rows": rows, "gemm": gemms, "attention": attention})


if __name__ == "__main__":
    main()
