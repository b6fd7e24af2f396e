"""Whole-model steps on this tree's CPU row kernels against another revision's, side by side in one run.

`engine/cpu/cpu_rows.cpp` as of git revision `--base` is built beside the working tree's under a
renamed op namespace, and one int4 SmolLM2-135M (30 distinct layers and the lm_head: weights stream
from memory as in a served step) runs `TargetModel.forward_segments` on either: its `row_kernels`
and every quantized Linear's ops swapped between the two builds call by call, alternating, so host
load hits both alike. The timed calls are target_forward.py's (a step of R requests with 200 or 1,000
tokens of context and B new tokens; every Linear of the model once at M rows) and cpu_rows.py's (30
layers of one request's attention rows), each run on one build then the other; medians of `--reps`.

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
from cpu_rows import attention_fn
from target_forward import gemm_fn, step_fn

CASES = [(1, b, 200) for b in (1, 2, 4, 6, 8, 12, 16)] + [(4, b, 200) for b in (1, 2, 4)] + \
        [(1, b, 1000) for b in (1, 8)]  # (R, tokens per request, context)
GEMM_ROWS = (1, 4, 6, 7, 8, 16)
ATTENTION = [(rows, context) for context in (200, 1000) for rows in (1, 8)]


def build_base(rev: str):
    """torch.ops namespace of cpu_rows.cpp at `rev`, its library renamed so both builds load."""
    from torch.utils.cpp_extension import load

    from sglang_dspark.engine.cpu import cpu_rows

    source = None
    for path in ("sglang_dspark/engine/cpu/cpu_rows.cpp", "sglang_dspark/kernels/cpu_rows.cpp"):  # moved in 2026-12
        shown = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True)
        if shown.returncode == 0:
            source = shown.stdout
            break
    if source is None:
        raise SystemExit(f"{rev}: no cpu_rows.cpp in the engine's CPU wing or the old kernels/ folder")
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


def on_ops(model, ops, fn):
    """`fn` (a timed call of cpu_rows.py or target_forward.py) with the model pointed at `ops` first."""
    def run():
        use_ops(model, ops)
        with torch.inference_mode():
            fn()
    return run


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
    from sglang_dspark.engine.cpu import cpu_rows
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
                            {k: on_ops(model, ops, step_fn(model, R, n, context)) for k, ops in (("base", base), ("this", ours))},
                            args.reps, {"requests": R, "batch_tokens": R * n, "context": context}))
    gemms, attention = [], []
    print(f"\nevery Linear once at M rows\n{'M':>3} {'base ms':>8} {'this ms':>8} {'this/base':>9}")
    for m in GEMM_ROWS:
        gemms.append(compare(f"{m:>3}", {k: on_ops(model, ops, gemm_fn(model, m)) for k, ops in (("base", base), ("this", ours))},
                             args.reps, {"rows": m}))
    print(f"\n30 layers of attention rows\n{'rows':>4} {'context':>7} {'base ms':>8} {'this ms':>8} {'this/base':>9}")
    for n, context in ATTENTION:
        attention.append(compare(f"{n:>4} {context:>7}", {k: on_ops(model, ops, attention_fn(model, True, n, context))
                                                           for k, ops in (("base", base), ("this", ours))},
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
