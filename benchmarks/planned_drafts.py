"""What the default launch's planned drafts delivered: for every step the planner chose to draft (not a
probe), how old the confidence row behind its capacity was, how many drafts it verified and how many
survived, against what the confidences promised.

The asynchronous planner (core/schedule.py `AsyncPlanner`) sizes a step from each request's
confidences `lag` observations back, and from the running mean of every row observed so far for a
request without that history (`prior="observed"`). This runs the default engine (scheduled, the
profile `launch` picks here, online table) persistently over `--repeats` passes of the 2*C held-out
chat prompts, as `decode_speed.py --persistent` does, and groups its planned request-steps by the age
of that row: none (the prior), 2 steps (a chain of drafted steps), older.

    python benchmarks/planned_drafts.py [--concurrency 1] [--repeats 12] [--dtype int4]
        [--profile sla_profiles/smollm2-135m-instruct-cpu-amd-epyc-int4.yaml]

Prints a table and writes benchmarks/results/planned_drafts.json.
"""

from __future__ import annotations

import argparse
import collections
import os

import torch

from common import add_common_args, heldout_prompts, load_pair, write_result
from decode_speed import engine_for, run_mode


def instrument(engine) -> list[dict]:
    """Per planned request-step: the lagged row's age in steps (None: no history), verified drafts,
    accepted drafts, and the survival the lagged row and this step's own confidences promised."""
    policy, planner = engine.policy, engine.policy.planner
    seen: dict[str, collections.deque] = collections.defaultdict(collections.deque)
    observe, record, events = policy.observe, engine.record, []

    def observed(request_ids, conf):
        for rid in request_ids:
            seen[rid].append(policy.steps)
            while len(seen[rid]) > planner.lag:
                seen[rid].popleft()
        return observe(request_ids, conf)

    def recorded(result):
        d = result.decode
        if d is not None and d.drafts is not None and not d.plan.probe:
            lagged = planner._lagged_conf([r.id for r in d.requests]).double()  # what capacity() read
            for i, req in enumerate(d.requests):
                hist, n = seen.get(req.id), int(d.lens[i])
                events.append({
                    "age": policy.steps - hist[0] if hist and len(hist) == planner.lag else None,
                    "verified": n, "accepted": int(d.num_accepted[i]),
                    "promised_lagged": float(lagged[i, :n].cumprod(0).sum()) if n else 0.0,
                    "promised_now": float(d.conf[i, :n].double().cumprod(0).sum()) if n else 0.0})
        return record(result)

    policy.observe, engine.record = observed, recorded
    return events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser, "planned_drafts")
    parser.set_defaults(dtype="int4", profile=os.path.join(os.path.dirname(__file__), "..", "sla_profiles",
                                                           "smollm2-135m-instruct-cpu-amd-epyc-int4.yaml"))
    parser.add_argument("--concurrency", type=int, default=1, help="requests running at once")
    parser.add_argument("--repeats", type=int, default=12, help="passes over the prompts, one persistent engine")
    parser.add_argument("--max-tokens", type=int, default=96, help="completion tokens per request")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    from sglang_dspark import zoo
    from sglang_dspark.engine.sampling import SamplingParams
    from sglang_dspark.profile.resolve import resolve_profile

    pair = load_pair(args.model, args.draft, args.dtype)
    resolved = resolve_profile(args.profile, engine="reference", model=zoo.resolve_model(args.model), draft=args.draft,
                               seed_ok=True, weight_format=pair[0].weight_format)
    engine = engine_for("default", pair, {"default": resolved}, args.concurrency, args.model)
    events = instrument(engine)
    prompts = heldout_prompts(pair[1], 2 * args.concurrency)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, seed=None)
    for _ in range(args.repeats):
        run_mode(engine, prompts, params)
    groups: dict[str, list[dict]] = collections.defaultdict(list)
    for e in events:
        groups["none (prior)" if e["age"] is None else "2 steps" if e["age"] == 2 else "> 2 steps"].append(e)
    rows = []
    print(f"{engine.policy.steps} steps, {engine.policy.probes} probes, {len(events)} planned request-steps")
    print(f"{'lagged row':<14} {'steps':>6} {'verified':>9} {'accepted':>9} {'promised (lagged)':>18} {'promised (now)':>15}")
    for name in ("none (prior)", "2 steps", "> 2 steps", "all"):
        g = events if name == "all" else groups.get(name, [])
        if not g:
            continue
        mean = {k: sum(e[k] for e in g) / len(g) for k in ("verified", "accepted", "promised_lagged", "promised_now")}
        rows.append({"lagged_row": name, "steps": len(g), **{k: round(v, 3) for k, v in mean.items()}})
        print(f"{name:<14} {len(g):>6} {mean['verified']:>9.2f} {mean['accepted']:>9.3f} "
              f"{mean['promised_lagged']:>18.3f} {mean['promised_now']:>15.3f}")
    prior = (engine.policy.planner._prior_sum / max(1, engine.policy.planner.rows_observed)).tolist()
    print("prior row (mean conditional survival per position): " + " ".join(f"{c:.3f}" for c in prior))
    write_result(args.out, {"benchmark": "planned_drafts", "model": args.model, "weight_format": pair[0].weight_format,
                            "profile": args.profile, "concurrency": args.concurrency, "repeats": args.repeats,
                            "steps": engine.policy.steps, "probes": engine.policy.probes, "rows": rows,
                            "prior_row": [round(c, 4) for c in prior]})


if __name__ == "__main__":
    main()
