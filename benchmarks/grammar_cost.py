"""What a JSON schema costs: output tok/s of the reference engine with and without
`response_format: json_schema`, target-only and DSpark verifying every draft, and the grammar's own
time per decode step.

Arms: `target/free`, `target/json`, `full/free`, `full/json` (mode / format). Every arm serves the
same C held-out chat prompts at once (each asked to answer as JSON, so the free arms write similar
text; a json answer may close before --max-tokens), on a fresh engine per run, after one untimed
warm-up request per arm; the json arms carry the same compiled schema
(xgrammar, compiled once up front as the server's cache would hold it). Arms run back to back inside
each repeat in a carry-over balanced order (`common.balanced_order`), so host drift hits them alike.

Reported per concurrency: each arm's median output tok/s (completion tokens over wall time), the
median over repeats of the per-repeat ratio json/free within each mode and full/target within each
format, and for the json arms the grammar's time: per mask (`GrammarState.mask`: xgrammar's bitmask
fill and its unpacking to a bool row) and per decode step (every matcher call: masks, accepts,
rollbacks), with its share of the run's wall time (the table's `mask ms` is the full/json arm's; the
JSON holds both modes'). The timing wraps the methods, so it adds two clock reads per call, to the
json arms only; the masking of the logits themselves (engine/grammar.py's `masked`) is outside it.

    python benchmarks/grammar_cost.py [--concurrency 1,8] [--max-tokens 32] [--repeats 3]

(minutes, most of them in the verify-all arms; benchmarks/RESULTS_LOG.md has how long it took)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from common import add_common_args, balanced_order, heldout_prompts, load_pair, serve_all

MODES = ("target", "full")
FORMATS = ("free", "json")
# a list of short strings: long enough to measure decoding, bounded so every answer can close
SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 40},
    "points": {"type": "array", "items": {"type": "string", "maxLength": 80}, "minItems": 2, "maxItems": 6}},
    "required": ["title", "points"], "additionalProperties": False}
ASK = ' Answer only with JSON: {"title": ..., "points": [...]}.'


class GrammarClock:
    """Wall time and calls of GrammarState's matcher methods, while installed."""

    METHODS = ("mask", "accept", "rollback")

    def __init__(self):
        from sglang_dspark.engine.grammar import GrammarState

        self.cls, self.originals = GrammarState, {m: getattr(GrammarState, m) for m in self.METHODS}
        self.reset()

    def reset(self) -> None:
        self.seconds = dict.fromkeys(self.METHODS, 0.0)
        self.calls = dict.fromkeys(self.METHODS, 0)

    def __enter__(self):
        def timed(name, original):
            def wrapper(*args, **kwargs):
                start = time.perf_counter()
                try:
                    return original(*args, **kwargs)
                finally:
                    self.seconds[name] += time.perf_counter() - start
                    self.calls[name] += 1
            return wrapper

        for name, original in self.originals.items():
            setattr(self.cls, name, timed(name, original))
        return self

    def __exit__(self, *exc) -> None:
        for name, original in self.originals.items():
            setattr(self.cls, name, original)


def run_arm(pair, mode: str, concurrency: int, prompts, params, clock: GrammarClock | None) -> dict:
    from sglang_dspark.engine.engine import Engine, EngineConfig

    target, tokenizer, drafter = pair
    engine = Engine(target, tokenizer, drafter if mode != "target" else None,
                    config=EngineConfig(mode=mode, max_running=concurrency, max_len=1024), model_name="grammar_cost")
    if clock is not None:
        clock.reset()
    run = serve_all(engine, prompts, params)
    records = run.records
    steps = len(records)
    out = {
        "output_tok_s": round(run.completion_tokens / run.wall_s, 2),
        "wall_s": round(run.wall_s, 3),
        "completion_tokens": run.completion_tokens,
        "steps": steps,
        "tau": round(sum(r.bs + r.accepted_drafts for r in records) / max(1, sum(r.bs for r in records)), 3),
    }
    if clock is not None:
        total = sum(clock.seconds.values())
        out.update({
            "masks": clock.calls["mask"],
            "mask_ms": round(1e3 * clock.seconds["mask"] / max(1, clock.calls["mask"]), 4),
            "masks_per_step": round(clock.calls["mask"] / max(1, steps), 2),
            "grammar_ms_per_step": round(1e3 * total / max(1, steps), 3),
            "grammar_share_of_wall": round(total / run.wall_s, 4),
        })
    return out


def median_ratio(a: list[dict], b: list[dict]) -> float:
    """Median over repeats of a's tok/s over b's in the same repeat."""
    return round(statistics.median(x["output_tok_s"] / y["output_tok_s"] for x, y in zip(a, b)), 3)


def summarize(row: dict, runs: dict[str, list[dict]]) -> dict:
    for arm, arm_runs in runs.items():  # the median-speed run stands for the arm; all speeds kept
        ordered = sorted(arm_runs, key=lambda r: r["output_tok_s"])
        row[arm] = {**ordered[len(ordered) // 2], "runs_output_tok_s": [r["output_tok_s"] for r in arm_runs]}
    for mode in MODES:
        row[f"{mode}_json_vs_free"] = median_ratio(runs[f"{mode}/json"], runs[f"{mode}/free"])
    for fmt in FORMATS:
        row[f"{fmt}_full_vs_target"] = median_ratio(runs[f"full/{fmt}"], runs[f"target/{fmt}"])
    for mode in MODES:
        json_runs = runs[f"{mode}/json"]
        for key in ("mask_ms", "grammar_ms_per_step", "masks_per_step", "grammar_share_of_wall"):
            row[f"{mode}_json_{key}_median"] = round(statistics.median(r[key] for r in json_runs), 4)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser, "grammar_cost")
    parser.add_argument("--concurrency", default="1,8", help="comma-separated concurrency levels")
    parser.add_argument("--max-tokens", type=int, default=32, help="completion tokens per request (at most)")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0 = greedy)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs of every arm; medians reported")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)

    from sglang_dspark.engine.grammar import GrammarCompiler, GrammarSpec
    from sglang_dspark.engine.sampling import SamplingParams
    from sglang_dspark.prompts import chat_ids, load_prompts

    pair = load_pair(args.model, args.draft, args.dtype)
    tokenizer = pair[1]
    print(f"weight format: {pair[0].weight_format}", flush=True)
    start = time.perf_counter()
    compiler = GrammarCompiler.for_tokenizer(tokenizer)
    compiled = compiler.compile(GrammarSpec("json_schema", json.dumps(SCHEMA)))
    compile_s = time.perf_counter() - start  # tokenizer info and this schema: paid once per server and schema
    print(f"grammar: tokenizer info + schema compiled in {compile_s:.2f} s (not in any arm's time)", flush=True)
    params = {"free": SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=0),
              "json": SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=0,
                                     grammar=compiled)}
    records = load_prompts("builtin:heldout")
    arms = [f"{m}/{f}" for m in MODES for f in FORMATS]
    rows = []
    clock = GrammarClock()
    warm = [chat_ids(tokenizer, records[0].prompt + ASK)]
    for arm in arms:  # first calls (torch kernels, the matcher) are paid outside every timed run
        mode, fmt = arm.split("/")
        run_arm(pair, mode, 1, warm, dataclasses.replace(params[fmt], max_tokens=4), None)
    for concurrency in [int(c) for c in args.concurrency.split(",")]:
        prompts = [chat_ids(tokenizer, records[i % len(records)].prompt + ASK) for i in range(concurrency)]
        row = {"concurrency": concurrency, "requests": len(prompts)}
        runs = {arm: [] for arm in arms}
        for rep in range(args.repeats):  # interleaved, carry-over balanced
            for arm in balanced_order(arms, rep):
                mode, fmt = arm.split("/")
                if fmt == "json":
                    with clock:
                        result = run_arm(pair, mode, concurrency, prompts, params[fmt], clock)
                else:
                    result = run_arm(pair, mode, concurrency, prompts, params[fmt], None)
                runs[arm].append(result)
                extra = (f"  mask {result['mask_ms']:.3f} ms  grammar {result['grammar_ms_per_step']:.2f} ms/step"
                         if fmt == "json" else "")
                print(f"  C={concurrency:<3} {arm:<12} run {rep + 1}: {result['output_tok_s']:>8.2f} tok/s  "
                      f"tau {result['tau']:.2f}  tokens {result['completion_tokens']:>4}{extra}", flush=True)
        rows.append(summarize(row, runs))

    print(f"\n{'C':>3} " + " ".join(f"{arm + ' tok/s':>17}" for arm in arms)
          + f" {'json/free tgt':>13} {'json/free full':>14} {'full/tgt free':>13} {'full/tgt json':>13}"
          + f" {'mask ms':>8} {'grammar ms/step tgt':>19} {'full':>6}  (medians; ratios per repeat)")
    for r in rows:
        print(f"{r['concurrency']:>3} " + " ".join(f"{r[arm]['output_tok_s']:>17.2f}" for arm in arms)
              + f" {r['target_json_vs_free']:>13.3f} {r['full_json_vs_free']:>14.3f}"
              + f" {r['free_full_vs_target']:>13.3f} {r['json_full_vs_target']:>13.3f}"
              + f" {r['full_json_mask_ms_median']:>8.3f} {r['target_json_grammar_ms_per_step_median']:>19.2f}"
              + f" {r['full_json_grammar_ms_per_step_median']:>6.2f}")
    result = {
        "benchmark": "grammar_cost",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "processor": _cpu_name(),
                    "torch_threads": args.threads},
        "model": args.model, "draft": args.draft, "weight_format": pair[0].weight_format,
        "schema": SCHEMA, "prompt_suffix": ASK, "compile_s": round(compile_s, 3),
        "max_tokens": args.max_tokens, "temperature": args.temperature, "repeats": args.repeats, "arms": arms,
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    main()
