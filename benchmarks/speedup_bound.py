"""Upper bound on DSpark's single-request speedup on this machine, from measured numbers only.

At concurrency 1 a DSpark step verifying k drafts emits 1 + a_1 + ... + a_k tokens in expectation
(a_j: the probability that the first j drafts are accepted) and costs the profiled step time with
the drafter, T(1 + k); target-only decoding emits 1 token per undrafted step T0. So

    speedup(k) = (1 + a_1 + ... + a_k) * T0 / T(1 + k),

and the best any scheduler can do is max over k (k = 0: the drafter skipped, speedup 1). A second
column prices the same steps without the drafter's cost (the profile's undrafted price of 1 + k
tokens): what a free drafter would reach, so the shortfall splits into drafting cost and verify
width. Rows:
the acceptance rates the drafter evaluation measured per domain, and a perfect drafter
(a_j = 1) as the ceiling this hardware allows; plus the acceptance every draft would need for 2x.

    python benchmarks/speedup_bound.py [--profile sla_profiles/smollm2-135m-instruct-cpu.yaml]
        [--eval benchmarks/results/drafter_eval_dspark.json] [--temperature 0]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from sglang_dspark.profile.schema import SlaProfile

ROOT = Path(__file__).resolve().parents[1]
GOALS = (1.3, 1.5, 2.0)  # speedups at concurrency 1 whose required acceptance is reported


def best_speedup(accept: list[float], step_s: np.ndarray, t0: float) -> tuple[float, int]:
    tokens = 1.0 + np.concatenate([[0.0], np.cumsum(accept)])
    speed = tokens[: step_s.size] * t0 / step_s[: tokens.size]
    speed[0] = 1.0  # k = 0 is target-only decoding
    k = int(np.argmax(speed))
    return float(speed[k]), k


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default=str(ROOT / "sla_profiles/smollm2-135m-instruct-cpu.yaml"), help="SLA profile")
    parser.add_argument("--eval", default=str(ROOT / "benchmarks/results/drafter_eval_dspark.json"),
                        help="drafter evaluation JSON (per-position acceptance per domain)")
    parser.add_argument("--temperature", default="0", help="which temperature's acceptance rates to use")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/speedup_bound.json"), help="JSON output path")
    args = parser.parse_args()
    profile = SlaProfile.load(args.profile)
    table = profile.sps_table()
    gamma = profile.fingerprint.gamma
    t0 = 1.0 / table(1, num_requests=1, drafted=False)
    step_s = 1.0 / np.array([table(1 + k, num_requests=1, drafted=k > 0) for k in range(gamma + 1)])
    verify_only_s = 1.0 / np.array([table(1 + k, num_requests=1, drafted=False) for k in range(gamma + 1)])
    domains = json.loads(Path(args.eval).read_text())["by_temperature"][args.temperature]["domains"]
    rows = {d: v["accept_rate_per_position"] for d, v in domains.items()}
    rows["perfect drafter"] = [1.0] * gamma
    # the constant per-draft acceptance a (a_j = a^j) at which the best k reaches each goal
    grid = np.linspace(0, 1, 1001)
    def needed(steps):
        return {goal: next((float(a) for a in grid
                            if best_speedup([a ** j for j in range(1, gamma + 1)], steps, t0)[0] >= goal), None)
                for goal in GOALS}

    need, need_free = needed(step_s), needed(verify_only_s)
    print(f"T0 (undrafted step, R=1) = {1e3 * t0:.1f} ms; drafted step T(1+k) ms: "
          + " ".join(f"{1e3 * s:.1f}" for s in step_s[1:]))
    print("verify-only step (drafter free) ms: " + " ".join(f"{1e3 * s:.1f}" for s in verify_only_s[1:]))
    print(f"{'acceptance':<16} {'a_1':>6} {'best k':>7} {'max speedup':>12} {'drafter free':>13}")
    result_rows = []
    for name, accept in rows.items():
        speed, k = best_speedup(accept, step_s, t0)
        free, free_k = best_speedup(accept, verify_only_s, t0)
        result_rows.append({"acceptance": name, "accept_rate_per_position": accept, "best_k": k, "max_speedup": round(speed, 3),
                            "max_speedup_drafter_free": round(free, 3), "best_k_drafter_free": free_k})
        print(f"{name:<16} {accept[0]:>6.2f} {k:>7} {speed:>12.2f} {free:>13.2f}")
    for goal, a in need.items():
        print(f"per-draft acceptance needed for {goal:g}x at concurrency 1: "
              + (f"a = {a:.3f} (a_j = a^j)" if a is not None else "unreachable even with a = 1")
              + (f"; with a free drafter a = {need_free[goal]:.3f}" if need_free[goal] is not None else ""))
    out = {"benchmark": "speedup_bound", "profile": args.profile, "eval": args.eval, "temperature": args.temperature,
           "undrafted_step_ms": round(1e3 * t0, 2), "drafted_step_ms": [round(1e3 * s, 2) for s in step_s[1:]],
           "verify_only_step_ms": [round(1e3 * s, 2) for s in verify_only_s[1:]],
           "rows": result_rows, "per_draft_acceptance_for_2x": need[2.0],
           "per_draft_acceptance_needed": {f"{g:g}x": a for g, a in need.items()},
           "per_draft_acceptance_needed_drafter_free": {f"{g:g}x": a for g, a in need_free.items()}}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
