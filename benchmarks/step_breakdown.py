"""Where a decode step's time goes, plain and drafted: GEMM against everything else, and the
drafter's share, from torch's profiler over whole engine steps of the served model pair.

    python benchmarks/step_breakdown.py [--dtype auto] [--concurrency 1] [--steps 20] [--repeats 3]

Arms: `target` (plain steps) and `full` (every step drafts gamma tokens and verifies them all: the
most a drafted step can cost). Per repeat and arm, one greedy request set decodes; after a warm-up
`--steps` steps are profiled, each draft marked as a range of its own. A table of medians over the repeats
(ms per step: total, GEMM, the rest; ms per draft: total, GEMM) and the drafted / plain ratio goes
to stdout, the JSON to benchmarks/results/step_breakdown.json. The profiler adds a little to every
op, more to the small ones, so the "rest" columns are an upper bound; ratios within one run count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from common import add_common_args, heldout_prompts

GEMM_OPS = ("aten::mm", "aten::addmm", "aten::_weight_int8pack_mm", "aten::_weight_int4pack_mm_for_cpu", "aten::bmm",
            "dspark_cpu_rows::q4_rows_mm", "dspark_cpu_rows::q8_rows_mm")
WARMUP_STEPS = 4
DRAFT_RANGE = "dspark::draft"


def _split(events) -> tuple[float, float]:
    """(total, GEMM) self CPU milliseconds of a profiler's key averages."""
    total = sum(e.self_cpu_time_total for e in events) / 1e3
    gemm = sum(e.self_cpu_time_total for e in events if e.key in GEMM_OPS) / 1e3
    return total, gemm


def _descendants(event):
    for child in event.cpu_children:
        yield child
        yield from _descendants(child)


def measure(engine, prompts, steps: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from sglang_dspark.engine.sampling import SamplingParams

    runner_draft = engine.runner.draft

    def marked_draft(*args, **kwargs):
        with torch.profiler.record_function(DRAFT_RANGE):
            return runner_draft(*args, **kwargs)

    for ids in prompts:
        engine.submit(ids, SamplingParams(max_tokens=WARMUP_STEPS + steps + 8, temperature=0, ignore_eos=True),
                      lambda out: None)
    for _ in range(WARMUP_STEPS):
        engine.step()
    engine.runner.draft = marked_draft
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            for _ in range(steps):
                engine.step()
            wall = (time.perf_counter() - start) / steps * 1e3
    finally:
        engine.runner.draft = runner_draft
    while not engine.idle:
        engine.step()
    total, gemm = _split(prof.key_averages())
    row = {"wall_ms": wall, "total_ms": total / steps, "gemm_ms": gemm / steps, "rest_ms": (total - gemm) / steps}
    drafts = [e for e in prof.events() if e.name == DRAFT_RANGE]
    if drafts:  # each draft's own time, and the GEMMs under it
        row["draft_ms"] = statistics.median(e.cpu_time_total / 1e3 for e in drafts)
        row["draft_gemm_ms"] = statistics.median(
            sum(d.self_cpu_time_total for d in _descendants(e) if d.name in GEMM_OPS) / 1e3 for e in drafts)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(p, "step_breakdown")
    p.add_argument("--concurrency", type=int, default=1, help="requests decoding together (default 1)")
    p.add_argument("--steps", type=int, default=20, help="profiled steps per arm and repeat (default 20)")
    p.add_argument("--repeats", type=int, default=3, help="repeats, arms alternating (default 3)")
    args = p.parse_args(argv)
    if args.steps < 1 or args.repeats < 1 or args.concurrency < 1:
        p.error("--steps, --repeats and --concurrency must be >= 1")
    import torch

    from sglang_dspark import zoo
    from sglang_dspark.engine.engine import EngineConfig
    from sglang_dspark.engine.factory import build_engine

    torch.set_num_threads(args.threads)
    model = zoo.resolve_model(args.model)
    engines = {mode: build_engine(model, args.draft if mode != "target" else None, weight_format=args.dtype,
                                  config=EngineConfig(mode=mode, max_running=max(4, args.concurrency), seed=0))
               for mode in ("target", "full")}
    prompts = heldout_prompts(engines["target"].tokenizer, args.concurrency)
    rows = {mode: [] for mode in engines}
    for repeat in range(args.repeats):
        for mode in (("target", "full") if repeat % 2 == 0 else ("full", "target")):
            rows[mode].append(measure(engines[mode], prompts, args.steps))
            print(f"repeat {repeat + 1} {mode}: {rows[mode][-1]['total_ms']:.2f} ms per step", flush=True)
    median = {mode: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for mode, rs in rows.items()}
    ratio = statistics.median(f["total_ms"] / t["total_ms"] for f, t in zip(rows["full"], rows["target"]))
    drafter = engines["full"].runner.drafter
    fmt = engines["target"].runner.target.weight_format
    print(f"\nC = {args.concurrency}, {fmt}, gamma {drafter.gamma}; medians of {args.repeats} repeats, ms")
    print("| arm | wall / step | profiled / step | GEMM | rest | draft | draft GEMM |")
    print("|---|---|---|---|---|---|---|")
    for mode, m in median.items():
        print(f"| {mode} | {m['wall_ms']:.2f} | {m['total_ms']:.2f} | {m['gemm_ms']:.2f} | {m['rest_ms']:.2f} | "
              f"{m.get('draft_ms', 0):.2f} | {m.get('draft_gemm_ms', 0):.2f} |")
    print(f"drafted / plain step (profiled, median of per-repeat ratios): {ratio:.3f}")
    with open(args.out, "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "concurrency": args.concurrency,
                   "weight_format": fmt, "gamma": drafter.gamma, "steps": args.steps, "rows": rows,
                   "median": median, "full_over_target": ratio}, f, indent=2)
        f.write("\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
