"""Where a decode step's time goes, part by part, in the arms decode_speed.py compares.

Each arm's engine (target-only, verify-all, the scheduled default on the profile `launch` picks here)
serves the 2*C held-out chat prompts greedily at concurrency C, persistently, arms interleaved over
the repeats; the engine's own methods are wrapped to time their calls. Parts, in ms per decode step:
the planner (`plan`, its `capacity` inside), the draft, the allocation of the capacity, the target's
forward, the verification (`verify_step`), the policy's feedback (`observe` of a drafted step's
outcome, `on_step`), the step's bookkeeping (`record`, which holds both) and commit (`postprocess`),
the prompts' prefill forwards (per decode step, as the rest), and the whole step. `host` is the step
less its forwards and draft: the Python and small ops around them, which run right after the forward
has swept the caches, where each call costs several times what it does in a warm loop.

    python benchmarks/step_parts.py [--concurrency 1,16] [--arms target,full,default] [--repeats 5]
        [--draft DIR] [--profile PROFILE.yaml] [--dtype int4]

Prints a table per concurrency and writes benchmarks/results/step_parts.json.
"""

from __future__ import annotations

import argparse
import collections
import os
import platform
import statistics

import torch
from common import add_common_args, balanced_order, heldout_prompts, load_pair, time_calls, write_result
from decode_speed import engine_for, run_mode

PARTS = ("plan", "capacity", "draft", "allocate", "verify_forward", "verify_step", "observe", "on_step", "record",
         "postprocess", "prefill", "step", "host")


def timed_engine(arm: str, pair, launch_profiles: dict, concurrency: int, model: str):
    """(engine of `arm`, seconds by part) with its methods wrapped (verify_step apart: see main)."""
    engine = engine_for(arm, pair, launch_profiles, concurrency, model)
    spent = collections.defaultdict(float)
    policy = engine.policy
    methods = [(engine.runner, "draft", "draft"), (engine.runner, "prefill", "prefill"), (engine.runner, "verify_forward", "verify_forward"),
               (engine, "record", "record"), (engine, "postprocess", "postprocess"), (engine, "step", "step"),
               (policy, "plan", "plan"), (policy, "allocate", "allocate"), (policy, "observe", "observe"),
               (policy, "on_step", "on_step")]
    if policy.planner is not None:
        methods.append((policy.planner, "capacity", "capacity"))
    time_calls(spent, methods)
    return engine, spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser, "step_parts")
    parser.set_defaults(dtype="int4")
    parser.add_argument("--concurrency", default="1,16", help="concurrency levels C, comma-separated (default: %(default)s)")
    parser.add_argument("--arms", default="target,full,default",
                        help="arms of decode_speed.py to time (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=192, help="greedy tokens per request (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=5, help="runs per arm and C, arms interleaved (default: %(default)s)")
    args = parser.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    torch.set_num_threads(args.threads)
    from sglang_dspark import zoo
    from sglang_dspark.engine.sampling import SamplingParams
    from sglang_dspark.profile.resolve import resolve_profile

    import sglang_dspark.engine.engine as engine_module

    pair = load_pair(args.model, args.draft, args.dtype)
    # verify_step is a module function every engine calls by its global name: wrapped once, its
    # seconds moved into the arm that ran after each run
    verify_spent = collections.defaultdict(float)
    time_calls(verify_spent, [(engine_module, "verify_step", "verify_step")])
    launch_profile = resolve_profile(args.profile, engine="reference", model=zoo.resolve_model(args.model),
                                     draft=args.draft, seed_ok=True, weight_format=pair[0].weight_format)
    arms = [a for a in args.arms.split(",") if a]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, seed=None)
    rows = []
    for concurrency in [int(c) for c in args.concurrency.split(",")]:
        prompts = heldout_prompts(pair[1], 2 * concurrency)
        engines = {arm: timed_engine(arm, pair, {"default": launch_profile}, concurrency, args.model) for arm in arms}
        per = {arm: collections.defaultdict(list) for arm in arms}
        for arm in arms:  # one untimed run each: the engines' first steps build their pools and tables
            run_mode(engines[arm][0], prompts, params)
        for rep in range(args.repeats):
            for arm in balanced_order(arms, rep):
                engine, spent = engines[arm]
                spent.clear()
                verify_spent.clear()
                run = run_mode(engine, prompts, params)
                spent["verify_step"] = verify_spent["verify_step"]
                steps = run["steps"]
                spent["host"] = spent["step"] - spent["verify_forward"] - spent["draft"] - spent["prefill"]
                for part in PARTS:
                    per[arm][part].append(1e3 * spent.get(part, 0.0) / steps)
                per[arm]["output_tok_s"].append(run["output_tok_s"])
                per[arm]["drafted_share"].append(run["drafted_steps"] / steps)
        med = {arm: {k: round(statistics.median(v), 4) for k, v in parts.items()} for arm, parts in per.items()}
        rows.append({"concurrency": concurrency, "ms_per_step": med,
                     "runs": {arm: {k: [round(x, 4) for x in v] for k, v in parts.items()} for arm, parts in per.items()}})
        print(f"\nC = {concurrency} ({args.max_tokens} tokens a request, {args.repeats} repeats; ms per decode step, medians)")
        print("| part | " + " | ".join(arms) + " |\n|---|" + "---|" * len(arms))
        for part in (*PARTS, "output_tok_s", "drafted_share"):
            print(f"| {part} | " + " | ".join(f"{med[arm].get(part, 0.0):.3f}" for arm in arms) + " |")
    write_result(args.out, {"benchmark": "step_parts", "host": platform.processor() or platform.machine(),
                            "model": args.model, "draft": args.draft, "profile": args.profile,
                            "weight_format": pair[0].weight_format, "max_tokens": args.max_tokens,
                            "repeats": args.repeats, "arms": arms, "rows": rows})


if __name__ == "__main__":
    main()
