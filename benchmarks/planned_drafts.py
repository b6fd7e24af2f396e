"""What the default launch's drafted steps delivered against what the planner was promised: for every
drafted request-step, how old the confidence row behind its capacity was, how many drafts it verified
and how many survived, against what that row promised as stored and as the planner read it
(corrected by core/lag_calibration.py, unless `--no-lag-calibration`).

The asynchronous planner (core/schedule.py `AsyncPlanner`) sizes a step from each request's
confidences `lag` observations back, and from the running mean of every row observed so far for a
request without that history (`prior="observed"`). This runs the default engine (scheduled, the
profile `launch` picks here, online table) persistently over `--repeats` passes of the 2*C held-out
chat prompts, as `decode_speed.py --persistent` does, and groups its planned request-steps by the age
of that row: prior (none), lag (a chain of drafted steps), older.

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

from sglang_dspark.core.lag_calibration import GROUPS, LagCalibration


def instrument(engine) -> list[dict]:
    """Per drafted request-step that verified a draft: the age group of the lagged row behind its
    capacity (core/lag_calibration.py's groups), whether the step was a probe, verified and accepted
    drafts, and the survival promised by the lagged row as stored, as the planner read it (corrected
    when lag calibration is on) and by this step's own confidences."""
    planner, record, events = engine.policy.planner, engine.record, []
    grouping = LagCalibration(planner.gamma, planner.lag)

    def group(rid) -> str:
        at = planner._observed_at.get(rid)
        return GROUPS[grouping.group(planner.clock - at[0] if at is not None and len(at) == planner.lag else None)]

    def recorded(result):
        d = result.decode
        if d is not None and d.drafts is not None:  # before record(): the rows the capacity read
            ids = [r.id for r in d.requests]
            stored, read = planner._lagged_conf(ids).double().cumprod(1), planner._survival(ids)
            for i, rid in enumerate(ids):
                n = int(d.lens[i])
                if n:
                    events.append({
                        "group": group(rid), "probe": d.plan.probe, "verified": n, "accepted": int(d.num_accepted[i]),
                        "promised_stored": float(stored[i, :n].sum()), "promised_read": float(read[i, :n].sum()),
                        "promised_now": float(d.conf[i, :n].double().cumprod(0).sum())})
        return record(result)

    engine.record = recorded
    return events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser, "planned_drafts")
    parser.set_defaults(dtype="int4", profile=os.path.join(os.path.dirname(__file__), "..", "sla_profiles",
                                                           "smollm2-135m-instruct-cpu-amd-epyc-int4.yaml"))
    parser.add_argument("--concurrency", type=int, default=1, help="requests running at once")
    parser.add_argument("--repeats", type=int, default=12, help="passes over the prompts, one persistent engine")
    parser.add_argument("--max-tokens", type=int, default=96, help="completion tokens per request")
    parser.add_argument("--no-lag-calibration", action="store_true",
                        help="read the lagged confidences uncorrected (the planner before core/lag_calibration.py)")
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
    if args.no_lag_calibration:
        engine.policy.planner.calibration = None
    planner, events = engine.policy.planner, instrument(engine)
    prompts = heldout_prompts(pair[1], 2 * args.concurrency)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, seed=None)
    for _ in range(args.repeats):
        run_mode(engine, prompts, params)
    groups: dict[str, list[dict]] = collections.defaultdict(list)
    for e in events:
        groups[e["group"]].append(e)
    groups["all"], groups["planned (no probe)"] = events, [e for e in events if not e["probe"]]
    rows, keys = [], ("verified", "accepted", "promised_stored", "promised_read", "promised_now")
    print(f"{engine.policy.steps} steps, {engine.policy.probes} probes, {len(events)} drafted request-steps; "
          f"lag calibration {'off' if planner.calibration is None else 'on'}")
    print(f"{'lagged row':<20} {'steps':>6} {'verified':>9} {'accepted':>9} {'promised (stored)':>18} "
          f"{'promised (read)':>16} {'read / accepted':>16} {'promised (now)':>15}")
    for name in (*GROUPS, "all", "planned (no probe)"):
        g = groups.get(name, [])
        if not g:
            continue
        mean = {k: sum(e[k] for e in g) / len(g) for k in keys}
        ratio = mean["promised_read"] / mean["accepted"] if mean["accepted"] else None
        rows.append({"lagged_row": name, "steps": len(g), **{k: round(v, 3) for k, v in mean.items()},
                     "read_over_accepted": None if ratio is None else round(ratio, 3)})
        print(f"{name:<20} {len(g):>6} {mean['verified']:>9.2f} {mean['accepted']:>9.3f} {mean['promised_stored']:>18.3f} "
              f"{mean['promised_read']:>16.3f} {'-' if ratio is None else f'{ratio:.3f}':>16} {mean['promised_now']:>15.3f}")
    if planner.calibration is not None:
        print("lag calibration (survived = a + b x over reached drafts): " + "; ".join(
            f"{g}: a {v['a']}, b {v['b']} ({v['reached']} drafts, mean x {v['mean_conf']}, survived {v['survived']})"
            for g, v in planner.calibration.summary().items()))
    prior = (engine.policy.planner._prior_sum / max(1, engine.policy.planner.rows_observed)).tolist()
    print("prior row (mean conditional survival per position): " + " ".join(f"{c:.3f}" for c in prior))
    write_result(args.out, {"benchmark": "planned_drafts", "model": args.model, "weight_format": pair[0].weight_format,
                            "profile": args.profile, "concurrency": args.concurrency, "repeats": args.repeats,
                            "steps": engine.policy.steps, "probes": engine.policy.probes, "rows": rows,
                            "lag_calibration": None if planner.calibration is None else planner.calibration.summary(),
                            "prior_row": [round(c, 4) for c in prior]})


if __name__ == "__main__":
    main()
