"""How many replicas a traffic level needs at an SLA tier, from a profile's SPS table.

    python ops/capacity.py --profile sla_profiles/smollm2-135m-instruct-cpu.yaml --tier interactive \
        --rate 0.5 --output-tokens 256 --tau 1.3

For each concurrency R up to the profile's largest measured batch, the predicted per-user speed is
    (1 + a + a^2 + ... + a^d) / step_seconds(R requests, R * d drafts)
with d drafts verified per request (scheduled: the best d; full: gamma; target: 0) and a the
per-position acceptance that gives the drafter's measured mean accepted length --tau when all gamma
drafts are verified. Target-only (d = 0) is priced from what the profile measured without the
drafter when it did (the reference engine skips the drafter on budget-0 steps and its profile carries
that saving, `sps.draft_skip_seconds`); an SGLang profile has no such step (SGLang always drafts), so
there target-only is priced as a DSpark step verifying no draft, drafter included: a lower bound on a
target-only replica's speed, said in the output. A replica serves the tier at the largest aggregate speed among the R whose
per-user speed meets it (and within the tier's max_concurrency); the demand is rate x output tokens
per second; replicas = ceil(demand / (replica speed x utilization)). Decode only: prefill and time
to first token are not modelled, so load-test the answer (ops/runbooks/capacity.md).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from sglang_dspark.help_format import DefaultsHelpFormatter

MODES = ("scheduled", "full", "target")


@dataclass(frozen=True)
class Point:
    concurrency: int
    drafts: int  # verified per request per step
    step_seconds: float
    user_tok_s: float

    @property
    def replica_tok_s(self) -> float:
        return self.concurrency * self.user_tok_s


def acceptance_for_tau(tau: float, gamma: int) -> float:
    """Per-position acceptance a with 1 + a + ... + a^gamma = tau (bisection; the sum grows with a)."""
    if not 1.0 <= tau <= gamma + 1:
        raise ValueError(f"--tau must be within [1, gamma + 1] = [1, {gamma + 1}], got {tau}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(mid ** j for j in range(gamma + 1)) < tau else (lo, mid)
    return lo


def target_only_basis(profile) -> tuple[bool, str]:
    """(measured, what the target-only price rests on): measured when the profile holds steps that
    skipped the drafter (the reference engine's budget-0 probes, fitted as sps.draft_skip_seconds)."""
    if profile.sps.draft_skip_seconds is not None:
        return True, ("target-only steps are priced from the profile's measured steps without the drafter (budget 0, "
                      "sps.draft_skip_seconds): what a --mode target replica of this engine runs")
    why = ("SGLang always drafts" if profile.fingerprint.engine == "sglang"
           else "it has no sps.draft_skip_seconds")
    return False, ("approximation: this profile measured no step without the drafter (" + why + "), so "
                   "target-only is priced as a DSpark step verifying no draft, drafter included: a lower bound on "
                   "a --mode target replica's speed; load-test one (ops/runbooks/rollout.md step 0) for the real "
                   "number")


def speed_at(table, concurrency: int, gamma: int, acceptance: float, mode: str) -> Point:
    choices = {"scheduled": range(gamma + 1), "full": [gamma], "target": [0]}[mode]
    seconds = table.step_seconds(concurrency, concurrency * gamma + 1)
    points = [Point(concurrency, d, float(seconds[concurrency * d]),
                    sum(acceptance ** j for j in range(d + 1)) / float(seconds[concurrency * d]))
              for d in choices]
    return max(points, key=lambda p: p.user_tok_s)


def curve(table, max_concurrency: int, gamma: int, acceptance: float, mode: str) -> list[Point]:
    return [speed_at(table, r, gamma, acceptance, mode) for r in range(1, max_concurrency + 1)]


def replicas_needed(demand_tok_s: float, point: Point, utilization: float) -> int:
    return max(1, math.ceil(demand_tok_s / (point.replica_tok_s * utilization)))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python ops/capacity.py", description=__doc__.split("\n")[0],
                                     formatter_class=DefaultsHelpFormatter)
    parser.add_argument("--profile", required=True, type=Path, help="SLA profile YAML (python -m sglang_dspark.profile)")
    parser.add_argument("--tier", required=True, help="a tier of the profile's sla_tiers")
    parser.add_argument("--rate", required=True, type=float, help="requests per second the fleet must serve")
    parser.add_argument("--output-tokens", type=int, default=256, help="mean output tokens per request")
    parser.add_argument("--tau", required=True, type=float,
                        help="the drafter's mean accepted length (bonus token included) with every draft verified, "
                             "from python -m sglang_dspark.evaluate; 1 plans for no accepted draft")
    parser.add_argument("--mode", choices=MODES, default="scheduled", help="the replicas' launch --mode")
    parser.add_argument("--utilization", type=float, default=0.8,
                        help="share of a replica's predicted capacity to plan for (headroom for bursts)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from sglang_dspark.profile.schema import ProfileError, SlaProfile

    try:
        profile = SlaProfile.load(args.profile)
        tier = profile.tier(args.tier)
        if not (args.rate > 0 and args.output_tokens > 0 and 0 < args.utilization <= 1):
            raise ValueError("--rate and --output-tokens must be > 0, --utilization within (0, 1]")
        acceptance = acceptance_for_tau(args.tau, profile.fingerprint.gamma)
    except (ProfileError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    table = profile.sps_table()
    measured = max(m.num_requests for m in profile.sps.measurements) if profile.sps.measurements else tier.max_concurrency
    limit = min(tier.max_concurrency, measured)  # beyond the measured batches the table only extrapolates
    points = curve(table, limit, profile.fingerprint.gamma, acceptance, args.mode)
    print(f"profile {profile.name}, tier {tier.name}: {tier.tok_s_per_user:g} tok/s/user, concurrency <= {limit} "
          f"(tier {tier.max_concurrency}, measured {measured}); mode {args.mode}, tau {args.tau:g} "
          f"(acceptance {acceptance:.3f} per position)")
    if args.mode == "target":
        print(target_only_basis(profile)[1])
    print(f"{'R':>4} {'drafts/req':>10} {'step ms':>8} {'tok/s/user':>10} {'tok/s/replica':>13}  tier")
    for p in points:
        ok = "meets" if p.user_tok_s >= tier.tok_s_per_user else "misses"
        print(f"{p.concurrency:>4} {p.drafts:>10} {p.step_seconds * 1e3:>8.1f} {p.user_tok_s:>10.2f} "
              f"{p.replica_tok_s:>13.2f}  {ok}")
    meeting = [p for p in points if p.user_tok_s >= tier.tok_s_per_user]
    if not meeting:
        print(f"no concurrency meets {tier.tok_s_per_user:g} tok/s/user on this hardware: no number of "
              "replicas serves this tier")
        return 1
    best = max(meeting, key=lambda p: p.replica_tok_s)
    demand = args.rate * args.output_tokens
    n = replicas_needed(demand, best, args.utilization)
    print(f"per replica: concurrency {best.concurrency}, {best.replica_tok_s:.1f} tok/s "
          f"({best.user_tok_s:.1f} tok/s/user)")
    print(f"demand: {args.rate:g} req/s x {args.output_tokens} tokens = {demand:.1f} tok/s; at "
          f"{args.utilization:.0%} utilization: {n} replica(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
