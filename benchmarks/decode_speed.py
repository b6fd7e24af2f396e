"""Decode speed of the reference engine: target-only vs DSpark full verify vs DSpark scheduled.

For each concurrency C, every mode serves the same 2*C held-out chat prompts (code, chat, math)
with at most C running at once; modes run back to back inside each concurrency so machine noise
hits them alike, `--repeats` times interleaved, the order rotating each time (the median run is
reported, and the median over repeats of scheduled / best baseline within a repeat). Reports output
tokens/s (completion tokens over wall time from first submit to last finish) and tau (tokens
emitted per request per decode step, bonus included).

    python benchmarks/decode_speed.py [--concurrency 1,4,16] [--max-tokens 96] [--repeats 3]
        [--profile sla_profiles/smollm2-135m-instruct-cpu.yaml] [--out benchmarks/results/decode_speed.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import threading
import time
from pathlib import Path

import torch
from model_pair import add_common_args, heldout_prompts, load_pair
MODES = ("target", "full", "scheduled")


def run_mode(engine, prompts: list[list[int]], params, concurrency: int) -> dict:
    done = threading.Event()
    lock = threading.Lock()
    state = {"left": len(prompts), "tokens": 0}

    def callback(out):
        if out.finished:
            with lock:
                state["tokens"] += out.completion_tokens
                state["left"] -= 1
                if state["left"] == 0:
                    done.set()

    engine.records.clear()
    engine.start()
    start = time.perf_counter()
    for ids in prompts:
        engine.submit(ids, params, callback)
    done.wait(timeout=3600)
    wall = time.perf_counter() - start
    engine.shutdown()
    records = list(engine.records)
    emitted = sum(r.bs + r.accepted_drafts for r in records)
    errors = [abs(r.predicted_step_ms - r.step_ms) / r.step_ms for r in records if r.predicted_step_ms]
    return {
        "predicted_step_time_median_abs_rel_error": round(statistics.median(errors), 4) if errors else None,
        "output_tok_s": round(state["tokens"] / wall, 2),
        "tau": round(emitted / max(1, sum(r.bs for r in records)), 3),
        "wall_s": round(wall, 2),
        "completion_tokens": state["tokens"],
        "mean_verify_tokens_per_step": round(sum(r.num_verify_tokens for r in records) / max(1, len(records)), 2),
        "steps": len(records),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser, "decode_speed")
    parser.add_argument("--concurrency", default="1,4,16", help="comma-separated concurrency levels")
    parser.add_argument("--max-tokens", type=int, default=96, help="completion tokens per request")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0 = greedy)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs of every mode; the median is reported")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)

    from sglang_dspark.engine.engine import Engine, EngineConfig
    from sglang_dspark.engine.sampling import SamplingParams
    from sglang_dspark.profiles import SlaProfile

    target, tokenizer, drafter = load_pair(args.model, args.draft)
    profile = SlaProfile.load(args.profile)

    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=None)
    rows = []
    for concurrency in [int(c) for c in args.concurrency.split(",")]:
        prompts = heldout_prompts(tokenizer, 2 * concurrency)
        row = {"concurrency": concurrency, "requests": len(prompts)}
        runs = {mode: [] for mode in MODES}
        for rep in range(args.repeats):  # interleaved and rotated, so host drift hits every mode alike
            for mode in MODES[rep % 3:] + MODES[: rep % 3]:
                engine = Engine(
                    target, tokenizer, drafter if mode != "target" else None,
                    config=EngineConfig(mode=mode, max_running=concurrency, max_len=1024),
                    sps=profile.sps_table() if mode == "scheduled" else None,
                    sts_temperatures=profile.sts_temperatures(), model_name=args.model,
                )
                runs[mode].append(run_mode(engine, prompts, params, concurrency))
                print(f"  C={concurrency:<3} {mode:<9} run {rep + 1}: {runs[mode][-1]['output_tok_s']:>8.2f} tok/s  "
                      f"tau {runs[mode][-1]['tau']:.2f}", flush=True)
        for mode in MODES:  # the run with the median speed stands for the mode; all runs are kept
            ordered = sorted(runs[mode], key=lambda r: r["output_tok_s"])
            row[mode] = {**ordered[len(ordered) // 2], "runs_output_tok_s": [r["output_tok_s"] for r in runs[mode]]}
        best_baseline = max(row["target"]["output_tok_s"], row["full"]["output_tok_s"])
        row["dspark_vs_target"] = round(row["full"]["output_tok_s"] / row["target"]["output_tok_s"], 3)
        row["scheduled_vs_best_baseline"] = round(row["scheduled"]["output_tok_s"] / best_baseline, 3)
        per_rep = [runs["scheduled"][i]["output_tok_s"] / max(runs["target"][i]["output_tok_s"], runs["full"][i]["output_tok_s"])
                   for i in range(args.repeats)]
        row["scheduled_vs_best_per_repeat"] = [round(x, 3) for x in per_rep]
        row["scheduled_vs_best_median_of_repeats"] = round(statistics.median(per_rep), 3)
        rows.append(row)

    print(f"\n{'C':>3} {'target tok/s':>13} {'full tok/s':>11} {'sched tok/s':>12} {'tau full':>9} {'tau sched':>10} "
          f"{'full/target':>12} {'sched/best':>11} {'per-repeat median':>18}")
    for r in rows:
        print(f"{r['concurrency']:>3} {r['target']['output_tok_s']:>13.2f} {r['full']['output_tok_s']:>11.2f} "
              f"{r['scheduled']['output_tok_s']:>12.2f} {r['full']['tau']:>9.2f} {r['scheduled']['tau']:>10.2f} "
              f"{r['dspark_vs_target']:>12.3f} {r['scheduled_vs_best_baseline']:>11.3f} "
              f"{r['scheduled_vs_best_median_of_repeats']:>18.3f}")
    result = {
        "benchmark": "decode_speed",
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "torch_threads": args.threads},
        "model": args.model, "draft": args.draft, "profile": args.profile,
        "max_tokens": args.max_tokens, "temperature": args.temperature, "repeats": args.repeats,
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
