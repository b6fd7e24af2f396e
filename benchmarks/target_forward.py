"""Whole-model steps of the real target in every weight format: what a decode (B = R tokens) and a
speculative verify (B = R x (1 + drafts) tokens) cost, and how much of it is not GEMM.

Each case runs `TargetModel.forward_segments` of SmolLM2-135M (30 distinct layers plus the lm_head,
so the weights stream from memory as in a served step; a one-layer loop would keep them in cache)
over R requests with 200 tokens of context. Beside it, the same step's Linear layers alone (every
weight of the model once, at the step's row count): the GEMM time; the rest (attention, norms,
RoPE, masks, Python) is the step minus that. Formats and cases alternate call by call, so load from
other processes hits all alike; medians of `--reps`.

    python benchmarks/target_forward.py [--formats float32,bfloat16,int8,int4] [--reps 9] [--threads 2]

A format named with `+aten` (`int4+aten`) is built without the engine's CPU row kernels
(engine/cpu/cpu_rows.py): aten's int4 kernel and one SDPA call per row, as where those do not run.

Writes benchmarks/results/target_forward.json and .png (step ms against B, one line per format and R).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from common import ROOT, load_target_format, timed

from sglang_dspark.engine.cpu.names import WEIGHT_FORMATS

CTX = 200
CASES = [(1, b) for b in (1, 2, 3, 4, 6, 8, 12, 16)] + [(4, b) for b in (1, 2, 3, 4)]  # (R, tokens per request)


def step_fn(model, R: int, n: int, context: int = CTX):
    from sglang_dspark.engine.target_model import Segment

    cache = model.new_kv_cache(R, context + 32)
    g = torch.Generator().manual_seed(0)
    model.forward_segments([Segment(r, 0, torch.randint(0, 49152, (context,), generator=g)) for r in range(R)], cache,
                           logits_for="last")
    new = [Segment(r, context, torch.randint(0, 49152, (n,), generator=g)) for r in range(R)]
    return lambda: model.forward_segments(new, cache)  # rewrites the same positions: rollback is free


def gemm_fn(model, rows: int):
    """Every Linear of the model once at `rows` rows: the step's GEMM work, weights streaming."""
    linears = [m for m in model.modules() if hasattr(m, "in_features") and hasattr(m, "out_features")]
    dtype = model.dtype
    xs = {m.in_features: torch.randn(rows, m.in_features, dtype=dtype) for m in linears}

    def run():
        with torch.inference_mode():
            for m in linears:
                m(xs[m.in_features])
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct", help="target directory or zoo name")
    ap.add_argument("--formats", default=",".join(WEIGHT_FORMATS), help="weight formats (engine/cpu/formats.py)")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    ap.add_argument("--reps", type=int, default=9, help="timed calls per case and format")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/target_forward.json", help="JSON output")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from sglang_dspark import zoo
    from sglang_dspark.engine.cpu.one_row_gemv import tune_one_row_kernels
    from sglang_dspark.engine.cpu.weight_layout import tune_layouts
    from sglang_dspark.profile.fingerprint import hardware_id

    path = zoo.resolve_model(args.model)
    formats = [f for f in args.formats.split(",") if f]
    models = {fmt: load_target_format(path, fmt) for fmt in formats}
    for model in models.values():  # the kernels the engine's loader times on this host (engine/factory.py)
        tune_layouts([model])
        tune_one_row_kernels([model])
    rows = []
    print(f"{'R':>2} {'B':>3} " + " ".join(f"{fmt + ' ms':>14} {'gemm':>6} {'other':>6}" for fmt in formats))
    for R, n in CASES:
        fns = {}
        for fmt, model in models.items():
            fns[(fmt, "step")] = step_fn(model, R, n)
            fns[(fmt, "gemm")] = gemm_fn(model, R * n)
        t = timed(fns, args.reps)
        row = {"requests": R, "batch_tokens": R * n, "context": CTX}
        for fmt in formats:
            step, gemm = t[(fmt, "step")], t[(fmt, "gemm")]
            row[fmt] = {"step_ms": round(step, 2), "gemm_ms": round(gemm, 2), "other_ms": round(step - gemm, 2)}
        rows.append(row)
        print(f"{R:>2} {R * n:>3} " + " ".join(
            f"{row[f]['step_ms']:>14.1f} {row[f]['gemm_ms']:>6.1f} {row[f]['other_ms']:>6.1f}" for f in formats), flush=True)
    for fmt in formats:  # the cost shape the scheduler sees: verify width against a plain step
        base = next(r[fmt]["step_ms"] for r in rows if r["requests"] == 1 and r["batch_tokens"] == 1)
        eight = next(r[fmt]["step_ms"] for r in rows if r["requests"] == 1 and r["batch_tokens"] == 8)
        print(f"{fmt}: B = 8 costs {eight / base:.2f}x B = 1 at R = 1")
    result = {"benchmark": "target_forward", "model": args.model, "hardware": hardware_id(), "threads": args.threads,
              "reps": args.reps, "torch": torch.__version__, "formats": formats,
              "statistic": "median ms; gemm = every Linear once at the step's rows; other = step - gemm", "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    plot(rows, formats, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


def plot(rows: list[dict], formats: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for fmt in formats:
        for R, style in ((1, "-o"), (4, "--s")):
            pts = [(r["batch_tokens"], r[fmt]["step_ms"]) for r in rows if r["requests"] == R]
            ax.plot(*zip(*pts), style, label=f"{fmt}, R = {R}")
    ax.set_xlabel("verify width B (tokens in the step)")
    ax.set_ylabel("step ms (median)")
    ax.set_title("SmolLM2-135M whole-model step, by weight format")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
