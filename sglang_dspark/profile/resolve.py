"""`launch --profile FILE`: load one SLA profile and check it belongs to this deployment.

The profile's fingerprint (engine, hardware, library versions, content hashes of the target and
drafter, gamma) must match what is about to be launched; a mismatch is refused with one line
listing every difference, unless forced (then it is only logged).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sglang_dspark.profile.fingerprint import check, require_match
from sglang_dspark.profile.schema import ProfileError, SlaProfile, SlaTier


@dataclass(frozen=True)
class LaunchProfile:
    path: str
    profile: SlaProfile
    tier: SlaTier | None = None
    mismatches: list[str] = field(default_factory=list)  # non-empty only when forced

    def describe(self) -> str:
        tier = f" tier={self.tier.name} ({self.tier.tok_s_per_user} tok/s/user)" if self.tier else ""
        forced = f" FORCED despite: {'; '.join(self.mismatches)}" if self.mismatches else ""
        return f"{self.path} ({self.profile.name}){tier}{forced}"


def resolve_profile(path: str, *, engine: str, model: str, draft: str | None, force: bool = False,
                    tier: str | None = None, tp: int = 1, dp: int = 1) -> LaunchProfile:
    """Load `path`, check its fingerprint against `engine` / `model` / `draft` and this machine, and
    pick `tier`. ProfileError (one line) on any problem; with `force` a fingerprint mismatch is a
    logged warning instead."""
    profile = SlaProfile.load(path)
    try:
        chosen = profile.tier(tier) if tier is not None else None
    except ProfileError as exc:
        raise ProfileError(f"{path}: --sla-tier {tier}: {exc}") from None
    lines = check(profile, engine=engine, target_dir=model, draft_dir=draft, tp=tp, dp=dp)
    require_match(path, lines, force=force, hint=" this launch (--force-profile to use it anyway)")
    return LaunchProfile(str(path), profile, chosen, lines)
