"""SLA tiers for load tests: from `--tier NAME:TOK_S` or from an SLA profile's `sla_tiers`, and the gate.

Only the profile's top-level `sla_tiers` list is read (plain YAML), so any profile version with
that key works: `[{name, tok_s_per_user, ttft_s, max_concurrency}, ...]`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import yaml


@dataclass(frozen=True)
class Tier:
    name: str
    tok_s_per_user: float
    ttft_s: float | None = None
    max_concurrency: int | None = None  # steps above it are not gated: the tier promises nothing there

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


def parse_tier(spec: str) -> Tier:
    name, _, tok_s = spec.partition(":")
    try:
        value = float(tok_s)
    except ValueError:
        value = -1.0
    if not name or not value > 0:
        raise ValueError(f"--tier {spec!r}: expected NAME:TOK_S with TOK_S > 0 (tokens per second per user)")
    return Tier(name, value)


def profile_tiers(path: str | Path) -> list[Tier]:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text file (expected an SLA profile YAML)") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
    rows = data.get("sla_tiers") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise ValueError(f"{path}: sla_tiers: missing (expected a list of {{name, tok_s_per_user, ...}})")
    try:
        return [Tier(str(r["name"]), float(r["tok_s_per_user"]), r.get("ttft_s"), r.get("max_concurrency"))
                for r in rows]
    except (KeyError, TypeError, ValueError, AttributeError):
        raise ValueError(f"{path}: sla_tiers: every entry needs a name and a number tok_s_per_user") from None


def gate_failures(steps: list[dict], tier: Tier, share: float) -> list[str]:
    """One reason per gated step whose attainment of `tier` is below `share` (steps within the
    tier's max_concurrency; all steps when it has none)."""
    reasons = []
    for step in steps:
        if tier.max_concurrency is not None and step["users"] > tier.max_concurrency:
            continue
        got = step["attainment"][tier.name]
        if got is None or got < share:
            shown = "no requests" if got is None else f"{got:.1%} of requests"
            reasons.append(f"concurrency {step['users']}: tier {tier.name} ({tier.tok_s_per_user:g} tok/s/user) "
                           f"attained by {shown}, below {share:.0%}")
    return reasons
