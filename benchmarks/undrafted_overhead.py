"""What a scheduled engine that drafts nothing pays beside a target-only engine, part by part.

Every decode step of a scheduled engine captures the drafter's context features, stages them, and
feeds the policy (its table, guard and learner) even when the planner budgets no draft; a target-only
engine does none of it. Here both engines decode the same held-out prompts greedily, the scheduled
one undrafted on every step (its policy's `plan` runs and is timed, and its verdict, a draft or a
probe, is dropped), arms alternating over the repeats, and each engine step's parts are timed by
wrapping the engine's own methods: the planner (`plan`), the target forward (`verify_forward`), staging (`runner.commit`), the policy's feedback (`policy.on_step`), the step's
bookkeeping (`record`, which includes `on_step`), the step's commit (`postprocess`, which includes
staging). Reported per R: the median ms per step of
each part per arm, the scheduled-minus-target difference, and the wall time ratio (medians over repeats).

    python benchmarks/undrafted_overhead.py [--requests 1,16] [--max-tokens 192] [--repeats 5]
"""

from __future__ import annotations

import argparse
import collections
import os
import platform
import statistics
import time

import torch
from common import add_common_args, heldout_prompts, load_pair, time_calls, write_result

PARTS = (("verify_forward", "runner"), ("commit", "runner"), ("on_step", "policy"), ("record", None),
         ("postprocess", None))
REPORTED = (*(name for name, _ in PARTS), "plan")


def timed_engine(target, tokenizer, drafter, arm: str, r: int) -> tuple:
    """An engine of `arm` (target / scheduled-undrafted) with its parts wrapped; (engine, seconds by part)."""
    from sglang_dspark.engine.engine import Engine, EngineConfig
    from sglang_dspark.engine.policy import NO_DRAFT

    mode = "target" if arm == "target" else "scheduled"
    engine = Engine(target, tokenizer, drafter if mode != "target" else None,
                    config=EngineConfig(mode=mode, max_running=r, max_len=1024))
    spent = collections.defaultdict(float)
    if mode != "target":  # the real plan runs and is timed (its bookkeeping is a cost); its verdict is dropped
        time_calls(spent, [(engine.policy, "plan", "plan")])
        plan = engine.policy.plan
        engine.policy.plan = lambda request_ids: (plan(request_ids), NO_DRAFT)[1]
    time_calls(spent, [(engine if owner is None else getattr(engine, owner), name, name) for name, owner in PARTS
                       if not (mode == "target" and owner == "policy")])
    return engine, spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser, "undrafted_overhead")
    parser.set_defaults(dtype="int4")
    parser.add_argument("--requests", default="1,16", help="request counts R, comma-separated (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=192, help="greedy tokens per request (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=5, help="runs per arm and R, arms alternating (default: %(default)s)")
    args = parser.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    torch.set_num_threads(args.threads)
    from sglang_dspark.engine.sampling import SamplingParams

    target, tokenizer, drafter = load_pair(args.model, args.draft, args.dtype)
    rows = []
    for r in [int(x) for x in args.requests.split(",")]:
        prompts = heldout_prompts(tokenizer, r)
        params = [SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)] * r
        per = {arm: collections.defaultdict(list) for arm in ("target", "undrafted")}
        ratios = []
        for rep in range(args.repeats):
            walls = {}
            for arm in (("target", "undrafted") if rep % 2 == 0 else ("undrafted", "target")):
                engine, spent = timed_engine(target, tokenizer, drafter, arm, r)
                t0 = time.perf_counter()
                engine.generate(prompts, params)
                walls[arm] = time.perf_counter() - t0
                steps = sum(1 for rec in engine.records)
                for name in REPORTED:
                    per[arm][name].append(1e3 * spent[name] / steps)
                per[arm]["wall_s"].append(walls[arm])
            ratios.append(walls["undrafted"] / walls["target"])
        med = {arm: {k: round(statistics.median(v), 4) for k, v in parts.items()} for arm, parts in per.items()}
        rows.append({"requests": r, "ms_per_step": med, "wall_ratio_per_repeat": [round(x, 4) for x in ratios],
                     "wall_ratio": round(statistics.median(ratios), 4)})
        print(f"\nR = {r} ({args.max_tokens} tokens a request, {args.repeats} repeats; ms per step, medians)")
        print("| part | target-only | scheduled, drafting nothing | difference |\n|---|---|---|---|")
        for name in REPORTED:
            a, b = med["target"].get(name, 0.0), med["undrafted"].get(name, 0.0)
            print(f"| {name} | {a:.3f} | {b:.3f} | {b - a:+.3f} |")
        print(f"wall time, scheduled / target-only: {rows[-1]['wall_ratio']:.3f} (per repeat {rows[-1]['wall_ratio_per_repeat']})")
    write_result(args.out, {"benchmark": "undrafted_overhead", "host": platform.processor() or platform.machine(),
                            "weight_format": target.weight_format, "max_tokens": args.max_tokens,
                            "repeats": args.repeats, "rows": rows})


if __name__ == "__main__":
    main()
