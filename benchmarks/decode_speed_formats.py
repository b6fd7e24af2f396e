"""Decode speed and time to first token of the reference engine in several weight formats, side by
side in one run: the float32 engine against the new default, each arm the way `launch` runs it.

For each concurrency C, every (format, arm) serves the same 2*C held-out chat prompts with at most C
running (`decode_speed.run_mode` on a fresh engine: `decode_speed.engine_for`, so `default` is the
scheduled engine on the table `launch` picks here for that format). Repeats alternate the format
order and balance the arm order, so host drift hits every cell alike. Reported: median output tok/s
per cell; per repeat the ratio of each format's target-only speed to the first format's, and of
`default` to target-only within a format, with their medians. Time to first token: one request
with a `--ttft-tokens` prompt, target-only, per format, interleaved, median of the repeats.

    python benchmarks/decode_speed_formats.py [--formats float32,bfloat16] [--concurrency 1,4,16]
        [--arms target,default] [--repeats 3] [--max-tokens 96] [--ttft-tokens 1024]
        [--profile A.yaml,B.yaml]   (per format, the one whose fingerprint matches, as launch picks)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import torch
from common import add_common_args, balanced_order, heldout_prompts, load_pair, serve_all
from decode_speed import engine_for, profile_hardware, run_mode


def ttft_ms(pair, prompt_ids: list[int], model: str) -> float:
    from sglang_dspark.engine.engine import Engine, EngineConfig
    from sglang_dspark.engine.sampling import SamplingParams

    target, tokenizer, _ = pair
    engine = Engine(target, tokenizer, None, config=EngineConfig(mode="target", max_running=1,
                                                                 max_len=len(prompt_ids) + 8), model_name=model)
    run = serve_all(engine, [prompt_ids], SamplingParams(max_tokens=1, temperature=0.0))
    return run.ttfts()[0] * 1e3


def ratios(a: list[float], b: list[float]) -> list[float]:
    return [round(x / y, 3) for x, y in zip(a, b)]


def table_for(fmt: str, args):
    """The profile `launch` would take for `fmt` among `--profile`'s comma-separated files: one whose
    fingerprint matches (its format included), else the first as a seed of the online table."""
    from sglang_dspark import zoo
    from sglang_dspark.profile.resolve import resolve_profile

    candidates = [resolve_profile(path, engine="reference", model=zoo.resolve_model(args.model), draft=args.draft,
                                  seed_ok=True, weight_format=fmt.partition("+")[0]) for path in args.profile.split(",") if path]
    return next((c for c in candidates if not c.seed_only), candidates[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser, "decode_speed_formats")
    parser.add_argument("--formats", default="float32,bfloat16",
                        help="weight formats; the first is the baseline (int4+aten, int8+aten: without the CPU row kernels)")
    parser.add_argument("--concurrency", default="1,4,16", help="comma-separated concurrency levels")
    parser.add_argument("--arms", default="target,default", help="of decode_speed's arms (target first)")
    parser.add_argument("--max-tokens", type=int, default=96, help="completion tokens per request")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs of every cell")
    parser.add_argument("--ttft-tokens", type=int, default=1024, help="prompt length of the TTFT probe (0: skip)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    from sglang_dspark.engine.sampling import SamplingParams

    formats = [f for f in args.formats.split(",") if f]
    arms = tuple(a for a in args.arms.split(",") if a)
    if arms[0] != "target":
        raise SystemExit("--arms: target first (the ratios are against it)")
    pairs = {fmt: load_pair(args.model, args.draft, fmt) for fmt in formats}
    profiles = {fmt: {"default": table_for(fmt, args)} for fmt in formats}
    for fmt in formats:
        p = profiles[fmt]["default"]
        print(f"{fmt}: default table {'seeded+online' if p.seed_only else 'profile+online'} from {p.path}", flush=True)
    tokenizer = pairs[formats[0]][1]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    rows = []
    for concurrency in [int(c) for c in args.concurrency.split(",")]:
        prompts = heldout_prompts(tokenizer, 2 * concurrency)
        speed = {(f, a): [] for f in formats for a in arms}
        details = {(f, a): [] for f in formats for a in arms}
        for rep in range(args.repeats):
            for fmt in (formats if rep % 2 == 0 else formats[::-1]):
                for arm in balanced_order(arms, rep):
                    engine = engine_for(arm, pairs[fmt], profiles[fmt], concurrency, args.model)
                    result = run_mode(engine, prompts, params)
                    speed[(fmt, arm)].append(result["output_tok_s"])
                    details[(fmt, arm)].append(result)
                    print(f"  C={concurrency:<3} {fmt:<9} {arm:<8} run {rep + 1}: {result['output_tok_s']:>7.2f} tok/s "
                          f"tau {result['tau']:.2f} drafted steps {result['drafted_steps']:>3} plain step "
                          f"{result['plain_step_ms_median'] or 0:.1f} ms", flush=True)
        row = {"concurrency": concurrency, "requests": len(prompts), "cells": {}}
        for fmt in formats:
            for arm in arms:
                row["cells"][f"{fmt}/{arm}"] = {"median_tok_s": round(statistics.median(speed[(fmt, arm)]), 2),
                                                 "runs": details[(fmt, arm)]}
            per_rep = ratios(speed[(fmt, "target")], speed[(formats[0], "target")])
            row[f"{fmt}_target_vs_{formats[0]}_target"] = {"per_repeat": per_rep, "median": statistics.median(per_rep)}
            for arm in arms[1:]:
                per_rep = ratios(speed[(fmt, arm)], speed[(fmt, "target")])
                row[f"{fmt}_{arm}_vs_target"] = {"per_repeat": per_rep, "median": statistics.median(per_rep)}
        rows.append(row)

    ttft = {}
    if args.ttft_tokens:
        ids = [t for p in heldout_prompts(tokenizer, 64) for t in p][: args.ttft_tokens]
        samples = {fmt: [] for fmt in formats}
        for rep in range(args.repeats):
            for fmt in (formats if rep % 2 == 0 else formats[::-1]):
                samples[fmt].append(ttft_ms(pairs[fmt], ids, args.model))
        ttft = {fmt: {"median_ms": round(statistics.median(v), 1), "runs_ms": [round(x, 1) for x in v]}
                for fmt, v in samples.items()}

    print(f"\n{'C':>3} " + " ".join(f"{f + '/' + a:>18}" for f in formats for a in arms)
          + " " + " ".join(f"{f + ' tgt/' + formats[0]:>20}" for f in formats[1:])
          + " " + " ".join(f"{f + ' ' + a + '/tgt':>20}" for f in formats for a in arms[1:]) + "  (tok/s; medians of per-repeat ratios)")
    for r in rows:
        print(f"{r['concurrency']:>3} " + " ".join(f"{r['cells'][f + '/' + a]['median_tok_s']:>18.2f}" for f in formats for a in arms)
              + " " + " ".join(f"{r[f + '_target_vs_' + formats[0] + '_target']['median']:>20.3f}" for f in formats[1:])
              + " " + " ".join(f"{r[f + '_' + a + '_vs_target']['median']:>20.3f}" for f in formats for a in arms[1:]))
    for fmt, t in ttft.items():
        print(f"TTFT, {args.ttft_tokens}-token prompt, {fmt}: {t['median_ms']:.0f} ms (runs {t['runs_ms']})")
    result = {"benchmark": "decode_speed_formats", "hardware": profile_hardware(), "threads": args.threads,
              "model": args.model, "draft": args.draft, "profile": args.profile, "formats": formats, "arms": list(arms),
              "max_tokens": args.max_tokens, "repeats": args.repeats, "rows": rows,
              "ttft_tokens": args.ttft_tokens, "ttft": ttft}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
