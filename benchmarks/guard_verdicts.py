"""How often the drafting guard stops a drafter that wins, and how soon it stops one that loses: the
guard's rule against the point estimate it replaced, on simulated noisy steps at C = 1.

Each simulated run judges up to `--steps` planned drafted steps: 7 drafts, each accepted with
probability `accept` until the first rejection, a step time of `cost` undrafted steps with 10 %
log-normal noise (sglang_dspark/testing/guard_sim.py, which tests/test_guard.py judges the guard by). Reported per case: the share of `--seeds`
runs stopped, and the median judged step of the stop.

    python benchmarks/guard_verdicts.py [--seeds 400] [--steps 150]

Writes benchmarks/results/guard_verdicts.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from common import ROOT

from sglang_dspark.testing.guard_sim import first_block  # the simulation the tests judge the guard by

CASES = [(1.3, 0.3), (1.2, 0.3), (2.0, 0.0), (1.25, 0.0), (1.68, 0.3)]  # (cost, accept)


class PointEstimateGuard:
    """The rule before 2026-12-02: stop once the decayed tokens of at least `min_steps` judged steps
    fall `margin` short of the undrafted rate's."""

    def __init__(self, margin: float = 0.02, min_steps: int = 4, decay: float = 0.95):
        self.margin, self.min_steps, self.decay = margin, min_steps, decay
        self.tokens = self.baseline = 0.0
        self.steps = self.blocks = 0

    def observe(self, num_requests, tokens, seconds, undrafted_seconds, planned_draft):
        self.tokens = self.decay * self.tokens + tokens
        self.baseline = self.decay * self.baseline + seconds * num_requests / undrafted_seconds
        self.steps += 1
        if self.steps >= self.min_steps and self.tokens < (1 - self.margin) * self.baseline:
            self.blocks += 1


def verdicts(cost: float, accept: float, seeds: int, steps: int, old: bool) -> dict:
    at = [first_block(seed, cost, accept, steps=steps, guard=PointEstimateGuard() if old else None)
          for seed in range(seeds)]
    hits = [s for s in at if s is not None]
    return {"stopped_share": round(len(hits) / seeds, 4), "median_stop_step": statistics.median(hits) if hits else None}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=400, help="simulated runs per case")
    p.add_argument("--steps", type=int, default=150, help="judged steps per run")
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/guard_verdicts.json"), help="JSON output")
    args = p.parse_args()
    rows = []
    print(f"{'cost':>5} {'accept':>6} {'gain':>5} {'old: stopped':>13} {'at step':>8} {'new: stopped':>13} {'at step':>8}")
    for cost, accept in CASES:
        gain = 1 / (1 - accept) / cost  # 1 + a + a^2 + ... tokens per step (7 drafts: to 3 digits)
        old = verdicts(cost, accept, args.seeds, args.steps, True)
        new = verdicts(cost, accept, args.seeds, args.steps, False)
        rows.append({"cost": cost, "accept": accept, "gain": round(gain, 3), "point_estimate": old, "guard": new})
        print(f"{cost:>5} {accept:>6} {gain:>5.2f} {old['stopped_share']:>13.3f} {old['median_stop_step'] or '-':>8} "
              f"{new['stopped_share']:>13.3f} {new['median_stop_step'] or '-':>8}")
    with open(args.out, "w") as f:
        json.dump({"benchmark": "guard_verdicts", "seeds": args.seeds, "steps": args.steps, "rows": rows}, f, indent=2)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
