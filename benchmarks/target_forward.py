"""Median latency of TargetModel.forward_segments vs transformers eager, SmolLM2-135M shapes, random weights.

Every case has 200 tokens of context per request and times one forward over the new tokens (all
logits), the shapes of decode (x1) and speculative verify (x n). Both sides run in the same process
with the same weights and thread count. A third column runs our model with PyTorch's default
row-major [out, in] Linear weights instead of the input-major CPU layout (engine/weight_layout.py),
and a first table times the single GEMMs of one layer and the lm_head in both layouts.
Usage (from the repo root): PYTHONPATH=. python benchmarks/target_forward.py [--threads 2]
"""

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"

import torch
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig

from sglang_dspark.engine.target_model import Segment, TargetModel
from sglang_dspark.engine.weight_layout import input_major

CTX = 200
CASES = [(1, n) for n in (1, 2, 4, 8, 16, 32, 64)] + [(4, 1), (4, 8), (16, 1), (16, 8)]  # (requests, new tokens)
SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rms_norm_eps=1e-5,
                    rope_theta=100000.0, tie_word_embeddings=True)


def timed_interleaved(fns: dict, reps: int, warmup: int = 2) -> dict:
    """Median and min ms per fn; the fns alternate call by call so load from other processes hits all alike."""
    times = {k: [] for k in fns}
    for i in range(warmup + reps):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            if i >= warmup:
                times[k].append((time.perf_counter() - t0) * 1e3)
    return {k: (statistics.median(v), min(v)) for k, v in times.items()}


GEMM_SHAPES = {"qkv_proj": (576, 960), "gate_up_proj": (576, 3072), "down_proj": (1536, 576), "lm_head": (576, 49152)}
GEMM_ROWS = (1, 4, 8, 16, 32, 64)


def gemm_rows(reps: int) -> list[dict]:
    """F.linear at M rows with the weight row-major vs input-major (same values)."""
    rows = []
    print(f"{'gemm':>12} {'M':>3} {'row-major ms':>12} {'input-major ms':>14} {'ratio':>6}")
    for name, (k, n) in GEMM_SHAPES.items():
        w = torch.randn(n, k)
        packed = input_major(w)
        for m in GEMM_ROWS:
            x = torch.randn(m, k)
            t = timed_interleaved({"row": lambda: torch.nn.functional.linear(x, w),
                                   "input": lambda: torch.nn.functional.linear(x, packed)}, reps * 5)
            row, inp = t["row"][0], t["input"][0]
            rows.append(dict(gemm=name, m=m, k=k, n=n, row_major_ms=round(row, 4), input_major_ms=round(inp, 4),
                             ratio=round(row / inp, 2)))
            print(f"{name:>12} {m:3d} {row:12.3f} {inp:14.3f} {row / inp:5.2f}x", flush=True)
    return rows


def row_major_copy(model: TargetModel) -> TargetModel:
    """The same model with PyTorch's default contiguous [out, in] Linear weights."""
    import copy

    other = copy.deepcopy(model)
    for m in other.modules():
        if isinstance(m, torch.nn.Linear):
            m.weight = torch.nn.Parameter(m.weight.data.contiguous(), requires_grad=False)
    return other


def ours_step(model, R, n, scattered=False):
    cache = model.new_kv_cache(R, CTX + 64)
    slots = list(range(R))[::-1] if scattered else list(range(R))  # reversed: forces the gather path
    g = torch.Generator().manual_seed(0)
    model.forward_segments([Segment(s, 0, torch.randint(0, 49152, (CTX,), generator=g)) for s in slots], cache)
    new = [Segment(s, CTX, torch.randint(0, 49152, (n,), generator=g)) for s in slots]
    return lambda: model.forward_segments(new, cache)  # rewrites the same positions: rollback is free


def hf_step(hf, R, n):
    g = torch.Generator().manual_seed(0)
    cache = DynamicCache(config=hf.config)
    with torch.no_grad():
        hf(torch.randint(0, 49152, (R, CTX), generator=g), past_key_values=cache, use_cache=True)
    new = torch.randint(0, 49152, (R, n), generator=g)

    def step():
        with torch.no_grad():
            hf(new, past_key_values=cache, use_cache=True)
        cache.crop(-n)

    return step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "target_forward.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = LlamaConfig(**SMOLLM2_135M)
    hf = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    model = TargetModel.from_hf_model(hf)
    row_major = row_major_copy(model)
    gemms = gemm_rows(args.reps)

    rows = []
    print(f"{'R x new':>9} {'tokens':>6} {'ours ms':>8} {'scattered':>9} {'row-major':>9} {'hf eager ms':>11} {'speedup':>7}   (min: ours / hf)")
    for R, n in CASES:
        fns = {"ours": ours_step(model, R, n), "hf": hf_step(hf, R, n), "row_major": ours_step(row_major, R, n)}
        if R > 1:
            fns["scattered"] = ours_step(model, R, n, scattered=True)
        t = timed_interleaved(fns, args.reps)
        (ours, ours_min), (ref, ref_min) = t["ours"], t["hf"]
        scat = t["scattered"][0] if R > 1 else None
        rm = t["row_major"][0]
        rows.append(dict(requests=R, new_tokens=n, context=CTX, ours_ms=round(ours, 2), hf_eager_ms=round(ref, 2),
                         ours_row_major_ms=round(rm, 2), layout_speedup=round(rm / ours, 2),
                         speedup=round(ref / ours, 2), ours_scattered_slots_ms=None if scat is None else round(scat, 2),
                         ours_min_ms=round(ours_min, 2), hf_eager_min_ms=round(ref_min, 2)))
        sc = f"{scat:9.1f}" if scat is not None else f"{'-':>9}"
        print(f"{f'{R} x {n}':>9} {R * n:6d} {ours:8.1f} {sc} {rm:9.1f} {ref:11.1f} {ref / ours:6.2f}x   ({ours_min:.1f} / {ref_min:.1f})",
              flush=True)

    result = dict(
        model="random-weight LlamaConfig with SmolLM2-135M shapes", dtype="float32", threads=args.threads,
        reps=args.reps, statistic="median (and min) ms of one forward, all logits; ours and hf calls interleaved", torch=torch.__version__,
        cpu=platform.processor() or platform.machine(), gemms=gemms, rows=rows,
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
